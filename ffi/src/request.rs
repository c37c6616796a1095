//! `aggbox_request`: an asynchronous operation in progress (made by
//! `aggbox_ibroadcast` or `aggbox_iallreduce`), to wait for, test and free.

use std::{
    os::raw::c_int,
    sync::{Arc, Condvar, Mutex, PoisonError},
};

use aggbox_core::Result;

use crate::{
    boundary::{set_last_error, status_call, try_ref, try_write},
    types::aggbox_status,
};

/// How an asynchronous operation ended: its status, and the message of its
/// failure (without the name of the call that reports it).
#[derive(Clone, Debug, PartialEq, Eq)]
struct Outcome {
    status: aggbox_status,
    message: String,
}

/// The end of an asynchronous operation, which the progress thread sets
/// once and any thread may wait for.
#[derive(Debug, Default)]
pub(crate) struct Completion {
    outcome: Mutex<Option<Outcome>>,
    done: Condvar,
}

impl Completion {
    fn set(&self, outcome: Outcome) {
        let mut slot = self.outcome.lock().unwrap_or_else(PoisonError::into_inner);
        slot.get_or_insert(outcome);
        self.done.notify_all();
    }

    /// The outcome, waiting for it.
    fn wait(&self) -> Outcome {
        let slot = self.outcome.lock().unwrap_or_else(PoisonError::into_inner);
        let slot = self
            .done
            .wait_while(slot, |o| o.is_none())
            .unwrap_or_else(PoisonError::into_inner);
        slot.clone().expect("waited for it")
    }

    /// The outcome, if the operation has ended.
    fn poll(&self) -> Option<Outcome> {
        self.outcome
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }
}

/// Sets a [`Completion`] once: with the operation's result, or, if dropped
/// without one (the operation panicked), with an internal error.
pub(crate) struct Finisher {
    completion: Arc<Completion>,
    /// The C function that started the operation, for messages.
    func: &'static str,
}

impl Finisher {
    /// A finisher of `completion` for an operation started by `func`.
    pub(crate) fn new(completion: Arc<Completion>, func: &'static str) -> Finisher {
        Finisher { completion, func }
    }

    /// Records how the operation ended.
    pub(crate) fn finish(self, result: Result<()>) {
        let outcome = match result {
            Ok(()) => Outcome {
                status: aggbox_status::AGGBOX_OK,
                message: String::new(),
            },
            Err(e) => Outcome {
                status: e.status().into(),
                message: format!("{}: {e}", self.func),
            },
        };
        self.completion.set(outcome);
    }
}

impl Drop for Finisher {
    fn drop(&mut self) {
        // A no-op after `finish`: the first outcome stays.
        self.completion.set(Outcome {
            status: aggbox_status::AGGBOX_ERR_INTERNAL,
            message: format!(
                "{}: internal error: the operation panicked on the progress thread",
                self.func
            ),
        });
    }
}

/// An asynchronous operation started by `aggbox_ibroadcast` or
/// `aggbox_iallreduce`. Opaque; the
/// caller owns it and frees it with `aggbox_request_free` (which waits for
/// the operation if it has not finished). Until the operation has finished
/// (`aggbox_wait` returned, or `aggbox_test` set `*done` to 1), the buffer
/// it was given belongs to the library. It may be waited for or tested from
/// any thread, and it stays valid after its communicator is destroyed.
pub struct aggbox_request {
    completion: Arc<Completion>,
}

impl aggbox_request {
    /// A request that ends when `completion` is set.
    pub(crate) fn new(completion: Arc<Completion>) -> aggbox_request {
        aggbox_request { completion }
    }
}

/// `outcome` as the status of the call `func`, recording its message.
fn report(func: &str, outcome: &Outcome) -> aggbox_status {
    if outcome.status != aggbox_status::AGGBOX_OK {
        set_last_error(format!("{func}: {}", outcome.message));
    }
    outcome.status
}

/// Blocks until the operation of `request` has finished and returns its
/// status: `AGGBOX_OK`, or the error of the operation, whose message (which
/// names the operation, such as "aggbox_wait: aggbox_ibroadcast: rank 3
/// failed: ...") `aggbox_last_error` then gives on this thread. Waiting
/// again returns the same status. Does not free `request`.
///
/// # Safety
///
/// `request` is NULL or a request not freed yet.
#[no_mangle]
pub unsafe extern "C" fn aggbox_wait(request: *mut aggbox_request) -> aggbox_status {
    let mut outcome = None;
    let status = status_call("aggbox_wait", || {
        // SAFETY: the caller's promise.
        let request = unsafe { try_ref(request.cast_const(), "request") }?;
        outcome = Some(request.completion.wait());
        Ok(())
    });
    match outcome {
        Some(outcome) => report("aggbox_wait", &outcome),
        None => status,
    }
}

/// Tells whether the operation of `request` has finished, without waiting:
/// sets `*done` to 1 and returns the operation's status (as `aggbox_wait`
/// does) when it has, else sets `*done` to 0 and returns `AGGBOX_OK`.
///
/// # Safety
///
/// `request` is NULL or a request not freed yet; `done` is NULL or valid
/// for writing an `int`.
#[no_mangle]
pub unsafe extern "C" fn aggbox_test(
    request: *mut aggbox_request,
    done: *mut c_int,
) -> aggbox_status {
    let mut outcome = None;
    let status = status_call("aggbox_test", || {
        // SAFETY: the caller's promises.
        unsafe { try_write(done, "done", 0) }?;
        let request = unsafe { try_ref(request.cast_const(), "request") }?;
        outcome = request.completion.poll();
        if outcome.is_some() {
            // SAFETY: checked by try_write above.
            unsafe { done.write(1) };
        }
        Ok(())
    });
    match outcome {
        Some(outcome) => report("aggbox_test", &outcome),
        None => status,
    }
}

/// Frees `request`. If its operation has not finished, first waits for it
/// (so that its buffer may be reused as soon as this returns); its status
/// is then lost: call `aggbox_wait` first to know it. NULL is a no-op.
///
/// # Safety
///
/// `request` is NULL or a request from `aggbox_ibroadcast` or
/// `aggbox_iallreduce` not freed yet;
/// it must not be used after this call.
#[no_mangle]
pub unsafe extern "C" fn aggbox_request_free(request: *mut aggbox_request) {
    let _ = status_call("aggbox_request_free", || {
        if request.is_null() {
            return Ok(());
        }
        // SAFETY: the caller's promise: a live request.
        let checked = unsafe { try_ref(request.cast_const(), "request") }?;
        checked.completion.wait();
        // SAFETY: made by `Box::into_raw` in `aggbox_ibroadcast`, not freed
        // yet (the caller's promise).
        drop(unsafe { Box::from_raw(request) });
        Ok(())
    });
}

#[cfg(test)]
mod tests {
    use std::ptr;

    use aggbox_core::Error;

    use super::*;
    use crate::boundary::copy_last_error;

    fn last_error() -> String {
        let mut buf = [0u8; 512];
        let len = copy_last_error(&mut buf);
        String::from_utf8(buf[..len].to_vec()).unwrap()
    }

    #[test]
    fn a_finisher_sets_its_completion_once() {
        let completion = Arc::new(Completion::default());
        assert_eq!(completion.poll(), None);
        Finisher::new(completion.clone(), "aggbox_ibroadcast")
            .finish(Err(Error::Timeout("slow".into())));
        let outcome = completion.wait();
        assert_eq!(outcome.status, aggbox_status::AGGBOX_ERR_TIMEOUT);
        assert_eq!(outcome.message, "aggbox_ibroadcast: timed out: slow");

        let dropped = Arc::new(Completion::default());
        drop(Finisher::new(dropped.clone(), "aggbox_ibroadcast"));
        assert_eq!(
            dropped.wait().status,
            aggbox_status::AGGBOX_ERR_INTERNAL,
            "a panicked operation"
        );
    }

    #[test]
    fn wait_test_and_free() {
        let completion = Arc::new(Completion::default());
        let request = Box::into_raw(Box::new(aggbox_request::new(completion.clone())));
        let mut done = 7;
        unsafe {
            assert_eq!(aggbox_test(request, &mut done), aggbox_status::AGGBOX_OK);
            assert_eq!(done, 0);
            let finisher = Finisher::new(completion, "aggbox_ibroadcast");
            let waiter = std::thread::spawn(move || {
                std::thread::sleep(std::time::Duration::from_millis(20));
                finisher.finish(Err(Error::InvalidArgument("no".into())));
            });
            assert_eq!(
                aggbox_wait(request),
                aggbox_status::AGGBOX_ERR_INVALID_ARGUMENT
            );
            assert_eq!(
                last_error(),
                "aggbox_wait: aggbox_ibroadcast: invalid argument: no"
            );
            assert_eq!(
                aggbox_wait(request),
                aggbox_status::AGGBOX_ERR_INVALID_ARGUMENT,
                "again"
            );
            assert_eq!(
                aggbox_test(request, &mut done),
                aggbox_status::AGGBOX_ERR_INVALID_ARGUMENT
            );
            assert_eq!(done, 1);
            waiter.join().unwrap();
            assert_eq!(
                aggbox_test(request, ptr::null_mut()),
                aggbox_status::AGGBOX_ERR_INVALID_ARGUMENT
            );
            assert_eq!(last_error(), "aggbox_test: invalid argument: done is NULL");
            aggbox_request_free(request);
            assert_eq!(
                aggbox_wait(ptr::null_mut()),
                aggbox_status::AGGBOX_ERR_INVALID_ARGUMENT
            );
            assert_eq!(
                last_error(),
                "aggbox_wait: invalid argument: request is NULL"
            );
            aggbox_request_free(ptr::null_mut());
        }
    }
}
