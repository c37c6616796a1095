//! Status strings and the last error message, for C callers.

use std::os::raw::c_char;

use crate::{
    boundary::{copy_last_error, try_out_buf, value_call},
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
/// the length. Calls that succeed leave the message as it was.
///
/// # Safety
///
/// `buf` is NULL or valid for writing `len` bytes.
#[no_mangle]
pub unsafe extern "C" fn aggbox_last_error(buf: *mut c_char, len: usize) -> usize {
    value_call("aggbox_last_error", 0, || {
        // SAFETY: the caller's promise.
        let buf = unsafe { try_out_buf(buf.cast::<u8>(), len, "buf") }?;
        Ok(copy_last_error(buf.unwrap_or_default()))
    })
}

#[cfg(test)]
mod tests {
    use std::{ffi::CStr, ptr};

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
}
