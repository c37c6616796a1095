//! Status strings and the last error message, for C callers.

use std::os::raw::c_char;

use crate::{
    boundary::{copy_last_error_to, value_call},
    types::{aggbox_status, RawStatus},
};

/// A static, NUL-terminated description of `status` ("success", "timed
/// out", ...); "unknown status" for a value that is not an `aggbox_status`.
/// Never NULL; do not free it.
#[no_mangle]
pub extern "C" fn aggbox_status_string(status: RawStatus) -> *const c_char {
    value_call("aggbox_status_string", c"unknown status".as_ptr(), || {
        Ok(aggbox_status::from_raw(status)
            .map_or(c"unknown status", aggbox_status::description)
            .as_ptr())
    })
}

/// Copies the message of the last failed call on this thread ("" if none has
/// failed) into `buf` as a NUL-terminated string, truncated to `len` bytes
/// with the NUL, and returns the length of the whole message without the
/// NUL, as `snprintf` does: a return value of `len` or more means it was
/// truncated. With `buf` NULL or `len` 0 it writes nothing and only returns
/// the length. It never writes more than the message and its NUL, so no
/// `len` is an error, not even one larger than any object (such as
/// `SIZE_MAX`). This call never fails, so it never changes the message;
/// nor do calls that succeed. While the thread is exiting (in a
/// thread-local destructor, say) the message may no longer be kept: calls
/// still return their status, but this may then give "".
///
/// # Safety
///
/// `buf` is NULL or valid for writing `len` bytes.
#[no_mangle]
pub unsafe extern "C" fn aggbox_last_error(buf: *mut c_char, len: usize) -> usize {
    value_call("aggbox_last_error", 0, || {
        // SAFETY: the caller's promise. Not `try_out_buf`, which would make
        // a huge `len` an error and so replace the message asked for.
        Ok(unsafe { copy_last_error_to(buf.cast::<u8>(), len) })
    })
}

#[cfg(test)]
mod tests {
    use std::{cell::RefCell, ffi::CStr, ptr, sync::mpsc};

    use super::*;
    use crate::boundary;

    fn c_str(ptr: *const c_char) -> &'static str {
        assert!(!ptr.is_null());
        unsafe { CStr::from_ptr(ptr) }.to_str().unwrap()
    }

    #[test]
    fn status_strings() {
        assert_eq!(c_str(aggbox_status_string(0)), "success");
        assert_eq!(c_str(aggbox_status_string(3)), "a peer failed");
        assert_eq!(c_str(aggbox_status_string(6)), "internal error");
        assert_eq!(c_str(aggbox_status_string(7)), "unknown status");
        assert_eq!(c_str(aggbox_status_string(-1)), "unknown status");
    }

    #[test]
    fn last_error_export() {
        boundary::set_last_error("aggbox_barrier: timed out: barrier");
        let full = "aggbox_barrier: timed out: barrier";
        unsafe {
            assert_eq!(aggbox_last_error(ptr::null_mut(), 0), full.len());
            assert_eq!(aggbox_last_error(ptr::null_mut(), 100), full.len());
            let mut buf = [1 as c_char; 8];
            assert_eq!(aggbox_last_error(buf.as_mut_ptr(), 0), full.len());
            assert_eq!(buf[0], 1, "len 0 writes nothing");
            assert_eq!(aggbox_last_error(buf.as_mut_ptr(), buf.len()), full.len());
            assert_eq!(c_str(buf.as_ptr()), "aggbox_");
            let mut big = [1 as c_char; 64];
            assert_eq!(aggbox_last_error(big.as_mut_ptr(), big.len()), full.len());
            assert_eq!(c_str(big.as_ptr()), full);
        }
    }

    /// A `len` larger than any buffer (`(size_t)-1` from C, say) is no
    /// error: the message is copied, at most itself and its NUL are
    /// written, and it stays the last error.
    #[test]
    fn a_huge_len_keeps_the_message() {
        let full = "aggbox_barrier: timed out: barrier";
        boundary::set_last_error(full);
        for len in [isize::MAX as usize, isize::MAX as usize + 1, usize::MAX] {
            let mut buf = [1 as c_char; 64];
            unsafe {
                assert_eq!(aggbox_last_error(ptr::null_mut(), len), full.len());
                assert_eq!(aggbox_last_error(buf.as_mut_ptr(), len), full.len());
            }
            assert_eq!(c_str(buf.as_ptr()), full);
            assert_eq!(buf[full.len() + 1], 1, "nothing written past the NUL");
            // Still the message, not one about `len`.
            let mut again = [0 as c_char; 64];
            let got = unsafe { aggbox_last_error(again.as_mut_ptr(), again.len()) };
            assert_eq!(got, full.len());
            assert_eq!(c_str(again.as_ptr()), full);
        }
    }

    /// Calls made while a thread exits, from a thread-local destructor
    /// that runs after the last error's own (as a C++ `thread_local`
    /// holding a communicator would), report their status without
    /// panicking; the message is gone.
    #[test]
    fn calls_from_a_thread_local_destructor_do_not_panic() {
        type Seen = (bool, aggbox_status, usize, c_char);
        struct OnExit(mpsc::Sender<Seen>);
        impl Drop for OnExit {
            fn drop(&mut self) {
                let gone = boundary::last_error_is_gone();
                // Misaligned: an error, recorded into a destroyed thread-local.
                let words = [0u64; 2];
                let misaligned = words.as_ptr().cast::<u8>().wrapping_add(1);
                unsafe { crate::aggbox_comm_destroy(misaligned.cast_mut().cast()) };
                let status = unsafe { crate::aggbox_barrier(ptr::null_mut()) };
                let mut buf = [b'x' as c_char; 8];
                let len = unsafe { aggbox_last_error(buf.as_mut_ptr(), buf.len()) };
                let _ = self.0.send((gone, status, len, buf[0]));
            }
        }
        thread_local! {
            static ON_EXIT: RefCell<Option<OnExit>> = const { RefCell::new(None) };
        }

        let (sender, seen) = mpsc::channel();
        std::thread::spawn(move || {
            // Set up first, so destroyed after the last error (thread-local
            // destructors run in the reverse order of their first use).
            ON_EXIT.with_borrow_mut(|on_exit| *on_exit = Some(OnExit(sender)));
            boundary::set_last_error("before the thread exits");
        })
        .join()
        .unwrap();
        let (gone, status, len, first) = seen.recv().expect("the destructor ran");
        assert!(gone, "the last error was not destroyed yet: the test tests nothing");
        assert_eq!(status, aggbox_status::AGGBOX_ERR_INVALID_ARGUMENT);
        assert_eq!((len, first), (0, 0), "no message: an empty string");
    }
}
