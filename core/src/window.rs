//! The kernel windows, mapped into the process: the control block of a
//! communicator (`ab_ctl`), its broadcast receive window (`ab_rxwin`) and
//! send window (`ab_txwin`), its reduction slots (`ab_redwin`), its
//! reduction result window (`ab_redres`), its barrier count (in `ab_ctl`)
//! and its approximate-agreement phase fold (`ab_agree`). The XDP program writes chunks and counts into them,
//! the process reads them (and arms operations) with plain memory accesses:
//! no system call per operation or per chunk. Fields both sides write are
//! accessed atomically.

use std::{
    io,
    os::fd::{AsRawFd, BorrowedFd},
    sync::atomic::{AtomicU32, AtomicU64},
};

use crate::{
    maps::{
        AgreeCtl, Ctl, RedCtl, AGREE_NO_PHASE, BAR_ABORTED, RedSlot, RxCtl, RxSlot, TxSlot, CALL_KNOWN, CLAIM_OPEN, CLAIM_SET, CTL_SLOTS, FOLD_MAX_S, FOLD_MAX_U,
        FOLD_MIN_S, FOLD_MIN_U, RED_AHEAD, RED_PHASES, RED_SLOTS, RES_SLOTS, RX_PHASES, RX_SLOTS, RX_WINDOW, TX_SLOTS,
    },
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

/// A receiver is woken every this many chunks XDP placed (and at the
/// last), to copy them out and give the window room: a quarter of the
/// window, so that it is usually scheduled before the root, which XDP's
/// ACKs keep sending, has filled the window.
pub const RX_NOTIFY: u32 = RX_WINDOW / 4;

/// `RxCtl::call_key` of a call from `root` of wire dtype `dtype`.
fn call_key(root: u32, dtype: u32) -> u32 {
    CALL_KNOWN | (root << 8) | (dtype & 0xff)
}

/// The tag of chunk `chunk` of broadcast `seq` in a slot.
pub fn tag(seq: u32, chunk: u32) -> u64 {
    (u64::from(seq) << 32) | u64::from(chunk)
}

/// What a receiver arms its window with (see `struct aggbox_ctl`).
#[derive(Clone, Copy, Debug)]
pub struct RxArm {
    /// The broadcast's sequence number (nonzero).
    pub seq: u32,
    /// Its root.
    pub root: u32,
    /// This communicator's rank.
    pub rank: u32,
    /// Its chunks.
    pub nchunks: u32,
    /// Its total elements.
    pub count: u32,
    /// Its element type's wire code.
    pub dtype: u32,
    /// The group's chunk size.
    pub chunk_bytes: u32,
    /// Bytes of its last chunk.
    pub last_bytes: u32,
}

/// What a reduction slot starts from.
enum Start<'a> {
    /// This rank's contribution: (its rank, its lanes).
    Own(usize, &'a [u8]),
    /// Nobody's yet: the identity of (fold, lane bytes).
    Identity(u8, u8),
}

/// The lane value (its low `lane` bytes) that a fold leaves unchanged: 0
/// for sums, the largest value for MIN, the smallest for MAX.
fn identity(fold: u8, lane: u8) -> u64 {
    let bits = u32::from(lane.clamp(1, 8)) * 8;
    let ones = if bits == 64 { u64::MAX } else { (1u64 << bits) - 1 };
    let sign = 1u64 << (bits - 1);
    match fold {
        FOLD_MIN_S => ones >> 1,
        FOLD_MIN_U => ones,
        FOLD_MAX_S => sign,
        _ => 0,
    }
}

/// One communicator's windows.
pub struct Windows {
    index: u32,
    ctl: Mapping,
    rx: Mapping,
    tx: Mapping,
    red: Mapping,
    res: Mapping,
    agree: Mapping,
}

impl Windows {
    /// Maps the windows of control block `index` from the maps' fds
    /// (`ab_ctl`, `ab_rxwin`, `ab_txwin`, `ab_redwin`, `ab_redres`,
    /// `ab_agree`).
    pub fn map(
        index: u32,
        ctl: BorrowedFd<'_>,
        rx: BorrowedFd<'_>,
        tx: BorrowedFd<'_>,
        red: BorrowedFd<'_>,
        res: BorrowedFd<'_>,
        agree: BorrowedFd<'_>,
    ) -> Result<Windows> {
        if index >= CTL_SLOTS {
            return Err(Error::Internal(format!("control block {index} out of range")));
        }
        let windows = Windows {
            index,
            ctl: Mapping::new(ctl, CTL_SLOTS as usize * elem(size_of::<Ctl>()), "ab_ctl")?,
            rx: Mapping::new(rx, (CTL_SLOTS * RX_SLOTS) as usize * elem(size_of::<RxSlot>()), "ab_rxwin")?,
            tx: Mapping::new(tx, (CTL_SLOTS * TX_SLOTS) as usize * elem(size_of::<TxSlot>()), "ab_txwin")?,
            red: Mapping::new(
                red,
                (CTL_SLOTS * RED_PHASES * RED_SLOTS) as usize * elem(size_of::<RedSlot>()),
                "ab_redwin",
            )?,
            res: Mapping::new(res, (CTL_SLOTS * RES_SLOTS) as usize * elem(size_of::<RxSlot>()), "ab_redres")?,
            agree: Mapping::new(agree, CTL_SLOTS as usize * elem(size_of::<AgreeCtl>()), "ab_agree")?,
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
        assert!(offset + 4 <= size_of::<Ctl>() && offset.is_multiple_of(4));
        // SAFETY: an aligned u32 inside this communicator's control block.
        unsafe { &*(self.ctl().cast::<u8>().add(offset).cast::<AtomicU32>()) }
    }

    /// A u32 field of the receive side of broadcast `seq` (its phase,
    /// `seq % RX_PHASES`), for atomic access (`offset` from
    /// `std::mem::offset_of!(RxCtl, …)`).
    pub fn rx_field(&self, seq: u32, offset: usize) -> &AtomicU32 {
        let phase = (seq % RX_PHASES) as usize;
        self.ctl_field(std::mem::offset_of!(Ctl, rx) + phase * size_of::<RxCtl>() + offset)
    }

    /// The receive slot that chunk `chunk` of broadcast `seq` lands in: in
    /// the part of the window of the broadcast's phase.
    pub fn rx_slot(&self, seq: u32, chunk: u32) -> *mut RxSlot {
        let slot = self.index * RX_SLOTS + (seq % RX_PHASES) * RX_WINDOW + (chunk & (RX_WINDOW - 1));
        // SAFETY: slot < CTL_SLOTS * RX_SLOTS, inside the mapping.
        unsafe { self.rx.ptr.add(slot as usize * elem(size_of::<RxSlot>())).cast() }
    }

    /// The tag of a receive slot, for atomic access.
    pub fn rx_tag(&self, seq: u32, chunk: u32) -> &AtomicU64 {
        // SAFETY: the first (8-aligned) field of a slot in the mapping.
        unsafe { &*(self.rx_slot(seq, chunk).cast::<AtomicU64>()) }
    }

    /// Copies the bytes in the receive slot of chunk `chunk` of `seq` into
    /// `dst` (at most [`crate::wire::CHUNK_MAX`]). Check the tag first
    /// ([`Windows::rx_holds`]) to know the slot holds that chunk.
    pub fn copy_rx(&self, seq: u32, chunk: u32, dst: &mut [u8]) {
        let len = dst.len().min(crate::wire::CHUNK_MAX);
        // SAFETY: the data field of a slot inside the mapping, at least len
        // bytes long; dst is ours and does not overlap the mapping.
        unsafe {
            let src = std::ptr::addr_of!((*self.rx_slot(seq, chunk)).data).cast::<u8>();
            std::ptr::copy_nonoverlapping(src, dst.as_mut_ptr(), len);
        }
    }

    /// The send slot of chunk `chunk`.
    pub fn tx_slot(&self, chunk: u32) -> *mut TxSlot {
        let slot = self.index * TX_SLOTS + (chunk & (TX_SLOTS - 1));
        // SAFETY: slot < CTL_SLOTS * TX_SLOTS, inside the mapping.
        unsafe { self.tx.ptr.add(slot as usize * elem(size_of::<TxSlot>())).cast() }
    }

    /// Arms the receive side for broadcast `arm.seq` (the XDP program
    /// starts placing its chunks): everything first, `seq` last.
    pub fn arm_rx(&self, arm: &RxArm) {
        use std::sync::atomic::Ordering::{Relaxed, Release};
        let field = |offset| self.rx_field(arm.seq, offset);
        field(std::mem::offset_of!(RxCtl, seq)).store(0, Release);
        field(std::mem::offset_of!(RxCtl, root)).store(arm.root, Relaxed);
        field(std::mem::offset_of!(RxCtl, rank)).store(arm.rank, Relaxed);
        field(std::mem::offset_of!(RxCtl, nchunks)).store(arm.nchunks, Relaxed);
        field(std::mem::offset_of!(RxCtl, count)).store(arm.count, Relaxed);
        field(std::mem::offset_of!(RxCtl, dtype)).store(arm.dtype, Relaxed);
        field(std::mem::offset_of!(RxCtl, chunk_bytes)).store(arm.chunk_bytes, Relaxed);
        field(std::mem::offset_of!(RxCtl, last_bytes)).store(arm.last_bytes, Relaxed);
        field(std::mem::offset_of!(RxCtl, credit)).store(arm.nchunks.min(RX_WINDOW), Relaxed);
        field(std::mem::offset_of!(RxCtl, notify)).store(RX_NOTIFY, Relaxed);
        field(std::mem::offset_of!(RxCtl, landed)).store(0, Relaxed);
        field(std::mem::offset_of!(RxCtl, target)).store(arm.nchunks, Relaxed);
        field(std::mem::offset_of!(RxCtl, notified)).store(0, Relaxed);
        field(std::mem::offset_of!(RxCtl, claim)).store(CLAIM_SET, Relaxed);
        field(std::mem::offset_of!(RxCtl, call_count)).store(arm.count, Relaxed);
        field(std::mem::offset_of!(RxCtl, call_key)).store(call_key(arm.root, arm.dtype), Relaxed);
        field(std::mem::offset_of!(RxCtl, seq)).store(arm.seq, Release);
    }

    /// Arms the receive side ahead for broadcast `seq`, before its call is
    /// made: the first chunk that arrives sets the parameters it carries
    /// (XDP's `aggbox_claim`), and [`Windows::claim_for_call`] checks them
    /// against the call when it comes. So a root that is already sending
    /// finds the window open. It uses the other phase than `seq - 1`, so
    /// it may be armed while broadcast `seq - 1` is still being copied out.
    pub fn arm_rx_ahead(&self, seq: u32, rank: u32, chunk_bytes: u32) {
        use std::sync::atomic::Ordering::{Relaxed, Release};
        let field = |offset| self.rx_field(seq, offset);
        field(std::mem::offset_of!(RxCtl, seq)).store(0, Release);
        field(std::mem::offset_of!(RxCtl, rank)).store(rank, Relaxed);
        field(std::mem::offset_of!(RxCtl, chunk_bytes)).store(chunk_bytes, Relaxed);
        field(std::mem::offset_of!(RxCtl, credit)).store(0, Relaxed);
        field(std::mem::offset_of!(RxCtl, notify)).store(RX_NOTIFY, Relaxed);
        field(std::mem::offset_of!(RxCtl, landed)).store(0, Relaxed);
        // The claim adds the chunks to this; the process subtracts each it
        // places itself, before or after the claim.
        field(std::mem::offset_of!(RxCtl, target)).store(0, Relaxed);
        field(std::mem::offset_of!(RxCtl, notified)).store(0, Relaxed);
        field(std::mem::offset_of!(RxCtl, claim)).store(CLAIM_OPEN, Relaxed);
        field(std::mem::offset_of!(RxCtl, call_count)).store(0, Relaxed);
        field(std::mem::offset_of!(RxCtl, call_key)).store(0, Relaxed);
        field(std::mem::offset_of!(RxCtl, seq)).store(seq, Release);
    }

    /// Makes the receive side ready for the call `arm`: arms it if it was
    /// not armed ahead for this broadcast; else publishes the call (from
    /// now on XDP claims the window only with a chunk that agrees with it)
    /// and checks what a chunk claimed already, if one did. On a mismatch
    /// returns what the first chunk said: (root, count, dtype).
    ///
    /// The process never takes the claim itself: a process that held it
    /// while descheduled sent every chunk that came meanwhile to its socket
    /// (docs/BROADCAST.md). XDP holds it only for a few instructions.
    pub fn claim_for_call(&self, arm: &RxArm) -> std::result::Result<(), (u32, u32, u32)> {
        use std::sync::atomic::Ordering::{Acquire, Relaxed, Release, SeqCst};
        let field = |offset| self.rx_field(arm.seq, offset);
        if field(std::mem::offset_of!(RxCtl, seq)).load(Acquire) != arm.seq {
            self.arm_rx(arm);
            return Ok(());
        }
        field(std::mem::offset_of!(RxCtl, call_count)).store(arm.count, Relaxed);
        field(std::mem::offset_of!(RxCtl, call_key)).store(call_key(arm.root, arm.dtype), Release);
        // Publish the call before reading the claim (XDP takes the claim,
        // then reads the call): one of the two sees the other.
        std::sync::atomic::fence(SeqCst);
        let claim = field(std::mem::offset_of!(RxCtl, claim));
        loop {
            match claim.load(Acquire) {
                // No chunk claimed it yet: the first will, if it agrees
                // with the call just published.
                CLAIM_OPEN => return Ok(()),
                CLAIM_SET => break,
                _ => std::hint::spin_loop(), // XDP is setting them: a few instructions
            }
        }
        let said = (
            field(std::mem::offset_of!(RxCtl, root)).load(Acquire),
            field(std::mem::offset_of!(RxCtl, count)).load(Acquire),
            field(std::mem::offset_of!(RxCtl, dtype)).load(Acquire),
        );
        let nchunks = field(std::mem::offset_of!(RxCtl, nchunks)).load(Acquire);
        if said == (arm.root, arm.count, arm.dtype) && nchunks == arm.nchunks {
            Ok(())
        } else {
            Err(said)
        }
    }

    /// Whether the parameters of broadcast `seq`'s phase are set (armed
    /// for the call, or claimed by a chunk): XDP places chunks only then.
    pub fn rx_claimed(&self, seq: u32) -> bool {
        self.rx_field(seq, std::mem::offset_of!(RxCtl, claim)).load(std::sync::atomic::Ordering::Acquire) == CLAIM_SET
    }

    /// The process placed a chunk of `seq` itself (it came to the socket):
    /// XDP has one fewer to place before the completion notice. Returns
    /// whether XDP already placed all it now has to (no notice will come).
    /// Armed ahead and not claimed yet, the target wraps below 0 (the claim
    /// adds the chunks to it): never reached.
    pub fn placed_by_process(&self, seq: u32) -> bool {
        use std::sync::atomic::Ordering::{AcqRel, Acquire};
        let target = self.rx_field(seq, std::mem::offset_of!(RxCtl, target)).fetch_sub(1, AcqRel).wrapping_sub(1);
        self.rx_field(seq, std::mem::offset_of!(RxCtl, landed)).load(Acquire) >= target
    }

    /// Stops placement of broadcast `seq`'s phase; if it was armed (ahead)
    /// for `seq` and XDP placed chunks of it, returns the root those chunks
    /// named.
    pub fn disarm_rx_landed(&self, seq: u32) -> Option<u32> {
        use std::sync::atomic::Ordering::{AcqRel, Acquire};
        let armed = self.rx_field(seq, std::mem::offset_of!(RxCtl, seq)).swap(0, AcqRel);
        let landed = self.rx_field(seq, std::mem::offset_of!(RxCtl, landed)).load(Acquire);
        (armed == seq && landed > 0).then(|| self.rx_field(seq, std::mem::offset_of!(RxCtl, root)).load(Acquire))
    }

    /// Stops placement in both phases (a broadcast failed).
    pub fn disarm_rx(&self) {
        for phase in 0..RX_PHASES {
            self.rx_field(phase, std::mem::offset_of!(RxCtl, seq)).store(0, std::sync::atomic::Ordering::Release);
        }
    }

    /// Lets the XDP program place chunks of `seq` below `credit` (window
    /// room).
    pub fn set_rx_credit(&self, seq: u32, credit: u32) {
        self.rx_field(seq, std::mem::offset_of!(RxCtl, credit)).store(credit, std::sync::atomic::Ordering::Release);
    }

    /// Whether chunk `chunk` of broadcast `seq` is in its receive slot
    /// (placed completely: not still being copied in).
    pub fn rx_holds(&self, seq: u32, chunk: u32) -> bool {
        self.rx_tag(seq, chunk).load(std::sync::atomic::Ordering::Acquire) == tag(seq, chunk)
    }

    /// Arms the send side for broadcast `seq`: the XDP program folds the
    /// ACKs of its chunks and wakes the root every `notify` chunks held by
    /// all `receivers` (and at the last).
    pub fn arm_tx(&self, seq: u32, nchunks: u32, receivers: u32, notify: u32) {
        use std::sync::atomic::Ordering::{Relaxed, Release};
        let field = |offset| self.ctl_field(offset);
        field(std::mem::offset_of!(Ctl, tx_seq)).store(0, Release);
        field(std::mem::offset_of!(Ctl, tx_nchunks)).store(nchunks, Relaxed);
        field(std::mem::offset_of!(Ctl, tx_receivers)).store(receivers, Relaxed);
        field(std::mem::offset_of!(Ctl, tx_notify)).store(notify, Relaxed);
        field(std::mem::offset_of!(Ctl, tx_done)).store(0, Relaxed);
        field(std::mem::offset_of!(Ctl, tx_seq)).store(seq, Release);
    }

    /// Chunks of the armed broadcast that every receiver holds (XDP counts).
    pub fn tx_done(&self) -> u32 {
        self.ctl_field(std::mem::offset_of!(Ctl, tx_done)).load(std::sync::atomic::Ordering::Acquire)
    }

    /// Stops folding.
    pub fn disarm_tx(&self) {
        self.ctl_field(std::mem::offset_of!(Ctl, tx_seq)).store(0, std::sync::atomic::Ordering::Release);
    }

    /// The tag of chunk `chunk`'s send slot, for atomic access.
    fn tx_tag(&self, chunk: u32) -> &AtomicU64 {
        // SAFETY: the first (8-aligned) field of a slot in the mapping.
        unsafe { &*(std::ptr::addr_of!((*self.tx_slot(chunk)).tag) as *const AtomicU64) }
    }

    /// Word `word` of the receiver bits of chunk `chunk`'s send slot.
    fn tx_bits(&self, chunk: u32, word: usize) -> &AtomicU64 {
        // SAFETY: an 8-aligned field of a slot in the mapping (the index is
        // checked by the array access).
        unsafe { &*(std::ptr::addr_of!((*self.tx_slot(chunk)).bits[word]) as *const AtomicU64) }
    }

    /// How many receivers hold chunk `chunk` (its send slot's count).
    fn tx_count(&self, chunk: u32) -> &AtomicU32 {
        // SAFETY: a 4-aligned field of a slot in the mapping.
        unsafe { &*(std::ptr::addr_of!((*self.tx_slot(chunk)).count) as *const AtomicU32) }
    }

    /// Readies the send slot of chunk `chunk` of `seq` before it is sent:
    /// no receiver holds it yet. XDP only touches a slot whose tag matches
    /// an ACK, and the tag is written last.
    pub fn prepare_tx(&self, seq: u32, chunk: u32) {
        use std::sync::atomic::Ordering::{Relaxed, Release};
        self.tx_tag(chunk).store(0, Release);
        for word in 0..crate::wire::MAX_RANKS / 64 {
            self.tx_bits(chunk, word).store(0, Relaxed);
        }
        self.tx_count(chunk).store(0, Relaxed);
        self.tx_tag(chunk).store(tag(seq, chunk), Release);
    }

    /// Records that `rank` holds chunk `chunk` of `seq` (an ACK that
    /// reached user space). Returns whether that made every receiver hold
    /// it; the root's count of such chunks goes up the same way the XDP
    /// program's does.
    pub fn fold_tx(&self, seq: u32, chunk: u32, rank: usize, receivers: u32) -> bool {
        use std::sync::atomic::Ordering::AcqRel;
        if !self.tx_tracks(seq, chunk) {
            return false;
        }
        let bit = 1u64 << (rank % 64);
        if self.tx_bits(chunk, rank / 64).fetch_or(bit, AcqRel) & bit != 0 {
            return false;
        }
        if self.tx_count(chunk).fetch_add(1, AcqRel) + 1 != receivers {
            return false;
        }
        self.ctl_field(std::mem::offset_of!(Ctl, tx_done)).fetch_add(1, AcqRel);
        true
    }

    /// Whether chunk `chunk`'s send slot tracks chunk `chunk` of `seq`.
    pub fn tx_tracks(&self, seq: u32, chunk: u32) -> bool {
        self.tx_tag(chunk).load(std::sync::atomic::Ordering::Acquire) == tag(seq, chunk)
    }

    /// Whether `rank` holds chunk `chunk` (of the `seq` its slot tracks).
    pub fn tx_rank_holds(&self, chunk: u32, rank: usize) -> bool {
        self.tx_bits(chunk, rank / 64).load(std::sync::atomic::Ordering::Acquire) & (1u64 << (rank % 64)) != 0
    }

    /// The reduction slot of owned chunk `owned` (its index among this
    /// rank's chunks) of reduction `seq` (its phase).
    pub fn red_slot(&self, seq: u32, owned: u32) -> *mut RedSlot {
        let slot = (self.index * RED_PHASES + seq % RED_PHASES) * RED_SLOTS + (owned & (RED_SLOTS - 1));
        // SAFETY: slot < CTL_SLOTS * RED_PHASES * RED_SLOTS, inside the mapping.
        unsafe { self.red.ptr.add(slot as usize * elem(size_of::<RedSlot>())).cast() }
    }

    fn red_tag(&self, seq: u32, owned: u32) -> &AtomicU64 {
        // SAFETY: the first (8-aligned) field of a slot in the mapping.
        unsafe { &*(std::ptr::addr_of!((*self.red_slot(seq, owned)).tag) as *const AtomicU64) }
    }

    fn red_bits(&self, seq: u32, owned: u32, word: usize) -> &AtomicU64 {
        // SAFETY: an 8-aligned field of a slot in the mapping.
        unsafe { &*(std::ptr::addr_of!((*self.red_slot(seq, owned)).bits[word]) as *const AtomicU64) }
    }

    fn red_count(&self, seq: u32, owned: u32) -> &AtomicU32 {
        // SAFETY: a 4-aligned field of a slot in the mapping.
        unsafe { &*(std::ptr::addr_of!((*self.red_slot(seq, owned)).count) as *const AtomicU32) }
    }

    fn red_done(&self, seq: u32, owned: u32) -> &AtomicU32 {
        // SAFETY: a 4-aligned field of a slot in the mapping.
        unsafe { &*(std::ptr::addr_of!((*self.red_slot(seq, owned)).done) as *const AtomicU32) }
    }

    fn red_inflight(&self, seq: u32, owned: u32) -> &AtomicU32 {
        // SAFETY: a 4-aligned field of a slot in the mapping.
        unsafe { &*(std::ptr::addr_of!((*self.red_slot(seq, owned)).inflight) as *const AtomicU32) }
    }

    /// Untags slot `owned` of `seq`'s phase and waits until no CPU is
    /// folding into it (XDP announces a fold, then looks at the tag again),
    /// so it can be reset for another chunk.
    fn quiesce_red(&self, seq: u32, owned: u32) {
        use std::sync::atomic::Ordering::SeqCst;
        self.red_tag(seq, owned).store(0, SeqCst);
        std::sync::atomic::fence(SeqCst);
        while self.red_inflight(seq, owned).load(SeqCst) != 0 {
            std::hint::spin_loop(); // a fold takes microseconds
        }
    }

    /// The `seq` field of the control of reduction `seq`'s phase.
    fn red_seq(&self, seq: u32) -> &AtomicU32 {
        let phase = (seq % RED_PHASES) as usize;
        self.ctl_field(
            std::mem::offset_of!(Ctl, red) + phase * size_of::<RedCtl>() + std::mem::offset_of!(RedCtl, seq),
        )
    }

    /// Arms XDP to fold the reduction `red` (its phase; seq last). Stop
    /// it with [`Windows::disarm_red`].
    pub fn arm_red(&self, red: &RedCtl) {
        use std::sync::atomic::Ordering::Release;
        let phase = (red.seq % RED_PHASES) as usize;
        self.red_seq(red.seq).store(0, Release);
        std::sync::atomic::fence(std::sync::atomic::Ordering::SeqCst);
        // SAFETY: XDP reads these fields only when seq is nonzero; seq is 0.
        unsafe { std::ptr::addr_of_mut!((*self.ctl()).red[phase]).write(RedCtl { seq: 0, ..*red }) };
        self.red_seq(red.seq).store(red.seq, Release);
    }

    /// What the phase of reduction `seq` is armed for, if it is armed for
    /// `seq`.
    pub fn red_armed(&self, seq: u32) -> Option<RedCtl> {
        if self.red_seq(seq).load(std::sync::atomic::Ordering::Acquire) != seq {
            return None;
        }
        // SAFETY: only this process writes the control; XDP reads it.
        Some(unsafe { std::ptr::addr_of!((*self.ctl()).red[(seq % RED_PHASES) as usize]).read() })
    }

    /// Stops folding in both phases (a reduction failed).
    pub fn disarm_red(&self) {
        for phase in 0..RED_PHASES {
            self.red_seq(phase).store(0, std::sync::atomic::Ordering::Release);
        }
    }

    /// Arms reduction `red` ahead, before its call (whose parameters it
    /// guesses): its first `owned` (at most [`RED_SLOTS`]) slots are zeroed
    /// and tagged [`RED_AHEAD`], for XDP to fold early contributions into;
    /// the call adds this rank's own ([`Windows::join_red_ahead`]).
    pub fn arm_red_ahead(&self, red: &RedCtl, owned: u32) {
        use std::sync::atomic::Ordering::Release;
        self.red_seq(red.seq).store(0, Release);
        std::sync::atomic::fence(std::sync::atomic::Ordering::SeqCst);
        for i in 0..owned.min(RED_SLOTS) {
            self.reset_red(red.seq, i, Start::Identity(red.fold, red.lane), tag(red.seq, RED_AHEAD));
        }
        self.arm_red(red);
    }

    /// Resets slot `owned` of `seq`'s phase once no CPU folds into it, to
    /// `start`; then tags it `new_tag`.
    fn reset_red(&self, seq: u32, owned: u32, start: Start<'_>, new_tag: u64) {
        use std::sync::atomic::Ordering::{Relaxed, Release};
        self.quiesce_red(seq, owned);
        for word in 0..crate::wire::MAX_RANKS / 64 {
            self.red_bits(seq, owned, word).store(0, Relaxed);
        }
        self.red_done(seq, owned).store(0, Relaxed);
        // SAFETY: a slot inside the mapping, untagged: XDP leaves it alone.
        let acc = unsafe { std::ptr::addr_of_mut!((*self.red_slot(seq, owned)).acc) };
        match start {
            Start::Own(rank, lanes) => {
                self.red_bits(seq, owned, rank / 64).store(1 << (rank % 64), Relaxed);
                self.red_count(seq, owned).store(1, Relaxed);
                let len = lanes.len().min(crate::wire::CHUNK_MAX);
                // SAFETY: at most CHUNK_MAX bytes into the acc field.
                unsafe { std::ptr::copy_nonoverlapping(lanes.as_ptr(), acc.cast::<u8>(), len) };
            }
            Start::Identity(fold, lane) => {
                self.red_count(seq, owned).store(0, Relaxed);
                let pattern = identity(fold, lane);
                // SAFETY: the whole acc field, as lanes of `lane` bytes.
                unsafe {
                    let acc = acc.cast::<u8>();
                    for at in (0..crate::wire::CHUNK_MAX).step_by(usize::from(lane.max(1))) {
                        let bytes = pattern.to_le_bytes();
                        std::ptr::copy_nonoverlapping(bytes.as_ptr(), acc.add(at), usize::from(lane.clamp(1, 8)));
                    }
                }
            }
        }
        self.red_tag(seq, owned).store(new_tag, Release);
    }

    /// The call of reduction `seq` found its slot `owned` armed ahead (for
    /// exactly this call: lane width and ranks are the armed ones): names
    /// its chunk (unless XDP already did) and adds this rank's own
    /// contribution `own`. Returns whether that completed it.
    pub fn join_red_ahead(&self, seq: u32, owned: u32, chunk: u32, rank: usize, own: &[u8]) -> bool {
        use std::sync::atomic::Ordering::{AcqRel, Acquire};
        let Some(armed) = self.red_armed(seq) else { return false };
        let _ = self.red_tag(seq, owned).compare_exchange(tag(seq, RED_AHEAD), tag(seq, chunk), AcqRel, Acquire);
        self.fold_red(seq, owned, rank, own, &armed) == Some(true)
    }

    /// Whether slot `owned` of reduction `seq` was armed ahead and then
    /// taken by a contribution (its tag names a chunk of `seq`).
    pub fn red_ahead_taken(&self, seq: u32, owned: u32) -> bool {
        let t = self.red_tag(seq, owned).load(std::sync::atomic::Ordering::Acquire);
        t >> 32 == u64::from(seq) && t != tag(seq, RED_AHEAD)
    }

    /// Readies the slot of owned chunk `owned` (chunk `chunk` of reduction
    /// `seq`) with this rank's own contribution `own` as the starting sum:
    /// its bit `rank` set and a count of 1; the tag last.
    pub fn prepare_red(&self, owned: u32, seq: u32, chunk: u32, rank: usize, own: &[u8]) {
        self.reset_red(seq, owned, Start::Own(rank, own), tag(seq, chunk));
    }

    /// Whether owned chunk `owned`'s slot sums chunk `chunk` of `seq`.
    pub fn red_holds(&self, owned: u32, seq: u32, chunk: u32) -> bool {
        self.red_tag(seq, owned).load(std::sync::atomic::Ordering::Acquire) == tag(seq, chunk)
    }

    /// Folds, from user space, `rank`'s contribution `lanes` into owned
    /// chunk `owned`'s slot of reduction `seq`, as XDP would (the lane
    /// width, fold and ranks of `red`). Returns `None` for a repeat, else
    /// whether it completed the chunk.
    pub fn fold_red(&self, seq: u32, owned: u32, rank: usize, lanes: &[u8], red: &RedCtl) -> Option<bool> {
        use std::sync::atomic::{
            AtomicI32, AtomicI64,
            Ordering::{AcqRel, Acquire},
        };
        let bit = 1u64 << (rank % 64);
        if self.red_bits(seq, owned, rank / 64).fetch_or(bit, AcqRel) & bit != 0 {
            return None;
        }
        // XDP adds under a per-slot spin lock, which the process cannot
        // take: it folds with the slot untagged, once no CPU is in it. XDP
        // leaves an untagged slot alone and passes what comes meanwhile up,
        // to be folded here too.
        let tag = self.red_tag(seq, owned).load(Acquire);
        self.quiesce_red(seq, owned);
        let acc = self.red_slot(seq, owned).cast::<u8>().wrapping_add(std::mem::offset_of!(RedSlot, acc));
        let lane = usize::from(red.lane);
        for (i, x) in lanes.chunks_exact(lane).take(crate::wire::CHUNK_MAX / lane).enumerate() {
            // SAFETY: lane-aligned offsets inside the slot's acc (at most
            // CHUNK_MAX bytes); no CPU folds into it meanwhile (and the
            // atomics would keep a process's own folds apart anyway).
            unsafe {
                let at = acc.add(i * lane);
                if lane == 8 {
                    let v = u64::from_le_bytes(x.try_into().unwrap());
                    match red.fold {
                        FOLD_MIN_S => drop((*at.cast::<AtomicI64>()).fetch_min(v as i64, AcqRel)),
                        FOLD_MIN_U => drop((*at.cast::<AtomicU64>()).fetch_min(v, AcqRel)),
                        FOLD_MAX_S => drop((*at.cast::<AtomicI64>()).fetch_max(v as i64, AcqRel)),
                        FOLD_MAX_U => drop((*at.cast::<AtomicU64>()).fetch_max(v, AcqRel)),
                        _ => drop((*at.cast::<AtomicU64>()).fetch_add(v, AcqRel)),
                    }
                } else {
                    let v = u32::from_le_bytes(x.try_into().unwrap());
                    match red.fold {
                        FOLD_MIN_S => drop((*at.cast::<AtomicI32>()).fetch_min(v as i32, AcqRel)),
                        FOLD_MIN_U => drop((*at.cast::<AtomicU32>()).fetch_min(v, AcqRel)),
                        FOLD_MAX_S => drop((*at.cast::<AtomicI32>()).fetch_max(v as i32, AcqRel)),
                        FOLD_MAX_U => drop((*at.cast::<AtomicU32>()).fetch_max(v, AcqRel)),
                        _ => drop((*at.cast::<AtomicU32>()).fetch_add(v, AcqRel)),
                    }
                }
            }
        }
        let count = self.red_count(seq, owned).fetch_add(1, AcqRel) + 1;
        let completed = count == red.ranks && self.red_done(seq, owned).compare_exchange(0, 1, AcqRel, Acquire).is_ok();
        self.red_tag(seq, owned).store(tag, std::sync::atomic::Ordering::Release);
        Some(completed)
    }

    /// Whether `rank`'s contribution is in owned chunk `owned`'s slot.
    pub fn red_has(&self, seq: u32, owned: u32, rank: usize) -> bool {
        self.red_bits(seq, owned, rank / 64).load(std::sync::atomic::Ordering::Acquire) & (1 << (rank % 64)) != 0
    }

    /// Whether owned chunk `owned`'s slot is complete (every contribution
    /// in it; its completion notice may have been lost on the way up).
    pub fn red_is_done(&self, seq: u32, owned: u32) -> bool {
        self.red_done(seq, owned).load(std::sync::atomic::Ordering::Acquire) != 0
    }

    /// Whether the kernel completed owned chunk `owned`'s slot and left
    /// sending its results to the process (the TC hooks, when the
    /// super-chunk that completed it could not become its results).
    pub fn red_left_to_process(&self, seq: u32, owned: u32) -> bool {
        self.red_done(seq, owned).load(std::sync::atomic::Ordering::Acquire) == crate::maps::RED_DONE_PROCESS
    }

    /// Copies owned chunk `owned`'s sum (`dst.len()` bytes) out of its slot.
    pub fn copy_red(&self, seq: u32, owned: u32, dst: &mut [u8]) {
        std::sync::atomic::fence(std::sync::atomic::Ordering::Acquire);
        let len = dst.len().min(crate::wire::CHUNK_MAX);
        // SAFETY: the acc field of a slot inside the mapping, complete (no
        // CPU adds to it any more); dst does not overlap the mapping.
        unsafe {
            let acc = std::ptr::addr_of!((*self.red_slot(seq, owned)).acc).cast::<u8>();
            std::ptr::copy_nonoverlapping(acc, dst.as_mut_ptr(), len);
        }
    }

    /// A u32 field of the control of reduction `seq`'s phase, for atomic
    /// access (`offset` from `std::mem::offset_of!(RedCtl, …)`).
    fn red_field(&self, seq: u32, offset: usize) -> &AtomicU32 {
        let phase = (seq % RED_PHASES) as usize;
        self.ctl_field(std::mem::offset_of!(Ctl, red) + phase * size_of::<RedCtl>() + offset)
    }

    /// Lets XDP place the results of reduction `seq`'s chunks below `credit`.
    pub fn set_red_credit(&self, seq: u32, credit: u32) {
        self.red_field(seq, std::mem::offset_of!(RedCtl, credit)).store(credit, std::sync::atomic::Ordering::Release);
    }

    /// The process handled a chunk of reduction `seq` itself (a result from
    /// its socket, a sum it completed): XDP's target is one less.
    pub fn red_handled(&self, seq: u32) {
        let target = self.red_field(seq, std::mem::offset_of!(RedCtl, target));
        let _ = target.fetch_update(std::sync::atomic::Ordering::AcqRel, std::sync::atomic::Ordering::Acquire, |t| {
            t.checked_sub(1)
        });
    }

    /// Chunks of reduction `seq` XDP landed so far.
    pub fn red_landed(&self, seq: u32) -> u32 {
        self.red_field(seq, std::mem::offset_of!(RedCtl, landed)).load(std::sync::atomic::Ordering::Acquire)
    }

    /// Whether XDP sent the completion notice of reduction `seq`.
    pub fn red_notified(&self, seq: u32) -> bool {
        self.red_field(seq, std::mem::offset_of!(RedCtl, notified)).load(std::sync::atomic::Ordering::SeqCst) != 0
    }

    /// Lets XDP send the completion notice of reduction `seq` again: the
    /// process was woken by it with chunks still missing (one it counted
    /// twice), so the one that really completes it must wake it too.
    pub fn rearm_red_notice(&self, seq: u32) {
        self.red_field(seq, std::mem::offset_of!(RedCtl, notified)).store(0, std::sync::atomic::Ordering::SeqCst);
    }

    /// The result slot chunk `chunk` of a reduction lands in (both phases
    /// share the window: the tag tells reductions apart).
    fn res_slot(&self, chunk: u32) -> *mut RxSlot {
        let slot = self.index * RES_SLOTS + (chunk & (RES_SLOTS - 1));
        // SAFETY: slot < CTL_SLOTS * RES_SLOTS, inside the mapping.
        unsafe { self.res.ptr.add(slot as usize * elem(size_of::<RxSlot>())).cast() }
    }

    fn res_tag(&self, chunk: u32) -> &AtomicU64 {
        // SAFETY: the first (8-aligned) field of a slot in the mapping.
        unsafe { &*(self.res_slot(chunk).cast::<AtomicU64>()) }
    }

    /// Whether XDP placed the result of chunk `chunk` of reduction `seq`.
    pub fn res_holds(&self, seq: u32, chunk: u32) -> bool {
        self.res_tag(chunk).load(std::sync::atomic::Ordering::Acquire) == tag(seq, chunk)
    }

    /// Copies the result of chunk `chunk` of reduction `seq` (check
    /// [`Windows::res_holds`] first) into `dst` (at most CHUNK_MAX bytes).
    pub fn copy_res(&self, seq: u32, chunk: u32, dst: &mut [u8]) {
        debug_assert!(self.res_holds(seq, chunk), "copying a result slot that does not hold chunk {chunk} of {seq}");
        let len = dst.len().min(crate::wire::CHUNK_MAX);
        // SAFETY: the data field of a slot inside the mapping, published
        // (its tag was read with Acquire); dst does not overlap it.
        unsafe {
            let src = std::ptr::addr_of!((*self.res_slot(chunk)).data).cast::<u8>();
            std::ptr::copy_nonoverlapping(src, dst.as_mut_ptr(), len);
        }
    }

    /// Clears this communicator's control block and the tags of its slots,
    /// so nothing a previous user left can pass for a chunk of ours.
    pub fn reset(&self) {
        // SAFETY: writes inside this communicator's own parts of the maps;
        // no operation is armed yet, so XDP does not write them.
        unsafe {
            self.ctl().write(Ctl::default());
            for phase in 0..RX_PHASES {
                for chunk in 0..RX_WINDOW {
                    (*self.rx_slot(phase, chunk)).tag = 0;
                }
            }
            for chunk in 0..TX_SLOTS {
                self.tx_slot(chunk).write(TxSlot::default());
            }
            for chunk in 0..RES_SLOTS {
                (*self.res_slot(chunk)).tag = 0;
            }
            for phase in 0..RED_PHASES {
                for owned in 0..RED_SLOTS {
                    (*self.red_slot(phase, owned)).tag = 0;
                }

            }
            self.agree_ctl().write(AgreeCtl { phase: AGREE_NO_PHASE, ..AgreeCtl::default() });
        }
        std::sync::atomic::fence(std::sync::atomic::Ordering::SeqCst);
    }
}

// ---- Barrier (ebpf/aggbox_barrier.h) ---------------------------------------

/// What counting a barrier arrival did ([`Windows::arrive`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Arrival {
    /// Counted; others are still missing.
    Counted,
    /// Counted, and it completed the barrier (the next one is open): the
    /// caller releases every rank.
    Completed,
    /// The rank was counted before.
    Repeat,
    /// Not the open barrier (or it was aborted): nothing changed.
    NotOpen,
}

fn bar_state(seq: u32, count: u32) -> u64 {
    (u64::from(seq) << 32) | u64::from(count)
}

impl Windows {
    fn bar(&self) -> *mut crate::maps::BarCtl {
        // SAFETY: inside this communicator's control block.
        unsafe { std::ptr::addr_of_mut!((*self.ctl()).bar) }
    }

    fn bar_state(&self) -> &AtomicU64 {
        // SAFETY: an aligned u64 of this communicator's control block.
        unsafe { &*(std::ptr::addr_of!((*self.bar()).state) as *const AtomicU64) }
    }

    fn bar_bits(&self, seq: u32, word: usize) -> &AtomicU64 {
        // SAFETY: likewise (word < RANK_WORDS, checked by indexing).
        unsafe { &*(std::ptr::addr_of!((*self.bar()).bits[(seq & 1) as usize][word]) as *const AtomicU64) }
    }

    fn bar_size(&self) -> &AtomicU32 {
        self.ctl_field(std::mem::offset_of!(Ctl, bar) + std::mem::offset_of!(crate::maps::BarCtl, size))
    }

    /// Arms the kernel barrier of a group of `size` ranks at rank 0, with
    /// barrier 1 open: from now on TC counts arrivals.
    pub fn arm_barrier(&self, size: u32) {
        use std::sync::atomic::Ordering::SeqCst;
        for seq in 0..2 {
            for word in 0..crate::wire::MAX_RANKS / 64 {
                self.bar_bits(seq, word).store(0, SeqCst);
            }
        }
        self.bar_state().store(bar_state(1, 0), SeqCst);
        self.bar_size().store(size, SeqCst);
    }

    /// Stops the kernel barrier: TC passes every arrival up.
    pub fn disarm_barrier(&self) {
        self.bar_size().store(0, std::sync::atomic::Ordering::SeqCst);
    }

    /// Whether the kernel barrier is armed.
    pub fn barrier_armed(&self) -> bool {
        self.bar_size().load(std::sync::atomic::Ordering::SeqCst) != 0
    }

    /// The open barrier's sequence number.
    pub fn barrier_open(&self) -> u32 {
        (self.bar_state().load(std::sync::atomic::Ordering::SeqCst) >> 32) as u32
    }

    /// Counts `rank`'s arrival at barrier `seq` as TC does
    /// (`aggbox_bar_fold`): rank 0's own, and arrivals TC passed up.
    pub fn arrive(&self, seq: u32, rank: usize) -> Arrival {
        use std::sync::atomic::Ordering::SeqCst;
        let size = self.bar_size().load(SeqCst);
        if size == 0 || rank >= size as usize {
            return Arrival::NotOpen;
        }
        let open = |state: u64| (state >> 32) as u32 == seq && (state as u32) & BAR_ABORTED == 0;
        if !open(self.bar_state().load(SeqCst)) {
            return Arrival::NotOpen;
        }
        let (word, bit) = (self.bar_bits(seq, rank / 64), 1u64 << (rank % 64));
        if word.fetch_or(bit, SeqCst) & bit != 0 {
            return Arrival::Repeat;
        }
        let mut state = self.bar_state().load(SeqCst);
        loop {
            if !open(state) {
                word.fetch_and(!bit, SeqCst);
                return Arrival::NotOpen;
            }
            let count = state as u32 + 1;
            let next = if count >= size { bar_state(seq.wrapping_add(1), 0) } else { state + 1 };
            match self.bar_state().compare_exchange(state, next, SeqCst, SeqCst) {
                Ok(_) if count >= size => {
                    for w in 0..crate::wire::MAX_RANKS / 64 {
                        self.bar_bits(seq.wrapping_add(1), w).store(0, SeqCst);
                    }
                    return Arrival::Completed;
                }
                Ok(_) => return Arrival::Counted,
                Err(now) => state = now,
            }
        }
    }

    /// Gives up on barrier `seq`: TC stops counting it and passes its
    /// arrivals up. Returns false when the barrier completed first.
    pub fn abort_barrier(&self, seq: u32) -> bool {
        use std::sync::atomic::Ordering::SeqCst;
        let mut state = self.bar_state().load(SeqCst);
        loop {
            if (state >> 32) as u32 != seq {
                return false;
            }
            match self.bar_state().compare_exchange(state, state | u64::from(BAR_ABORTED), SeqCst, SeqCst) {
                Ok(_) => return true,
                Err(now) => state = now,
            }
        }
    }

    /// Whether `rank` arrived at barrier `seq` (the open or aborted one).
    pub fn barrier_arrived(&self, seq: u32, rank: usize) -> bool {
        rank < crate::wire::MAX_RANKS
            && self.bar_bits(seq, rank / 64).load(std::sync::atomic::Ordering::SeqCst) & (1u64 << (rank % 64)) != 0
    }
}

// ---- Approximate agreement (ebpf/aggbox_agree.h) ---------------------------

/// The ordered key of the f64 with bits `bits`: unsigned order of keys is
/// the order of the doubles (negative ones have their bits inverted, the
/// others their sign bit set; −0 orders below +0). The same integer
/// transform as XDP's `aggbox_agree_key`, and as [`crate::quant::to_ordered`]
/// for F64 MIN/MAX on every non-NaN value (NaN is not an agreement input;
/// here it is just bits: above +∞ with its sign clear, below −∞ with it set).
pub fn agree_key(bits: u64) -> u64 {
    if bits >> 63 != 0 {
        !bits
    } else {
        bits | (1 << 63)
    }
}

/// The f64 bits of ordered key `key` (the inverse of [`agree_key`]).
pub fn agree_unkey(key: u64) -> u64 {
    if key >> 63 != 0 {
        key & !(1 << 63)
    } else {
        !key
    }
}

/// What a rank arms its agreement window with for one phase.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct AgreeArm {
    /// The agreement (nonzero).
    pub seq: u32,
    /// The phase XDP folds from now on.
    pub phase: u32,
    /// The agreement's last phase.
    pub last: u32,
    /// Values that complete the phase (n − f), this rank's own included;
    /// `u32::MAX` with `phase == last`: decided (fold, never notify).
    pub quorum: u32,
    /// This communicator's rank: the sender of answers.
    pub rank: u32,
    /// This rank's value of `phase` (the fold starts from it; XDP answers
    /// ranks that lag with it).
    pub value: f64,
    /// This rank's incarnation (its store's counter), sent in answers.
    pub incarnation: u32,
}

/// The fold of the armed phase, as the window holds it.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct AgreeFold {
    /// The armed agreement (0: none).
    pub seq: u32,
    /// The armed phase ([`AGREE_NO_PHASE`] while re-arming).
    pub phase: u32,
    /// Distinct senders folded, own included.
    pub count: u32,
    /// The quorum armed.
    pub quorum: u32,
    /// Whether the quorum notice went up (or the process's fold took it).
    pub notified: bool,
    /// Who was folded, one bit per rank.
    pub senders: [u64; 4],
    /// The smallest value folded.
    pub min: f64,
    /// The largest.
    pub max: f64,
}

/// What the process's own fold of a passed-up value did.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum AgreeFolded {
    /// The window is not armed for that agreement and phase (or is being
    /// re-armed): nothing folded.
    NotArmed,
    /// That sender was folded into the phase already.
    Duplicate,
    /// Folded; the quorum is not reached (or its notice is someone else's).
    Folded,
    /// This fold took the count to the quorum and won the notice.
    Quorum,
}

/*
 * The handshake with XDP, on x86-TSO (stores are seen in program order,
 * loads are not reordered with loads, and a locked instruction, which is
 * what SeqCst stores and every read-modify-write compile to, is a full
 * barrier; the BPF JIT keeps XDP's program order, and its __sync_* are
 * locked instructions too):
 *
 * - Re-arming. The process stores phase = NO_PHASE (SeqCst: xchg), then
 *   reads inflight until it is 0. XDP adds 1 to inflight (lock xadd), then
 *   reads phase. Each side's write is followed by a full barrier before its
 *   read, so (as in Dekker's algorithm) at least one of them sees the
 *   other's write: either XDP reads NO_PHASE and leaves the block alone
 *   (only undoing its add), or the process sees XDP's add and waits until
 *   its fold ends. Once inflight is 0 with NO_PHASE stored, no CPU touches
 *   the fold fields; the process rewrites them, then stores the new phase
 *   (SeqCst). An XDP that reads that phase reads, after it (loads in order),
 *   the seq/last/quorum/rank and fold written before it (stores in order).
 * - Answers. ans_* are written under the ans_gen seqlock: gen made odd
 *   (lock xadd), the fields stored, gen made even (lock xadd); XDP reads
 *   gen, the fields, gen again, and answers only when both reads are the
 *   same even number. (While arming, phase is NO_PHASE and XDP does not
 *   answer at all; the seqlock keeps the answer consistent on its own.)
 * - Folding. Both sides fold with the same atomics on the same words:
 *   min/max by compare-and-swap (fetch_min/fetch_max here), the sender bit
 *   by fetch-or (the one that set it owns that sender), the count by
 *   fetch-add, the notice by a CAS on notified. Min/max come before the
 *   bit: whoever sees the bit set knows the value is in min/max already, or
 *   being folded by the one that set it (a value is folded at most by the
 *   sides that saw it, and re-folding the same value is harmless).
 */
impl Windows {
    /// This communicator's agreement block.
    fn agree_ctl(&self) -> *mut AgreeCtl {
        // SAFETY: index < CTL_SLOTS, inside the mapping.
        unsafe { self.agree.ptr.add(self.index as usize * elem(size_of::<AgreeCtl>())).cast() }
    }

    /// A u32 field of the agreement block (`offset` from `offset_of!(AgreeCtl, …)`).
    fn agree_u32(&self, offset: usize) -> &AtomicU32 {
        assert!(offset + 4 <= size_of::<AgreeCtl>() && offset.is_multiple_of(4));
        // SAFETY: an aligned u32 inside this communicator's block.
        unsafe { &*(self.agree_ctl().cast::<u8>().add(offset).cast::<AtomicU32>()) }
    }

    /// A u64 field of the agreement block.
    fn agree_u64(&self, offset: usize) -> &AtomicU64 {
        assert!(offset + 8 <= size_of::<AgreeCtl>() && offset.is_multiple_of(8));
        // SAFETY: an aligned u64 inside this communicator's block (the
        // mapping is page-aligned and the element size a multiple of 8).
        unsafe { &*(self.agree_ctl().cast::<u8>().add(offset).cast::<AtomicU64>()) }
    }

    /// Word `word` of the senders bitmap.
    fn agree_senders(&self, word: usize) -> &AtomicU64 {
        self.agree_u64(std::mem::offset_of!(AgreeCtl, senders) + (word % 4) * 8)
    }

    /// Stops XDP looking at the fold (phase = NO_PHASE) and waits until no
    /// CPU is between its look at the phase and the end of its fold.
    fn quiesce_agree(&self) {
        use std::sync::atomic::Ordering::SeqCst;
        self.agree_u32(std::mem::offset_of!(AgreeCtl, phase)).store(AGREE_NO_PHASE, SeqCst);
        let inflight = self.agree_u32(std::mem::offset_of!(AgreeCtl, inflight));
        while inflight.load(SeqCst) != 0 {
            std::hint::spin_loop(); // a fold takes well under a microsecond
        }
    }

    /// Arms phase `arm.phase`: store phase = NO_PHASE (SeqCst), spin until
    /// inflight == 0, write seq/last/quorum/rank, senders = own bit only,
    /// count = 1, min_key = max_key = key(own value), notified = 0; then
    /// ans_gen++ (odd), ans_phase/value/incarnation, ans_gen++ (even); then
    /// store phase = arm.phase (SeqCst). The same call with phase == last
    /// and quorum == u32::MAX is the "decided" state: XDP keeps folding
    /// (recording who sent final values, no notice) and answers laggers with
    /// the final value.
    pub fn arm_agree(&self, arm: &AgreeArm) {
        use std::mem::offset_of;
        use std::sync::atomic::Ordering::{Release, SeqCst};
        self.quiesce_agree();
        let u32f = |offset| self.agree_u32(offset);
        u32f(offset_of!(AgreeCtl, seq)).store(arm.seq, Release);
        u32f(offset_of!(AgreeCtl, last)).store(arm.last, Release);
        u32f(offset_of!(AgreeCtl, quorum)).store(arm.quorum, Release);
        u32f(offset_of!(AgreeCtl, rank)).store(arm.rank, Release);
        let own = arm.rank as usize % crate::wire::MAX_RANKS;
        for word in 0..crate::wire::MAX_RANKS / 64 {
            let bits = if word == own / 64 { 1u64 << (own % 64) } else { 0 };
            self.agree_senders(word).store(bits, Release);
        }
        u32f(offset_of!(AgreeCtl, count)).store(1, Release);
        let key = agree_key(arm.value.to_bits());
        self.agree_u64(offset_of!(AgreeCtl, min_key)).store(key, Release);
        self.agree_u64(offset_of!(AgreeCtl, max_key)).store(key, Release);
        u32f(offset_of!(AgreeCtl, notified)).store(0, Release);
        // The answer, under its seqlock.
        let gen = u32f(offset_of!(AgreeCtl, ans_gen));
        if gen.load(SeqCst) & 1 != 0 {
            gen.fetch_add(1, SeqCst); // left odd by an earlier user: even it first
        }
        gen.fetch_add(1, SeqCst);
        u32f(offset_of!(AgreeCtl, ans_phase)).store(arm.phase, Release);
        self.agree_u64(offset_of!(AgreeCtl, ans_value)).store(arm.value.to_bits(), Release);
        u32f(offset_of!(AgreeCtl, ans_incarnation)).store(arm.incarnation, Release);
        gen.fetch_add(1, SeqCst);
        u32f(offset_of!(AgreeCtl, phase)).store(arm.phase, SeqCst);
    }

    /// The process folds a value XDP passed up (contended, or arrived
    /// before this phase was armed), with the same atomics on the mapped
    /// block: min/max first (fetch_min/fetch_max on the keys), then the
    /// sender bit, then count; returns Quorum when this fold took count to
    /// quorum AND won the notified CAS.
    pub fn fold_agree(&self, seq: u32, phase: u32, sender: usize, value: f64) -> AgreeFolded {
        use std::mem::offset_of;
        use std::sync::atomic::Ordering::{AcqRel, Acquire};
        // Only the process changes seq and phase, so they hold still here
        // (arm and fold from one thread).
        let armed_phase = self.agree_u32(offset_of!(AgreeCtl, phase)).load(Acquire);
        let armed_seq = self.agree_u32(offset_of!(AgreeCtl, seq)).load(Acquire);
        if seq == 0 || armed_seq != seq || armed_phase == AGREE_NO_PHASE || armed_phase != phase {
            return AgreeFolded::NotArmed;
        }
        let key = agree_key(value.to_bits());
        self.agree_u64(offset_of!(AgreeCtl, min_key)).fetch_min(key, AcqRel);
        self.agree_u64(offset_of!(AgreeCtl, max_key)).fetch_max(key, AcqRel);
        let sender = sender % crate::wire::MAX_RANKS;
        let bit = 1u64 << (sender % 64);
        if self.agree_senders(sender / 64).fetch_or(bit, AcqRel) & bit != 0 {
            return AgreeFolded::Duplicate;
        }
        let count = self.agree_u32(offset_of!(AgreeCtl, count)).fetch_add(1, AcqRel) + 1;
        let quorum = self.agree_u32(offset_of!(AgreeCtl, quorum)).load(Acquire);
        if count >= quorum
            && self.agree_u32(offset_of!(AgreeCtl, notified)).compare_exchange(0, 1, AcqRel, Acquire).is_ok()
        {
            AgreeFolded::Quorum
        } else {
            AgreeFolded::Folded
        }
    }

    /// Reads the block (keys converted back to f64).
    pub fn agree_fold(&self) -> AgreeFold {
        use std::mem::offset_of;
        use std::sync::atomic::Ordering::Acquire;
        let u32f = |offset| self.agree_u32(offset).load(Acquire);
        let mut senders = [0u64; 4];
        for (word, bits) in senders.iter_mut().enumerate() {
            *bits = self.agree_senders(word).load(Acquire);
        }
        AgreeFold {
            seq: u32f(offset_of!(AgreeCtl, seq)),
            phase: u32f(offset_of!(AgreeCtl, phase)),
            count: u32f(offset_of!(AgreeCtl, count)),
            quorum: u32f(offset_of!(AgreeCtl, quorum)),
            notified: u32f(offset_of!(AgreeCtl, notified)) != 0,
            senders,
            min: f64::from_bits(agree_unkey(self.agree_u64(offset_of!(AgreeCtl, min_key)).load(Acquire))),
            max: f64::from_bits(agree_unkey(self.agree_u64(offset_of!(AgreeCtl, max_key)).load(Acquire))),
        }
    }

    /// seq = 0: XDP passes every agreement datagram up. (Also phase =
    /// NO_PHASE, and returns once no CPU is folding or answering from the
    /// block: nothing XDP does afterwards touches it.)
    pub fn disarm_agree(&self) {
        use std::sync::atomic::Ordering::SeqCst;
        self.quiesce_agree();
        self.agree_u32(std::mem::offset_of!(AgreeCtl, seq)).store(0, SeqCst);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{dtype::Dtype, op::ReduceOp, quant};

    /// Doubles of every kind: zeros of both signs, subnormals, the extremes,
    /// infinities, and a spread of ordinary values.
    fn values() -> Vec<f64> {
        let mut v = vec![
            0.0,
            -0.0,
            f64::from_bits(1),
            -f64::from_bits(1),
            f64::MIN_POSITIVE,
            -f64::MIN_POSITIVE,
            f64::MAX,
            f64::MIN,
            f64::INFINITY,
            f64::NEG_INFINITY,
            1.0,
            -1.0,
            0.5,
            1e6,
            -1e6,
            1e300,
            -1e-300,
        ];
        // A deterministic pseudo-random spread over all exponents.
        let mut x = 0x9e37_79b9_7f4a_7c15u64;
        while v.len() < 5000 {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            let f = f64::from_bits(x);
            if !f.is_nan() {
                v.push(f);
            }
            v.push((x % 2_000_001) as f64 / 2.0 - 500_000.0);
        }
        v
    }

    #[test]
    fn the_agreement_key_orders_as_the_doubles() {
        let v = values();
        for &a in &v {
            let ka = agree_key(a.to_bits());
            assert_eq!(agree_unkey(ka), a.to_bits(), "{a:e} round-trips");
            for &b in v.iter().step_by(7) {
                let kb = agree_key(b.to_bits());
                // −0 and +0 compare equal as floats; their keys order −0 first.
                let want = if a == 0.0 && b == 0.0 {
                    a.is_sign_positive().cmp(&b.is_sign_positive())
                } else {
                    a.partial_cmp(&b).unwrap()
                };
                assert_eq!(ka.cmp(&kb), want, "{a:e} vs {b:e}");
            }
        }
        // The min and max of any set, through the keys, are the plain ones.
        for set in v.chunks(13) {
            let kmin = set.iter().map(|x| agree_key(x.to_bits())).min().unwrap();
            let kmax = set.iter().map(|x| agree_key(x.to_bits())).max().unwrap();
            let min = set.iter().copied().fold(f64::INFINITY, f64::min);
            let max = set.iter().copied().fold(f64::NEG_INFINITY, f64::max);
            assert_eq!(f64::from_bits(agree_unkey(kmin)), min);
            assert_eq!(f64::from_bits(agree_unkey(kmax)), max);
        }
    }

    #[test]
    fn the_agreement_key_is_the_reductions_f64_key() {
        let v = values();
        let src: Vec<u8> = v.iter().flat_map(|x| x.to_le_bytes()).collect();
        for op in [ReduceOp::Min, ReduceOp::Max] {
            let mut keys = vec![0u8; src.len()];
            quant::to_ordered(Dtype::F64, op, &src, &mut keys);
            for (x, k) in v.iter().zip(keys.chunks_exact(8)) {
                assert_eq!(agree_key(x.to_bits()), u64::from_le_bytes(k.try_into().unwrap()), "{x:e}");
            }
        }
    }
}
