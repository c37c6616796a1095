//! `aggbox_broadcast` and `aggbox_ibroadcast`: the broadcast collective of
//! a communicator, blocking and asynchronous.

use std::{
    os::raw::{c_int, c_void},
    ptr::{self, NonNull},
};

use aggbox_core::{Comm, Dtype, Result};

use super::{aggbox_comm, CommRef};
use crate::{
    boundary::{invalid, status_call, try_write},
    request::aggbox_request,
    types::{aggbox_dtype, aggbox_status, RawDtype},
};

/// The caller's buffer, owned by the library until the broadcast ends.
struct CallerBuf {
    ptr: NonNull<u8>,
    len: usize,
}

// SAFETY: the caller promises that the buffer stays valid, and is used by
// nothing else, until the operation has finished: the thread that runs the
// operation may then own it.
unsafe impl Send for CallerBuf {}

/// A broadcast's checked arguments.
struct Broadcast {
    buf: CallerBuf,
    dtype: Dtype,
    root: usize,
}

impl Broadcast {
    /// Checks the C arguments against `comm`'s group: a known `dtype`,
    /// `root` a rank, `count × size` bytes a size that exists, `buf` not
    /// NULL when there is anything to broadcast.
    fn check(
        comm: &aggbox_comm,
        buf: *mut c_void,
        count: usize,
        dtype: RawDtype,
        root: c_int,
    ) -> Result<Broadcast> {
        let dtype: Dtype = aggbox_dtype::from_raw(dtype)
            .ok_or_else(|| invalid(format!("dtype {dtype} is not an aggbox_dtype")))?
            .into();
        let ranks = comm.size();
        let root = usize::try_from(root)
            .ok()
            .filter(|&r| r < ranks as usize)
            .ok_or_else(|| {
                invalid(format!(
                    "root {root} is not a rank of this group of {ranks}"
                ))
            })?;
        let len = dtype.bytes(count)?;
        if u32::try_from(count).is_err() {
            return Err(invalid(format!(
                "{count} elements are more than one broadcast carries ({})",
                u32::MAX
            )));
        }
        let ptr = match NonNull::new(buf.cast::<u8>()) {
            Some(ptr) => ptr,
            None if len == 0 => NonNull::dangling(),
            None => return Err(invalid(format!("buf is NULL with count {count}"))),
        };
        Ok(Broadcast {
            buf: CallerBuf { ptr, len },
            dtype,
            root,
        })
    }

    /// Runs it on `comm`.
    fn run(self, comm: &mut Comm) -> Result<()> {
        // SAFETY: `len` bytes at `ptr` are the caller's buffer, valid and
        // ours until the broadcast returns (the caller's promise; `check`
        // made sure the length fits in memory); dangling only when empty.
        let buf = unsafe { std::slice::from_raw_parts_mut(self.buf.ptr.as_ptr(), self.buf.len) };
        comm.broadcast(buf, self.dtype, self.root)
    }
}

/// Broadcasts `count` elements of `dtype` at `buf` from rank `root` to every
/// rank of `comm`, in place: when it returns `AGGBOX_OK`, every rank's `buf`
/// holds what the root's held. Every rank calls it with the same `count`,
/// `dtype` and `root`, in the same order as its other collectives (as
/// `MPI_Bcast`).
///
/// Fails, with nothing sent, with `AGGBOX_ERR_INVALID_ARGUMENT` when `buf`
/// is NULL and `count` is not 0, `root` is not a rank, `dtype` is not an
/// `aggbox_dtype`, `count` elements do not fit in memory or are more than
/// 2^32 - 1. Fails with `AGGBOX_ERR_INVALID_ARGUMENT` on every rank, the
/// message saying "mismatched collective calls", when the ranks' `count`,
/// `dtype` or `root` disagree; with `AGGBOX_ERR_PEER_FAILED` naming a rank
/// that stopped answering within the timeout. After a failure `buf` may
/// hold part of the root's data.
///
/// While an `aggbox_ibroadcast` on `comm` is pending, this call queues
/// behind it (and any other pending operation) and blocks until its turn
/// has come and gone. The library keeps no pointer to `buf` after it
/// returns.
///
/// # Safety
///
/// `comm` is NULL or a live communicator; `buf` is NULL or valid for reading
/// and writing `count` elements of `dtype`.
#[no_mangle]
pub unsafe extern "C" fn aggbox_broadcast(
    comm: *mut aggbox_comm,
    buf: *mut c_void,
    count: usize,
    dtype: RawDtype,
    root: c_int,
) -> aggbox_status {
    status_call("aggbox_broadcast", || {
        // SAFETY: the caller's promise.
        let handle = unsafe { CommRef::new(comm) }?;
        let broadcast = Broadcast::check(&handle, buf, count, dtype, root)?;
        handle
            .progress()
            .run(&handle, move |comm| broadcast.run(comm))
    })
}

/// Starts the broadcast of `aggbox_broadcast` (same arguments, same checks,
/// made before this returns) and returns at once; `*out` is then a request
/// to finish it with `aggbox_wait` or `aggbox_test`, and to free with
/// `aggbox_request_free`. On failure `*out` is NULL and nothing was started.
///
/// The broadcast runs on the communicator's progress thread (one per
/// communicator, started by its first asynchronous call), after the
/// operations started before it. Until it has finished, `buf` belongs to
/// the library: the caller must neither free, read nor write it. Blocking
/// calls on `comm` meanwhile (`aggbox_barrier`, `aggbox_broadcast`,
/// `aggbox_comm_stats`) wait for their turn behind it, and
/// `aggbox_comm_destroy` waits for it to finish.
///
/// # Safety
///
/// `comm` is NULL or a live communicator; `buf` is NULL or valid for reading
/// and writing `count` elements of `dtype` until the operation has
/// finished; `out` is NULL or valid for writing a pointer.
#[no_mangle]
pub unsafe extern "C" fn aggbox_ibroadcast(
    comm: *mut aggbox_comm,
    buf: *mut c_void,
    count: usize,
    dtype: RawDtype,
    root: c_int,
    out: *mut *mut aggbox_request,
) -> aggbox_status {
    status_call("aggbox_ibroadcast", || {
        // SAFETY: the caller's promises.
        unsafe { try_write(out, "out", ptr::null_mut()) }?;
        let handle = unsafe { CommRef::new(comm) }?;
        let broadcast = Broadcast::check(&handle, buf, count, dtype, root)?;
        // SAFETY: `out` checked by try_write above.
        unsafe { handle.start("aggbox_ibroadcast", out, move |comm| broadcast.run(comm)) }
    })
}

#[cfg(test)]
mod tests {
    use std::{
        thread,
        time::{Duration, Instant},
    };

    use super::*;
    use crate::{
        boundary::copy_last_error,
        comm::{aggbox_barrier, aggbox_comm_destroy, aggbox_comm_init},
        config::aggbox_config,
        request::{aggbox_request_free, aggbox_test, aggbox_wait},
        stats::{aggbox_comm_stats, aggbox_stats},
        types::{aggbox_datapath, RawDatapath},
    };

    fn last_error() -> String {
        let mut buf = [0u8; 512];
        let len = copy_last_error(&mut buf);
        String::from_utf8(buf[..len].to_vec()).unwrap()
    }

    /// Rank `rank` of `size` on 127.0.0.1, user datapath, store at `port`.
    fn join(rank: c_int, size: c_int, port: u16) -> *mut aggbox_comm {
        join_with_timeout(rank, size, port, 5000)
    }

    /// [`join`] with another timeout.
    fn join_with_timeout(rank: c_int, size: c_int, port: u16, timeout_ms: u32) -> *mut aggbox_comm {
        let config = aggbox_config {
            rank,
            world_size: size,
            master_port: port,
            datapath: aggbox_datapath::AGGBOX_DATAPATH_USER as RawDatapath,
            timeout_ms,
            ..Default::default()
        };
        let mut comm = ptr::null_mut();
        let status = unsafe { aggbox_comm_init(&config, &mut comm) };
        assert_eq!(status, aggbox_status::AGGBOX_OK, "{}", last_error());
        comm
    }

    fn packets_sent(comm: *mut aggbox_comm) -> u64 {
        let mut stats = unsafe { std::mem::MaybeUninit::<aggbox_stats>::zeroed().assume_init() };
        stats.size = std::mem::size_of::<aggbox_stats>();
        assert_eq!(
            unsafe { aggbox_comm_stats(comm, &mut stats) },
            aggbox_status::AGGBOX_OK
        );
        stats.packets_sent
    }

    const I64: RawDtype = aggbox_dtype::AGGBOX_DTYPE_I64 as RawDtype;
    const U8: RawDtype = aggbox_dtype::AGGBOX_DTYPE_U8 as RawDtype;

    #[test]
    fn arguments_are_checked_and_nothing_is_sent() {
        let comm = join(0, 1, 29_661);
        let mut buf = [0i64; 4];
        let data = buf.as_mut_ptr().cast::<c_void>();
        let cases: [(*mut c_void, usize, RawDtype, c_int, &str); 6] = [
            (ptr::null_mut(), 4, I64, 0, "buf is NULL with count 4"),
            (data, 4, I64, 1, "root 1 is not a rank of this group of 1"),
            (data, 4, I64, -1, "root -1 is not a rank"),
            (data, 4, 99, 0, "dtype 99 is not an aggbox_dtype"),
            (
                data,
                usize::MAX / 2,
                I64,
                0,
                "more bytes than any buffer holds",
            ),
            (
                data,
                (u32::MAX as usize) + 1,
                U8,
                0,
                "more than one broadcast carries",
            ),
        ];
        unsafe {
            let before = packets_sent(comm);
            for (buf, count, dtype, root, says) in cases {
                let status = aggbox_broadcast(comm, buf, count, dtype, root);
                assert_eq!(status, aggbox_status::AGGBOX_ERR_INVALID_ARGUMENT);
                assert!(
                    last_error().starts_with("aggbox_broadcast: invalid argument:"),
                    "{}",
                    last_error()
                );
                assert!(
                    last_error().contains(says),
                    "{} does not say {says}",
                    last_error()
                );
                let mut request = ptr::dangling_mut();
                assert_eq!(
                    aggbox_ibroadcast(comm, buf, count, dtype, root, &mut request),
                    aggbox_status::AGGBOX_ERR_INVALID_ARGUMENT
                );
                assert!(request.is_null(), "nothing started");
                assert!(last_error().contains(says), "{}", last_error());
            }
            assert_eq!(packets_sent(comm), before, "nothing sent");
            assert_eq!(
                aggbox_broadcast(ptr::null_mut(), data, 4, I64, 0),
                aggbox_status::AGGBOX_ERR_INVALID_ARGUMENT
            );
            assert_eq!(
                last_error(),
                "aggbox_broadcast: invalid argument: comm is NULL"
            );
            assert_eq!(
                aggbox_ibroadcast(comm, data, 4, I64, 0, ptr::null_mut()),
                aggbox_status::AGGBOX_ERR_INVALID_ARGUMENT
            );
            assert_eq!(
                last_error(),
                "aggbox_ibroadcast: invalid argument: out is NULL"
            );
            // One rank: nothing to send, but a broadcast all the same;
            // NULL with count 0 is fine.
            assert_eq!(
                aggbox_broadcast(comm, data, 4, I64, 0),
                aggbox_status::AGGBOX_OK
            );
            assert_eq!(
                aggbox_broadcast(comm, ptr::null_mut(), 0, I64, 0),
                aggbox_status::AGGBOX_OK
            );
            let mut request = ptr::null_mut();
            assert_eq!(
                aggbox_ibroadcast(comm, data, 4, I64, 0, &mut request),
                aggbox_status::AGGBOX_OK
            );
            assert_eq!(
                aggbox_wait(request),
                aggbox_status::AGGBOX_OK,
                "{}",
                last_error()
            );
            aggbox_request_free(request);
            aggbox_comm_destroy(comm);
        }
    }

    struct Handle(*mut aggbox_comm);
    // SAFETY: each test hands a communicator to one thread.
    unsafe impl Send for Handle {}

    /// Two ranks: rank 0 starts an asynchronous broadcast and a barrier
    /// that queues behind it, frees a second request unfinished (waiting
    /// for it); rank 1 receives with blocking calls, late.
    #[test]
    fn asynchronous_broadcasts_run_in_order_with_blocking_calls() {
        let port = 29_662;
        let n = 300_000usize;
        let receiver = thread::spawn(move || {
            let comm = Handle(join(1, 2, port));
            let mut first = vec![0u32; n];
            let mut second = vec![0u8; 10];
            unsafe {
                thread::sleep(Duration::from_millis(100));
                let dtype = aggbox_dtype::AGGBOX_DTYPE_U32 as RawDtype;
                assert_eq!(
                    aggbox_broadcast(comm.0, first.as_mut_ptr().cast(), n, dtype, 0),
                    aggbox_status::AGGBOX_OK,
                    "{}",
                    last_error()
                );
                assert_eq!(
                    aggbox_barrier(comm.0),
                    aggbox_status::AGGBOX_OK,
                    "{}",
                    last_error()
                );
                thread::sleep(Duration::from_millis(100));
                assert_eq!(
                    aggbox_broadcast(comm.0, second.as_mut_ptr().cast(), 10, U8, 0),
                    aggbox_status::AGGBOX_OK
                );
                aggbox_comm_destroy(comm.0);
            }
            (first, second)
        });
        let comm = join(0, 2, port);
        let mut first: Vec<u32> = (0..n as u32).collect();
        let mut second = *b"0123456789";
        unsafe {
            let mut request = ptr::null_mut();
            let dtype = aggbox_dtype::AGGBOX_DTYPE_U32 as RawDtype;
            assert_eq!(
                aggbox_ibroadcast(comm, first.as_mut_ptr().cast(), n, dtype, 0, &mut request),
                aggbox_status::AGGBOX_OK
            );
            let mut done = 1;
            assert_eq!(aggbox_test(request, &mut done), aggbox_status::AGGBOX_OK);
            assert_eq!(done, 0, "rank 1 is 100 ms late");
            // Queued behind the broadcast: rank 1 enters it after it.
            assert_eq!(
                aggbox_barrier(comm),
                aggbox_status::AGGBOX_OK,
                "{}",
                last_error()
            );
            assert_eq!(aggbox_test(request, &mut done), aggbox_status::AGGBOX_OK);
            assert_eq!(done, 1, "the barrier ran after the broadcast");
            assert_eq!(aggbox_wait(request), aggbox_status::AGGBOX_OK);
            aggbox_request_free(request);

            let start = Instant::now();
            assert_eq!(
                aggbox_ibroadcast(comm, second.as_mut_ptr().cast(), 10, U8, 0, &mut request),
                aggbox_status::AGGBOX_OK
            );
            aggbox_request_free(request);
            assert!(
                start.elapsed() >= Duration::from_millis(50),
                "free waited for the broadcast"
            );
            aggbox_comm_destroy(comm);
        }
        let (got_first, got_second) = receiver.join().unwrap();
        assert!(got_first == first);
        assert_eq!(&got_second, b"0123456789");
    }

    /// A peer that fails during an asynchronous broadcast: `aggbox_wait`
    /// reports it, naming the rank.
    #[test]
    fn an_asynchronous_failure_is_reported_by_wait() {
        let port = 29_663;
        let peer = thread::spawn(move || {
            let comm = Handle(join(1, 2, port));
            // Never broadcasts: closes instead (and keeps, unacknowledged,
            // the chunks that arrive meanwhile).
            thread::sleep(Duration::from_millis(100));
            unsafe { aggbox_comm_destroy(comm.0) };
        });
        let comm = join_with_timeout(0, 2, port, 300);
        unsafe {
            let mut buf = [1u8; 8];
            let mut request = ptr::null_mut();
            assert_eq!(
                aggbox_ibroadcast(comm, buf.as_mut_ptr().cast(), 8, U8, 0, &mut request),
                aggbox_status::AGGBOX_OK
            );
            assert_eq!(aggbox_wait(request), aggbox_status::AGGBOX_ERR_PEER_FAILED);
            assert!(
                last_error()
                    .starts_with("aggbox_wait: aggbox_ibroadcast: rank 1 failed: broadcast #1"),
                "{}",
                last_error()
            );
            aggbox_request_free(request);
            aggbox_comm_destroy(comm);
        }
        peer.join().unwrap();
    }
}
