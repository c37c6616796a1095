//! `aggbox_comm`: the communicator handle, its life cycle and its collectives.

use std::{
    ops::{Deref, DerefMut},
    os::raw::{c_char, c_int},
    ptr,
    sync::{
        atomic::{AtomicUsize, Ordering},
        Mutex, MutexGuard, TryLockError,
    },
};

use aggbox_core::{Comm, Error, Result};

use crate::{
    boundary::{
        c_text, copy_c_string, invalid, lock_exclusive, status_call, try_out_buf, try_ref,
        try_write, value_call,
    },
    config::aggbox_config,
    progress::{Progress, SharedComm},
    types::{aggbox_datapath, aggbox_status},
};

/// A communicator: this process's membership in a group of ranks that run
/// collectives together. Opaque; made by `aggbox_comm_init` or
/// `aggbox_comm_init_from_env`, freed by `aggbox_comm_destroy`. It may be
/// used from any thread, but by one thread at a time: a call made while
/// another thread is inside a call on the same communicator fails with
/// `AGGBOX_ERR_INVALID_ARGUMENT` (the getters of rank, size, datapath and
/// datapath reason may be called even then). Its asynchronous operations
/// (`aggbox_ibroadcast`, `aggbox_iallreduce`) run on a progress thread of its own, started by
/// the first of them; while any is pending, blocking calls queue behind it.
/// `aggbox_comm_destroy` must not race any call on it: see there.
pub struct aggbox_comm {
    /// What never changes, readable without the lock.
    rank: c_int,
    size: c_int,
    datapath: aggbox_datapath,
    /// Why the communicator is on its datapath (the kernel datapath's hooks,
    /// or why `AGGBOX_DATAPATH_AUTO` fell back), made fit for C (see
    /// [`c_text`]); empty when the user datapath was asked for.
    datapath_reason: Box<str>,
    /// How many exports are using this handle right now, on any thread (see
    /// [`CommRef`]): `aggbox_comm_destroy` frees it only when it is alone.
    calls: AtomicUsize,
    /// The communicator, `None` once `aggbox_comm_destroy` has taken it out;
    /// the lock is only ever tried by calling threads, never waited for
    /// (only the progress thread waits for it).
    comm: SharedComm,
    /// The progress thread of asynchronous operations.
    progress: Progress,
}

// The handle moves between the threads of its C caller (one at a time), so
// the core communicator must be `Send`; the Mutex makes the handle `Sync`.
const _: () = {
    const fn assert_send_sync<T: Send + Sync>() {}
    assert_send_sync::<aggbox_comm>();
};

impl aggbox_comm {
    /// Wraps a communicator that has just joined its group.
    fn new(comm: Comm) -> Result<aggbox_comm> {
        let int = |value: usize, what: &str| {
            c_int::try_from(value)
                .map_err(|_| Error::Internal(format!("{what} {value} does not fit an int")))
        };
        Ok(aggbox_comm {
            rank: int(comm.rank(), "rank")?,
            size: int(comm.size(), "world size")?,
            datapath: comm.datapath().into(),
            datapath_reason: c_text(comm.datapath_reason().unwrap_or_default()).into(),
            calls: AtomicUsize::new(0),
            comm: std::sync::Arc::new(Mutex::new(Some(comm))),
            progress: Progress::default(),
        })
    }

    /// Number of ranks of the group.
    pub(crate) fn size(&self) -> c_int {
        self.size
    }

    /// This process's rank.
    pub(crate) fn rank(&self) -> c_int {
        self.rank
    }

    /// The communicator, as the progress thread shares it.
    pub(crate) fn shared_comm(&self) -> &SharedComm {
        &self.comm
    }

    /// The progress thread, to run or queue an operation on.
    pub(crate) fn progress(&self) -> &Progress {
        &self.progress
    }
}

/// A communicator handle in use by one export: counted in
/// [`aggbox_comm::calls`] from [`CommRef::new`] to its drop, so that
/// `aggbox_comm_destroy` does not free the handle under it. Every export
/// reaches the handle through one.
pub(crate) struct CommRef<'a>(&'a aggbox_comm);

impl<'a> CommRef<'a> {
    /// The handle `ptr`, the argument `comm`, counted as in use.
    ///
    /// # Safety
    ///
    /// `ptr` is NULL or a live communicator.
    pub(crate) unsafe fn new(ptr: *const aggbox_comm) -> Result<CommRef<'a>> {
        // SAFETY: the caller's promise.
        let handle = unsafe { try_ref(ptr, "comm") }?;
        // Relaxed, as `Arc::clone`: what matters is that the decrement in
        // `drop` is seen by `aggbox_comm_destroy` before it frees.
        handle.calls.fetch_add(1, Ordering::Relaxed);
        Ok(CommRef(handle))
    }

    /// The communicator, for one call by this thread.
    pub(crate) fn lock(&self) -> Result<CommGuard<'_>> {
        let guard = lock_exclusive(&self.0.comm)?;
        if guard.is_none() {
            return Err(invalid(
                "the communicator is being destroyed (by another thread): \
                 it must not be used once aggbox_comm_destroy is called",
            ));
        }
        Ok(CommGuard(guard))
    }
}

impl CommRef<'_> {
    /// Starts `op` on the communicator's progress thread, behind what is
    /// pending there, and writes the request that finishes it to `out`
    /// (the body of every asynchronous export; `name` names it in errors).
    ///
    /// # Safety
    ///
    /// `out` is valid for writing a pointer (checked with `try_write` by
    /// the caller before anything else).
    pub(crate) unsafe fn start(
        &self,
        name: &'static str,
        out: *mut *mut crate::request::aggbox_request,
        op: impl FnOnce(&mut Comm) -> Result<()> + Send + 'static,
    ) -> Result<()> {
        use crate::request::{aggbox_request, Completion, Finisher};
        let completion = std::sync::Arc::new(Completion::default());
        let finisher = Finisher::new(completion.clone(), name);
        self.progress()
            .submit(self.shared_comm(), self.rank(), Box::new(move |comm| finisher.finish(comm.and_then(op))))?;
        let request = Box::into_raw(Box::new(aggbox_request::new(completion)));
        // SAFETY: the caller's promise.
        unsafe { out.write(request) };
        Ok(())
    }
}

impl Deref for CommRef<'_> {
    type Target = aggbox_comm;

    fn deref(&self) -> &aggbox_comm {
        self.0
    }
}

impl Drop for CommRef<'_> {
    fn drop(&mut self) {
        // Release: this export's accesses to the handle happen before
        // `aggbox_comm_destroy` frees it (it loads with Acquire). The
        // handle may be freed as soon as this is done.
        self.0.calls.fetch_sub(1, Ordering::Release);
    }
}

/// The communicator, locked for one call by [`CommRef::lock`] (which
/// checked that it was not taken out by `aggbox_comm_destroy`).
pub(crate) struct CommGuard<'a>(MutexGuard<'a, Option<Comm>>);

impl Deref for CommGuard<'_> {
    type Target = Comm;

    fn deref(&self) -> &Comm {
        self.0.as_ref().expect("checked by CommRef::lock")
    }
}

impl DerefMut for CommGuard<'_> {
    fn deref_mut(&mut self) -> &mut Comm {
        self.0.as_mut().expect("checked by CommRef::lock")
    }
}

/// Joins a new communicator, as `aggbox_comm_init` and
/// `aggbox_comm_init_from_env` do: `*out` is NULL on failure.
///
/// # Safety
///
/// `out` is NULL or valid for writing a pointer.
unsafe fn init(out: *mut *mut aggbox_comm, join: impl FnOnce() -> Result<Comm>) -> Result<()> {
    // SAFETY: the caller's promise.
    unsafe { try_write(out, "out", ptr::null_mut()) }?;
    let handle = Box::new(aggbox_comm::new(join()?)?);
    // SAFETY: checked just above.
    unsafe { out.write(Box::into_raw(handle)) };
    Ok(())
}

/// Creates a communicator from `*config` and joins its group: rendezvous
/// with every rank at `master_addr:master_port`, then sets up the datapath.
/// Blocks until all `world_size` ranks have joined, or fails after
/// `timeout_ms`. On success `*out` is the new communicator, to be freed with
/// `aggbox_comm_destroy`; on failure `*out` is NULL. The library keeps no
/// pointer to `config`.
///
/// # Safety
///
/// `config` is NULL or points to an `aggbox_config` of at least
/// `config->size` readable bytes; `out` is NULL or writable.
#[no_mangle]
pub unsafe extern "C" fn aggbox_comm_init(
    config: *const aggbox_config,
    out: *mut *mut aggbox_comm,
) -> aggbox_status {
    status_call("aggbox_comm_init", || {
        // SAFETY: the caller's promises.
        unsafe {
            init(out, || {
                let config = aggbox_config::read(config)?.to_core()?;
                Comm::new(config)
            })
        }
    })
}

/// Like `aggbox_comm_init` with the configuration taken from the environment:
/// RANK, WORLD_SIZE, MASTER_ADDR (required), MASTER_PORT, AGGBOX_IFACE,
/// AGGBOX_PORT, AGGBOX_DATAPATH (auto, kernel or user), AGGBOX_TIMEOUT_MS and
/// AGGBOX_STORE (rank0 or external: `aggbox_config.store`).
///
/// # Safety
///
/// `out` is NULL or valid for writing a pointer.
#[no_mangle]
pub unsafe extern "C" fn aggbox_comm_init_from_env(out: *mut *mut aggbox_comm) -> aggbox_status {
    // SAFETY: the caller's promise.
    status_call("aggbox_comm_init_from_env", || unsafe {
        init(out, Comm::from_env)
    })
}

/// Leaves the group and frees `comm` and everything it holds. NULL is a
/// no-op. Asynchronous operations still pending on `comm` are finished
/// first (this waits for them), and its progress thread is stopped; their
/// requests stay valid, to be waited for and freed.
///
/// Destroying a communicator while another thread may be using it is a bug
/// of the caller; the library makes it an error where it can see it, and
/// records the last error:
/// - While another thread is inside a call that holds the communicator
///   (`aggbox_barrier`, `aggbox_comm_stats`), this does nothing: `comm` is
///   not destroyed, stays valid, and may be destroyed once that call has
///   returned.
/// - Otherwise it first takes the communicator out of the handle, in the
///   same step as that check. While it leaves the group, a call from
///   another thread that needs the communicator (`aggbox_barrier`,
///   `aggbox_comm_stats`, a second `aggbox_comm_destroy`) fails with
///   `AGGBOX_ERR_INVALID_ARGUMENT`, "the communicator is being destroyed",
///   and the getters still answer. The handle itself is freed only after
///   the calls that reached it in the meantime have returned.
///
/// What it cannot catch is a call that reaches `comm` as this call frees it
/// or after: that is a use of freed memory, undefined behaviour. So `comm`
/// must not be used, from any thread, once this call has returned, and a
/// program should not let any call race it.
///
/// # Safety
///
/// `comm` is NULL or a communicator from `aggbox_comm_init*` that was not
/// destroyed yet.
#[no_mangle]
pub unsafe extern "C" fn aggbox_comm_destroy(comm: *mut aggbox_comm) {
    value_call("aggbox_comm_destroy", (), || {
        if comm.is_null() {
            return Ok(());
        }
        // SAFETY: a live communicator (the caller's promise).
        let handle = unsafe { CommRef::new(comm) }?;
        // Its operations end first: they hold the communicator's lock.
        handle.progress.shutdown();
        // Check and take under one lock: once it is released, a call that
        // gets the lock finds `None`.
        let taken = {
            let mut guard = match handle.comm.try_lock() {
                Ok(guard) => guard,
                // A panic in an earlier call: the communicator is unusable,
                // and destroying it is what the error asked for.
                Err(TryLockError::Poisoned(poisoned)) => poisoned.into_inner(),
                Err(TryLockError::WouldBlock) => {
                    return Err(invalid(
                        "comm is in use by another thread: not destroyed \
                         (destroy it once no call is in progress)",
                    ))
                }
            };
            guard.take().ok_or_else(|| {
                invalid("comm is being destroyed by another thread: destroyed only once")
            })?
        };
        // Leave the group with the lock released, so that a racing call
        // fails at once, with "being destroyed".
        drop(taken);
        // Wait for the calls that reached the handle meanwhile; they do not
        // block (the lock is only tried), so this is short. Acquire: their
        // accesses happen before the free (see `CommRef::drop`).
        while handle.calls.load(Ordering::Acquire) != 1 {
            std::thread::yield_now();
        }
        // Not dropped: that would count this call out after the check.
        std::mem::forget(handle);
        // SAFETY: made by `Box::into_raw` in `init` and not freed yet (the
        // caller's promise); this call took the communicator out, so no
        // other destroy frees it, and no other call holds the handle.
        drop(unsafe { Box::from_raw(comm) });
        Ok(())
    })
}

/// This process's rank in the communicator's group, or -1 if `comm` is NULL.
///
/// # Safety
///
/// `comm` is NULL or a live communicator.
#[no_mangle]
pub unsafe extern "C" fn aggbox_comm_rank(comm: *const aggbox_comm) -> c_int {
    // SAFETY: the caller's promise.
    value_call("aggbox_comm_rank", -1, || {
        Ok(unsafe { CommRef::new(comm) }?.rank)
    })
}

/// Number of ranks in the communicator's group, or -1 if `comm` is NULL.
///
/// # Safety
///
/// `comm` is NULL or a live communicator.
#[no_mangle]
pub unsafe extern "C" fn aggbox_comm_size(comm: *const aggbox_comm) -> c_int {
    // SAFETY: the caller's promise.
    value_call("aggbox_comm_size", -1, || {
        Ok(unsafe { CommRef::new(comm) }?.size)
    })
}

/// The datapath the communicator really uses: `AGGBOX_DATAPATH_KERNEL` or
/// `AGGBOX_DATAPATH_USER`, never `AGGBOX_DATAPATH_AUTO` (which is what a NULL
/// `comm` gives).
///
/// # Safety
///
/// `comm` is NULL or a live communicator.
#[no_mangle]
pub unsafe extern "C" fn aggbox_comm_datapath(comm: *const aggbox_comm) -> aggbox_datapath {
    // SAFETY: the caller's promise.
    value_call(
        "aggbox_comm_datapath",
        aggbox_datapath::AGGBOX_DATAPATH_AUTO,
        || Ok(unsafe { CommRef::new(comm) }?.datapath),
    )
}

/// Why the communicator is on its datapath: on the kernel datapath its hooks
/// and why, such as "the kernel datapath on eth0, tc hooks (a virtual
/// device, ...): broadcast in the kernel, ..."; when `AGGBOX_DATAPATH_AUTO`
/// fell back to the user datapath, why, such as "auto chose the user
/// datapath on lo: lo is a loopback interface; ...". It copies the text
/// into `buf` as a NUL-terminated string, truncated to `len` bytes with
/// the NUL, and returns the length of the whole text without the NUL, as
/// `snprintf` does (a return value of `len` or more means it was truncated;
/// with `buf` NULL or `len` 0 it writes nothing and only returns the
/// length). When the communicator was asked for `AGGBOX_DATAPATH_USER` it
/// writes an empty string and returns 0. A NULL `comm` also gives an empty
/// string and 0, and records the last error. The reason is fixed when the
/// communicator is made, so this may be called from any thread, even while
/// another thread is inside a call on the communicator (but, as every call,
/// not racing `aggbox_comm_destroy`).
///
/// # Safety
///
/// `comm` is NULL or a live communicator; `buf` is NULL or valid for writing
/// `len` bytes.
#[no_mangle]
pub unsafe extern "C" fn aggbox_comm_datapath_reason(
    comm: *const aggbox_comm,
    buf: *mut c_char,
    len: usize,
) -> usize {
    value_call("aggbox_comm_datapath_reason", 0, || {
        // SAFETY: the caller's promise.
        let buf = unsafe { try_out_buf(buf.cast::<u8>(), len, "buf") }?.unwrap_or_default();
        // An empty string until the reason is known, so that `buf` holds a
        // C string whatever happens next.
        copy_c_string("", buf);
        // SAFETY: the caller's promise.
        let comm = unsafe { CommRef::new(comm) }?;
        Ok(copy_c_string(&comm.datapath_reason, buf))
    })
}

/// Blocks until every rank of the group has called `aggbox_barrier`. Fails
/// with `AGGBOX_ERR_PEER_FAILED` naming a rank that did not arrive within the
/// timeout. While an asynchronous operation on `comm` is pending, it queues
/// behind it.
///
/// # Safety
///
/// `comm` is NULL or a live communicator.
#[no_mangle]
pub unsafe extern "C" fn aggbox_barrier(comm: *mut aggbox_comm) -> aggbox_status {
    status_call("aggbox_barrier", || {
        // SAFETY: the caller's promise.
        let handle = unsafe { CommRef::new(comm) }?;
        handle.progress.run(&handle, |comm| comm.barrier())
    })
}

// The collectives with buffers, in a file of their own.
mod broadcast;
pub use broadcast::*;
mod reduce;
pub use reduce::*;

#[cfg(test)]
mod tests {
    use super::*;
    use crate::boundary::copy_last_error;

    fn last_error() -> String {
        let mut buf = [0u8; 256];
        let len = copy_last_error(&mut buf);
        String::from_utf8(buf[..len].to_vec()).unwrap()
    }

    #[test]
    fn null_arguments() {
        unsafe {
            assert_eq!(aggbox_comm_rank(ptr::null()), -1);
            assert_eq!(
                last_error(),
                "aggbox_comm_rank: invalid argument: comm is NULL"
            );
            assert_eq!(aggbox_comm_size(ptr::null()), -1);
            assert_eq!(
                last_error(),
                "aggbox_comm_size: invalid argument: comm is NULL"
            );
            assert_eq!(
                aggbox_comm_datapath(ptr::null()),
                aggbox_datapath::AGGBOX_DATAPATH_AUTO
            );
            assert_eq!(
                last_error(),
                "aggbox_comm_datapath: invalid argument: comm is NULL"
            );
            assert_eq!(
                aggbox_barrier(ptr::null_mut()),
                aggbox_status::AGGBOX_ERR_INVALID_ARGUMENT
            );
            assert_eq!(
                last_error(),
                "aggbox_barrier: invalid argument: comm is NULL"
            );

            let mut buf = [b'x' as c_char; 8];
            assert_eq!(
                aggbox_comm_datapath_reason(ptr::null(), buf.as_mut_ptr(), buf.len()),
                0
            );
            assert_eq!(buf[0], 0, "an empty string even for a NULL comm");
            assert_eq!(
                last_error(),
                "aggbox_comm_datapath_reason: invalid argument: comm is NULL"
            );
            assert_eq!(
                aggbox_comm_datapath_reason(ptr::null(), ptr::null_mut(), 0),
                0
            );

            crate::boundary::set_last_error("");
            aggbox_comm_destroy(ptr::null_mut());
            assert_eq!(last_error(), "", "destroy(NULL) is no error");

            let config = aggbox_config::default();
            let status = aggbox_comm_init(&config, ptr::null_mut());
            assert_eq!(status, aggbox_status::AGGBOX_ERR_INVALID_ARGUMENT);
            assert_eq!(
                last_error(),
                "aggbox_comm_init: invalid argument: out is NULL"
            );
            assert_eq!(
                aggbox_comm_init_from_env(ptr::null_mut()),
                aggbox_status::AGGBOX_ERR_INVALID_ARGUMENT
            );
            assert_eq!(
                last_error(),
                "aggbox_comm_init_from_env: invalid argument: out is NULL"
            );
        }
    }

    #[test]
    fn init_with_a_bad_config_leaves_out_null() {
        let mut out = ptr::dangling_mut::<aggbox_comm>();
        let status = unsafe { aggbox_comm_init(ptr::null(), &mut out) };
        assert_eq!(status, aggbox_status::AGGBOX_ERR_INVALID_ARGUMENT);
        assert!(out.is_null());
        assert_eq!(
            last_error(),
            "aggbox_comm_init: invalid argument: config is NULL"
        );

        let mut out = ptr::dangling_mut::<aggbox_comm>();
        let config = aggbox_config {
            rank: 3,
            world_size: 2,
            ..Default::default()
        };
        let status = unsafe { aggbox_comm_init(&config, &mut out) };
        assert_eq!(status, aggbox_status::AGGBOX_ERR_INVALID_ARGUMENT);
        assert!(out.is_null());
        assert_eq!(
            last_error(),
            "aggbox_comm_init: invalid argument: rank 3 is not below the world size 2"
        );

        let config = aggbox_config {
            size: 1 << 20,
            ..Default::default()
        };
        let status = unsafe { aggbox_comm_init(&config, &mut out) };
        assert_eq!(status, aggbox_status::AGGBOX_ERR_INVALID_ARGUMENT);
        assert!(
            last_error().starts_with("aggbox_comm_init: invalid argument: config->size is 1048576")
        );
    }

    /// A one-rank communicator on the user datapath at 127.0.0.1 (the
    /// default): no peer, no privilege.
    fn one_rank() -> *mut aggbox_comm {
        one_rank_on(aggbox_datapath::AGGBOX_DATAPATH_USER)
    }

    /// A one-rank communicator at 127.0.0.1 asking for `datapath`.
    fn one_rank_on(datapath: aggbox_datapath) -> *mut aggbox_comm {
        let config = aggbox_config {
            datapath: datapath as crate::types::RawDatapath,
            ..Default::default()
        };
        let mut comm = ptr::null_mut();
        let status = unsafe { aggbox_comm_init(&config, &mut comm) };
        assert_eq!(status, aggbox_status::AGGBOX_OK, "{}", last_error());
        assert!(!comm.is_null());
        comm
    }

    #[test]
    fn one_rank_communicator() {
        use crate::stats::{aggbox_comm_stats, aggbox_stats};

        let comm = one_rank();
        unsafe {
            assert_eq!(aggbox_comm_rank(comm), 0);
            assert_eq!(aggbox_comm_size(comm), 1);
            assert_eq!(
                aggbox_comm_datapath(comm),
                aggbox_datapath::AGGBOX_DATAPATH_USER
            );
            // Asked for the user datapath: no fallback, no reason.
            let mut buf = [b'x' as c_char; 16];
            assert_eq!(
                aggbox_comm_datapath_reason(comm, buf.as_mut_ptr(), buf.len()),
                0
            );
            assert_eq!(buf[0], 0);
            assert_eq!(buf[1], b'x' as c_char, "nothing written past the NUL");
            assert_eq!(aggbox_comm_datapath_reason(comm, ptr::null_mut(), 0), 0);
            for _ in 0..3 {
                assert_eq!(
                    aggbox_barrier(comm),
                    aggbox_status::AGGBOX_OK,
                    "{}",
                    last_error()
                );
            }
            let mut stats = std::mem::MaybeUninit::<aggbox_stats>::zeroed().assume_init();
            stats.size = std::mem::size_of::<aggbox_stats>();
            assert_eq!(
                aggbox_comm_stats(comm, &mut stats),
                aggbox_status::AGGBOX_OK,
                "{}",
                last_error()
            );
            assert_eq!(stats.barriers, 3);
            assert_eq!(stats.datapath, aggbox_datapath::AGGBOX_DATAPATH_USER as i32);
            assert!(stats.kernel.iter().flatten().all(|c| *c == 0));

            stats.size += 8;
            assert_eq!(
                aggbox_comm_stats(comm, &mut stats),
                aggbox_status::AGGBOX_ERR_INVALID_ARGUMENT
            );
            assert!(last_error().contains("stats->size is"), "{}", last_error());
            assert_eq!(
                aggbox_comm_stats(comm, ptr::null_mut()),
                aggbox_status::AGGBOX_ERR_INVALID_ARGUMENT
            );
            assert_eq!(
                last_error(),
                "aggbox_comm_stats: invalid argument: stats is NULL"
            );
            aggbox_comm_destroy(comm);
        }
    }

    /// The text of `aggbox_comm_datapath_reason(comm)`, read as C would:
    /// the length first, then a buffer that fits.
    fn datapath_reason(comm: *const aggbox_comm) -> String {
        let len = unsafe { aggbox_comm_datapath_reason(comm, ptr::null_mut(), 0) };
        let mut buf = vec![b'x' as c_char; len + 1];
        let again = unsafe { aggbox_comm_datapath_reason(comm, buf.as_mut_ptr(), buf.len()) };
        assert_eq!(again, len);
        let text = unsafe { std::ffi::CStr::from_ptr(buf.as_ptr()) };
        assert_eq!(text.to_bytes().len(), len);
        text.to_str().unwrap().to_owned()
    }

    /// Auto on loopback (127.0.0.1, the default) cannot have the kernel
    /// datapath, which attaches to a host's network interface only: it falls
    /// back to the user datapath and says why.
    #[test]
    fn auto_on_loopback_falls_back_and_says_why() {
        let comm = one_rank_on(aggbox_datapath::AGGBOX_DATAPATH_AUTO);
        unsafe {
            assert_eq!(
                aggbox_comm_datapath(comm),
                aggbox_datapath::AGGBOX_DATAPATH_USER
            );
            let reason = datapath_reason(comm);
            assert!(
                reason.starts_with("auto chose the user datapath on ")
                    && reason.contains("loopback"),
                "{reason}"
            );

            // Truncated like snprintf: the full length comes back.
            let mut small = [b'x' as c_char; 6];
            assert_eq!(
                aggbox_comm_datapath_reason(comm, small.as_mut_ptr(), small.len()),
                reason.len()
            );
            assert_eq!(
                std::ffi::CStr::from_ptr(small.as_ptr()).to_bytes(),
                &reason.as_bytes()[..5]
            );
            let mut one = [b'x' as c_char; 1];
            assert_eq!(
                aggbox_comm_datapath_reason(comm, one.as_mut_ptr(), 1),
                reason.len()
            );
            assert_eq!(one[0], 0);
            let mut untouched = [b'x' as c_char; 4];
            assert_eq!(
                aggbox_comm_datapath_reason(comm, untouched.as_mut_ptr(), 0),
                reason.len()
            );
            assert_eq!(untouched, [b'x' as c_char; 4], "len 0 writes nothing");

            // A working communicator, on the user datapath.
            assert_eq!(
                aggbox_barrier(comm),
                aggbox_status::AGGBOX_OK,
                "{}",
                last_error()
            );
            aggbox_comm_destroy(comm);
        }
    }

    #[test]
    fn a_communicator_in_use_refuses_other_threads() {
        struct Handle(*mut aggbox_comm);
        // SAFETY: the test hands the pointer to one other thread and joins it.
        unsafe impl Send for Handle {}

        let comm = one_rank();
        // Hold the lock as a call in progress on another thread would.
        let held = unsafe { CommRef::new(comm) }.unwrap();
        let guard = held.lock().unwrap();
        let handle = Handle(comm);
        std::thread::spawn(move || {
            let comm = handle;
            let status = unsafe { aggbox_barrier(comm.0) };
            assert_eq!(status, aggbox_status::AGGBOX_ERR_INVALID_ARGUMENT);
            assert!(last_error()
                .starts_with("aggbox_barrier: invalid argument: the communicator is in use"));
            // The getters do not need the lock.
            assert_eq!(unsafe { aggbox_comm_size(comm.0) }, 1);
            assert_eq!(datapath_reason(comm.0), "");
            unsafe { aggbox_comm_destroy(comm.0) };
            assert!(
                last_error().starts_with("aggbox_comm_destroy: invalid argument: comm is in use")
            );
        })
        .join()
        .unwrap();
        drop(guard);
        drop(held);
        unsafe {
            assert_eq!(
                aggbox_barrier(comm),
                aggbox_status::AGGBOX_OK,
                "{}",
                last_error()
            );
            aggbox_comm_destroy(comm);
        }
    }

    struct Handle(*mut aggbox_comm);
    // SAFETY: the tests hand the pointer to another thread, which destroys
    // it only once the test is done with it.
    unsafe impl Send for Handle {}

    /// Calls that reach the handle while `aggbox_comm_destroy` is under way
    /// on another thread fail, and destroy does not free the handle before
    /// they are done.
    #[test]
    fn calls_racing_destroy_fail_and_the_handle_outlives_them() {
        let comm = one_rank();
        // The start of a call on this thread, as destroy begins on another:
        // it holds the handle, not the lock.
        let racing = unsafe { CommRef::new(comm) }.unwrap();
        let handle = Handle(comm);
        let destroy = std::thread::spawn(move || {
            let handle = handle;
            crate::boundary::set_last_error("");
            unsafe { aggbox_comm_destroy(handle.0) };
            last_error()
        });
        // Wait until destroy has taken the communicator out.
        while racing.comm.try_lock().map_or(true, |comm| comm.is_some()) {
            std::thread::yield_now();
        }
        let err = racing.lock().err().expect("no communicator to lock");
        assert!(
            err.to_string().contains("the communicator is being destroyed"),
            "{err}"
        );
        unsafe {
            // Other calls that reach the handle now fail the same way...
            assert_eq!(
                aggbox_barrier(comm),
                aggbox_status::AGGBOX_ERR_INVALID_ARGUMENT
            );
            assert!(
                last_error().starts_with(
                    "aggbox_barrier: invalid argument: the communicator is being destroyed"
                ),
                "{}",
                last_error()
            );
            assert_eq!(
                aggbox_comm_stats_status(comm),
                aggbox_status::AGGBOX_ERR_INVALID_ARGUMENT
            );
            // ...a second destroy does nothing...
            aggbox_comm_destroy(comm);
            assert!(
                last_error().starts_with(
                    "aggbox_comm_destroy: invalid argument: comm is being destroyed"
                ),
                "{}",
                last_error()
            );
            // ...and the handle is still there for the getters.
            assert_eq!(aggbox_comm_rank(comm), 0);
            assert_eq!(aggbox_comm_size(comm), 1);
        }
        std::thread::sleep(std::time::Duration::from_millis(20));
        assert!(
            !destroy.is_finished(),
            "destroy freed the handle while a call held it"
        );
        drop(racing);
        assert_eq!(destroy.join().unwrap(), "", "the first destroy succeeded");
    }

    /// `aggbox_comm_stats` on `comm`, for its status.
    unsafe fn aggbox_comm_stats_status(comm: *mut aggbox_comm) -> aggbox_status {
        use crate::stats::{aggbox_comm_stats, aggbox_stats};
        let mut stats = unsafe { std::mem::MaybeUninit::<aggbox_stats>::zeroed().assume_init() };
        stats.size = std::mem::size_of::<aggbox_stats>();
        unsafe { aggbox_comm_stats(comm, &mut stats) }
    }

    /// A communicator that an internal error made unusable can still be
    /// destroyed, as that error says to.
    #[test]
    fn a_poisoned_communicator_can_be_destroyed() {
        let comm = one_rank();
        let status = status_call("aggbox_barrier", || {
            let handle = unsafe { CommRef::new(comm) }?;
            let _guard = handle.lock()?;
            panic!("in the middle of a barrier");
        });
        assert_eq!(status, aggbox_status::AGGBOX_ERR_INTERNAL);
        unsafe {
            assert_eq!(aggbox_barrier(comm), aggbox_status::AGGBOX_ERR_INTERNAL);
            assert_eq!((*comm).calls.load(Ordering::Relaxed), 0, "unwinding counted the call out");
            crate::boundary::set_last_error("");
            aggbox_comm_destroy(comm);
        }
        assert_eq!(last_error(), "", "destroyed without an error");
    }

    /// `config.store = AGGBOX_STORE_EXTERNAL` makes every rank, rank 0
    /// included, join a store that outlives them (here one in this
    /// process, as `aggbox store` serves it): no environment variable.
    #[test]
    fn ranks_join_an_external_store_through_the_config() {
        use crate::types::{aggbox_store, RawDatapath, RawStore};
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let store = aggbox_core::rendezvous::Store::serve(listener, 2).unwrap();
        let port = store.addr().port();
        let ranks: Vec<_> = (0..2)
            .map(|rank| {
                std::thread::spawn(move || {
                    let config = aggbox_config {
                        rank,
                        world_size: 2,
                        master_port: port,
                        datapath: aggbox_datapath::AGGBOX_DATAPATH_USER as RawDatapath,
                        timeout_ms: 10_000,
                        store: aggbox_store::AGGBOX_STORE_EXTERNAL as RawStore,
                        ..Default::default()
                    };
                    let mut comm = ptr::null_mut();
                    let status = unsafe { aggbox_comm_init(&config, &mut comm) };
                    assert_eq!(status, aggbox_status::AGGBOX_OK, "rank {rank}: {}", last_error());
                    let status = unsafe { aggbox_barrier(comm) };
                    assert_eq!(status, aggbox_status::AGGBOX_OK, "rank {rank}: {}", last_error());
                    unsafe { aggbox_comm_destroy(comm) };
                })
            })
            .collect();
        for rank in ranks {
            rank.join().unwrap();
        }
        drop(store);
    }
}
