//! The kernel broadcast windows, mapped into the process: the control block
//! of a communicator (`ab_ctl`), its receive window (`ab_rxwin`) and its send
//! window (`ab_txwin`). The XDP program writes chunks and counts into them,
//! the process reads them (and arms operations) with plain memory accesses:
//! no system call per operation or per chunk. Fields both sides write are
//! accessed atomically.

use std::{
    io,
    os::fd::{AsRawFd, BorrowedFd},
    sync::atomic::{AtomicU32, AtomicU64},
};

use crate::{
    maps::{Ctl, RxSlot, TxSlot, CTL_SLOTS, RX_SLOTS, TX_SLOTS},
    Error, Result,
};

/// One `mmap` of an mmapable BPF array.
struct Mapping {
    ptr: *mut u8,
    len: usize,
}

// SAFETY: the mapping is plain shared memory; every access goes through the
// methods of Windows, which use atomics where the kernel writes concurrently.
unsafe impl Send for Mapping {}

impl Mapping {
    fn new(fd: BorrowedFd<'_>, len: usize, what: &str) -> Result<Mapping> {
        // SAFETY: mapping a BPF array map fd shared, read-write, at offset 0,
        // with a length not above the map's size.
        let ptr = unsafe {
            libc::mmap(std::ptr::null_mut(), len, libc::PROT_READ | libc::PROT_WRITE, libc::MAP_SHARED, fd.as_raw_fd(), 0)
        };
        if ptr == libc::MAP_FAILED {
            return Err(Error::system(format!("mapping {what}"), io::Error::last_os_error()));
        }
        Ok(Mapping { ptr: ptr.cast(), len })
    }
}

impl Drop for Mapping {
    fn drop(&mut self) {
        // SAFETY: unmapping exactly what new() mapped.
        unsafe { libc::munmap(self.ptr.cast(), self.len) };
    }
}

/// The element size of an mmapable BPF array: the value size rounded up to 8.
const fn elem(size: usize) -> usize {
    size.div_ceil(8) * 8
}

/// One communicator's windows.
pub struct Windows {
    index: u32,
    ctl: Mapping,
    rx: Mapping,
    tx: Mapping,
}

impl Windows {
    /// Maps the windows of control block `index` from the three maps' fds.
    pub fn map(index: u32, ctl: BorrowedFd<'_>, rx: BorrowedFd<'_>, tx: BorrowedFd<'_>) -> Result<Windows> {
        if index >= CTL_SLOTS {
            return Err(Error::Internal(format!("control block {index} out of range")));
        }
        let windows = Windows {
            index,
            ctl: Mapping::new(ctl, CTL_SLOTS as usize * elem(size_of::<Ctl>()), "ab_ctl")?,
            rx: Mapping::new(rx, (CTL_SLOTS * RX_SLOTS) as usize * elem(size_of::<RxSlot>()), "ab_rxwin")?,
            tx: Mapping::new(tx, (CTL_SLOTS * TX_SLOTS) as usize * elem(size_of::<TxSlot>()), "ab_txwin")?,
        };
        Ok(windows)
    }

    /// The control block index.
    pub fn index(&self) -> u32 {
        self.index
    }

    /// The control block.
    pub fn ctl(&self) -> *mut Ctl {
        // SAFETY: index < CTL_SLOTS, inside the mapping.
        unsafe { self.ctl.ptr.add(self.index as usize * elem(size_of::<Ctl>())).cast() }
    }

    /// A u32 field of the control block, for atomic access (`offset` from
    /// `std::mem::offset_of!(Ctl, …)`).
    pub fn ctl_field(&self, offset: usize) -> &AtomicU32 {
        assert!(offset + 4 <= size_of::<Ctl>() && offset % 4 == 0);
        // SAFETY: an aligned u32 inside this communicator's control block.
        unsafe { &*(self.ctl().cast::<u8>().add(offset).cast::<AtomicU32>()) }
    }

    /// The receive slot that chunk `chunk` lands in.
    pub fn rx_slot(&self, chunk: u32) -> *mut RxSlot {
        let slot = self.index * RX_SLOTS + (chunk & (RX_SLOTS - 1));
        // SAFETY: slot < CTL_SLOTS * RX_SLOTS, inside the mapping.
        unsafe { self.rx.ptr.add(slot as usize * elem(size_of::<RxSlot>())).cast() }
    }

    /// The tag of a receive slot, for atomic access.
    pub fn rx_tag(&self, chunk: u32) -> &AtomicU64 {
        // SAFETY: the first (8-aligned) field of a slot in the mapping.
        unsafe { &*(self.rx_slot(chunk).cast::<AtomicU64>()) }
    }

    /// Copies the bytes in chunk `chunk`'s receive slot into `dst` (at most
    /// [`crate::wire::CHUNK_MAX`]). Read the tag first ([`Windows::rx_tag`],
    /// with `Acquire`) to know the slot holds that chunk.
    pub fn copy_rx(&self, chunk: u32, dst: &mut [u8]) {
        let len = dst.len().min(crate::wire::CHUNK_MAX);
        // SAFETY: the data field of a slot inside the mapping, at least len
        // bytes long; dst is ours and does not overlap the mapping.
        unsafe {
            let src = std::ptr::addr_of!((*self.rx_slot(chunk)).data).cast::<u8>();
            std::ptr::copy_nonoverlapping(src, dst.as_mut_ptr(), len);
        }
    }

    /// The send slot of chunk `chunk`.
    pub fn tx_slot(&self, chunk: u32) -> *mut TxSlot {
        let slot = self.index * TX_SLOTS + (chunk & (TX_SLOTS - 1));
        // SAFETY: slot < CTL_SLOTS * TX_SLOTS, inside the mapping.
        unsafe { self.tx.ptr.add(slot as usize * elem(size_of::<TxSlot>())).cast() }
    }

    /// Clears this communicator's control block and the tags of its slots,
    /// so nothing a previous user left can pass for a chunk of ours.
    pub fn reset(&self) {
        // SAFETY: writes inside this communicator's own parts of the maps;
        // no operation is armed yet, so XDP does not write them.
        unsafe {
            self.ctl().write(Ctl::default());
            for chunk in 0..RX_SLOTS {
                (*self.rx_slot(chunk)).tag = 0;
            }
            for chunk in 0..TX_SLOTS {
                self.tx_slot(chunk).write(TxSlot::default());
            }
        }
        std::sync::atomic::fence(std::sync::atomic::Ordering::SeqCst);
    }
}
