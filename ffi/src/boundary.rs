//! The rules every export follows, in one place: the panic boundary, the
//! thread-local last error, and the checks on pointer arguments.
//!
//! An export is written as
//!
//! ```text
//! #[no_mangle]
//! pub unsafe extern "C" fn aggbox_thing(comm: *mut aggbox_comm) -> aggbox_status {
//!     status_call("aggbox_thing", || {
//!         let comm = unsafe { try_ref(comm, "comm") }?;
//!         comm.lock()?.do_thing()
//!     })
//! }
//! ```
//!
//! The body returns a core [`Error`] for a failure; [`call`] turns it (or a
//! panic) into the caller's status and records "`aggbox_thing`: what went
//! wrong" as this thread's last error. Nothing unwinds into C.

use std::{
    any::Any,
    cell::RefCell,
    panic::{catch_unwind, AssertUnwindSafe},
    sync::{Mutex, MutexGuard, TryLockError},
};

use aggbox_core::{Error, Result};

use crate::types::aggbox_status;

thread_local! {
    /// The message of the last failed call on this thread ("" before any).
    static LAST_ERROR: RefCell<String> = const { RefCell::new(String::new()) };
}

/// `text` made fit for a C string: a NUL inside it would cut it short in C,
/// so it is written as `\0`.
pub(crate) fn c_text(text: impl Into<String>) -> String {
    let text = text.into();
    if text.contains('\0') {
        text.replace('\0', "\\0")
    } else {
        text
    }
}

/// Copies `text` into `buf` as a NUL-terminated string, truncated to fit
/// (nothing is written into an empty `buf`), and returns the length of the
/// whole text without its NUL, as `snprintf` does. `text` holds no NUL (see
/// [`c_text`]).
pub(crate) fn copy_c_string(text: &str, buf: &mut [u8]) -> usize {
    let bytes = text.as_bytes();
    if let Some(room) = buf.len().checked_sub(1) {
        let n = bytes.len().min(room);
        buf[..n].copy_from_slice(&bytes[..n]);
        buf[n] = 0;
    }
    bytes.len()
}

/// Records `message` as this thread's last error (through [`c_text`]).
///
/// This runs outside `catch_unwind` (it reports what the body did), so it
/// must not panic: while the thread is exiting, from a thread-local
/// destructor (a C++ `thread_local` whose destructor calls
/// `aggbox_comm_destroy`, say), [`LAST_ERROR`] may already be gone, and
/// the message is then dropped instead.
pub(crate) fn set_last_error(message: impl Into<String>) {
    let message = c_text(message);
    // Ignored: the thread-local was destroyed (thread exit), or it is
    // borrowed, which nothing here does while calling this.
    let _ = LAST_ERROR.try_with(|last| {
        if let Ok(mut last) = last.try_borrow_mut() {
            *last = message;
        }
    });
}

/// Copies this thread's last error to the `len` bytes at `buf` as
/// [`copy_c_string`] does, and returns its whole length. It writes at most
/// the message and its NUL, so a `len` bigger than the buffer the message
/// needs is no error, whatever its size; with `buf` NULL or `len` 0 it
/// writes nothing. While the thread is exiting (see [`set_last_error`])
/// the message may be gone: it is then "".
///
/// # Safety
///
/// `buf` is NULL or valid for writing `len` bytes.
pub(crate) unsafe fn copy_last_error_to(buf: *mut u8, len: usize) -> usize {
    let copy = |text: &str| {
        // The message and its NUL are at most `isize::MAX` bytes (a
        // `String`), so this slice is one Rust allows, whatever `len` is.
        let len = len.min(text.len() + 1);
        if buf.is_null() || len == 0 {
            return copy_c_string(text, &mut []);
        }
        // SAFETY: not NULL; `len` bytes, no more than the caller's, are
        // writable (its promise); bytes need no alignment.
        copy_c_string(text, unsafe { std::slice::from_raw_parts_mut(buf, len) })
    };
    LAST_ERROR
        .try_with(|last| match last.try_borrow() {
            Ok(last) => copy(&last),
            Err(_) => copy(""),
        })
        .unwrap_or_else(|_| copy(""))
}

/// Whether this thread's last error is gone (the thread is exiting and
/// destroyed it), for tests of calls made from thread-local destructors.
#[cfg(test)]
pub(crate) fn last_error_is_gone() -> bool {
    LAST_ERROR.try_with(|_| ()).is_err()
}

/// [`copy_last_error_to`] into a Rust buffer.
#[cfg(test)]
pub(crate) fn copy_last_error(buf: &mut [u8]) -> usize {
    // SAFETY: `buf` is writable.
    unsafe { copy_last_error_to(buf.as_mut_ptr(), buf.len()) }
}

/// The text of a panic payload (`panic!` gives a `&str` or a `String`).
fn panic_message(payload: &(dyn Any + Send)) -> &str {
    if let Some(s) = payload.downcast_ref::<&str>() {
        s
    } else if let Some(s) = payload.downcast_ref::<String>() {
        s
    } else {
        "(no message)"
    }
}

/// Runs the body of the export named `func` inside `catch_unwind`.
///
/// An `Err` from the body is recorded as the last error, prefixed with
/// `func`, and returned as its status; a panic becomes
/// [`aggbox_status::AGGBOX_ERR_INTERNAL`] with the panic message.
pub(crate) fn call<T>(func: &str, body: impl FnOnce() -> Result<T>) -> Result<T, aggbox_status> {
    // AssertUnwindSafe: after a panic no state the body touched is used
    // again, except a communicator's mutex, whose poisoning
    // `lock_exclusive` turns into an error.
    match catch_unwind(AssertUnwindSafe(body)) {
        Ok(Ok(value)) => Ok(value),
        Ok(Err(error)) => {
            set_last_error(format!("{func}: {error}"));
            Err(error.status().into())
        }
        Err(payload) => {
            let message = panic_message(&*payload);
            set_last_error(format!("{func}: internal error: panicked: {message}"));
            Err(aggbox_status::AGGBOX_ERR_INTERNAL)
        }
    }
}

/// [`call`] for an export that returns an `aggbox_status`.
pub(crate) fn status_call(func: &str, body: impl FnOnce() -> Result<()>) -> aggbox_status {
    match call(func, body) {
        Ok(()) => aggbox_status::AGGBOX_OK,
        Err(status) => status,
    }
}

/// [`call`] for an export that returns a value, `on_error` when it fails
/// (the last error says why).
pub(crate) fn value_call<T>(func: &str, on_error: T, body: impl FnOnce() -> Result<T>) -> T {
    call(func, body).unwrap_or(on_error)
}

/// An [`Error::InvalidArgument`] with `message`.
pub(crate) fn invalid(message: impl Into<String>) -> Error {
    Error::InvalidArgument(message.into())
}

/// Checks that `ptr`, the argument called `name`, is not NULL and is aligned
/// for `T`.
pub(crate) fn check_ptr<T>(ptr: *const T, name: &str) -> Result<()> {
    if ptr.is_null() {
        Err(invalid(format!("{name} is NULL")))
    } else if !ptr.is_aligned() {
        Err(invalid(format!(
            "{name} ({ptr:p}) is not aligned to {} bytes",
            std::mem::align_of::<T>()
        )))
    } else {
        Ok(())
    }
}

/// The `T` that `ptr` (the argument called `name`) points to.
///
/// # Safety
///
/// If `ptr` is not NULL it must point to a valid `T` that nothing mutates
/// while the reference lives.
pub(crate) unsafe fn try_ref<'a, T>(ptr: *const T, name: &str) -> Result<&'a T> {
    check_ptr(ptr, name)?;
    // SAFETY: not NULL and aligned (checked), valid (the caller's promise).
    Ok(unsafe { &*ptr })
}

/// Writes `value` to the output argument `ptr`, called `name`.
///
/// # Safety
///
/// If `ptr` is not NULL it must be valid for writing a `T`.
pub(crate) unsafe fn try_write<T>(ptr: *mut T, name: &str, value: T) -> Result<()> {
    check_ptr(ptr.cast_const(), name)?;
    // SAFETY: not NULL and aligned (checked), writable (the caller's promise).
    unsafe { ptr.write(value) };
    Ok(())
}

/// The `len` bytes at `ptr`, the buffer called `name`; `None` when there is
/// nothing to write into (`ptr` NULL or `len` 0).
///
/// # Safety
///
/// If `ptr` is not NULL it must be valid for writing `len` bytes.
pub(crate) unsafe fn try_out_buf<'a>(
    ptr: *mut u8,
    len: usize,
    name: &str,
) -> Result<Option<&'a mut [u8]>> {
    if ptr.is_null() || len == 0 {
        return Ok(None);
    }
    if len > isize::MAX as usize {
        return Err(invalid(format!(
            "{name} length {len} is larger than any buffer"
        )));
    }
    // SAFETY: not NULL, `len` writable bytes (the caller's promise); bytes
    // have no alignment or validity requirement.
    Ok(Some(unsafe { std::slice::from_raw_parts_mut(ptr, len) }))
}

/// Reads the leading `size_t size` field of a size-versioned struct and
/// checks it against what this library knows: at least `min` (the smallest
/// version ever published), at most `size_of::<T>()`.
///
/// # Safety
///
/// If `ptr` is not NULL it must be valid for reading a `usize`.
pub(crate) unsafe fn sized_struct_size<T>(
    ptr: *const T,
    name: &str,
    type_name: &str,
    min: usize,
) -> Result<usize> {
    check_ptr(ptr, name)?;
    // SAFETY: not NULL and aligned for `T`, whose first field is a `usize`;
    // the caller's struct holds at least that field.
    let size = unsafe { ptr.cast::<usize>().read() };
    let known = std::mem::size_of::<T>();
    if size < min {
        Err(invalid(format!(
            "{name}->size is {size}, smaller than any {type_name} ({min} bytes at least): \
             set it to sizeof({type_name})"
        )))
    } else if size > known {
        Err(invalid(format!(
            "{name}->size is {size}, bigger than the {type_name} of this libaggbox ({known} bytes): \
             the program was built against a newer aggbox.h than the library it runs with"
        )))
    } else {
        Ok(size)
    }
}

/// Locks a communicator's mutex for one call, failing instead of waiting
/// when another thread is inside a call on it.
pub(crate) fn lock_exclusive<T>(mutex: &Mutex<T>) -> Result<MutexGuard<'_, T>> {
    match mutex.try_lock() {
        Ok(guard) => Ok(guard),
        Err(TryLockError::WouldBlock) => Err(invalid(
            "the communicator is in use by another thread: a communicator may be used \
             from any thread, but by one thread at a time",
        )),
        Err(TryLockError::Poisoned(_)) => Err(Error::Internal(
            "an earlier call on this communicator failed with an internal error; \
             it is unusable: destroy it"
                .into(),
        )),
    }
}

#[cfg(test)]
mod tests {
    use std::ptr;

    use super::*;

    fn last_error() -> String {
        let mut buf = vec![0u8; copy_last_error(&mut []) + 1];
        copy_last_error(&mut buf);
        buf.pop();
        String::from_utf8(buf).unwrap()
    }

    #[test]
    fn errors_become_status_and_last_error() {
        let status = status_call("aggbox_test", || {
            Err(Error::Timeout("barrier after 5 ms".into()))
        });
        assert_eq!(status, aggbox_status::AGGBOX_ERR_TIMEOUT);
        assert_eq!(last_error(), "aggbox_test: timed out: barrier after 5 ms");

        // Success keeps the message of the last failure.
        assert_eq!(
            status_call("aggbox_other", || Ok(())),
            aggbox_status::AGGBOX_OK
        );
        assert_eq!(last_error(), "aggbox_test: timed out: barrier after 5 ms");

        assert_eq!(value_call("aggbox_value", -1, || Ok(7)), 7);
        assert_eq!(
            value_call("aggbox_value", -1, || Err(invalid("comm is NULL"))),
            -1
        );
        assert_eq!(last_error(), "aggbox_value: invalid argument: comm is NULL");
    }

    #[test]
    fn panics_become_internal_errors() {
        let status = status_call("aggbox_boom", || panic!("bad {}", "state"));
        assert_eq!(status, aggbox_status::AGGBOX_ERR_INTERNAL);
        assert_eq!(
            last_error(),
            "aggbox_boom: internal error: panicked: bad state"
        );

        let status = status_call("aggbox_boom", || std::panic::panic_any(42));
        assert_eq!(status, aggbox_status::AGGBOX_ERR_INTERNAL);
        assert_eq!(
            last_error(),
            "aggbox_boom: internal error: panicked: (no message)"
        );
    }

    #[test]
    fn last_error_is_per_thread() {
        set_last_error("main thread's");
        std::thread::spawn(|| {
            assert_eq!(last_error(), "");
            set_last_error("other thread's");
        })
        .join()
        .unwrap();
        assert_eq!(last_error(), "main thread's");
    }

    #[test]
    fn last_error_copy_truncates_like_snprintf() {
        set_last_error("0123456789");
        let mut buf = [0xffu8; 4];
        assert_eq!(copy_last_error(&mut buf), 10);
        assert_eq!(&buf, b"012\0");
        let mut one = [0xffu8; 1];
        assert_eq!(copy_last_error(&mut one), 10);
        assert_eq!(one, [0]);
        assert_eq!(copy_last_error(&mut []), 10);
        let mut big = [0xffu8; 16];
        assert_eq!(copy_last_error(&mut big), 10);
        assert_eq!(&big[..11], b"0123456789\0");
        assert_eq!(big[11], 0xff, "nothing written past the NUL");

        set_last_error("a\0b");
        assert_eq!(last_error(), "a\\0b");
    }

    #[test]
    fn c_strings_copy_truncate_like_snprintf() {
        assert_eq!(c_text("no NUL"), "no NUL");
        assert_eq!(c_text("x\0y\0"), "x\\0y\\0");

        let mut buf = [0xffu8; 4];
        assert_eq!(copy_c_string("", &mut buf), 0);
        assert_eq!(buf, [0, 0xff, 0xff, 0xff], "an empty string is one NUL");
        assert_eq!(copy_c_string("abcdef", &mut buf), 6);
        assert_eq!(&buf, b"abc\0");
        assert_eq!(copy_c_string("abc", &mut buf), 3);
        assert_eq!(&buf, b"abc\0", "exactly fits with its NUL");
        assert_eq!(copy_c_string("abcdef", &mut []), 6);
    }

    #[test]
    fn pointer_checks() {
        let value = 5u64;
        assert_eq!(*unsafe { try_ref(&value, "value") }.unwrap(), 5);
        let null = unsafe { try_ref(ptr::null::<u64>(), "comm") }.unwrap_err();
        assert_eq!(null.to_string(), "invalid argument: comm is NULL");
        let words = [0u64; 2];
        let misaligned = words.as_ptr().cast::<u8>().wrapping_add(1).cast::<u64>();
        let err = check_ptr(misaligned, "stats").unwrap_err();
        assert!(
            err.to_string().contains("stats (0x") && err.to_string().contains("not aligned to 8"),
            "{err}"
        );

        let mut out = 0u32;
        unsafe { try_write(&mut out, "out", 9) }.unwrap();
        assert_eq!(out, 9);
        let err = unsafe { try_write(ptr::null_mut::<u32>(), "out", 9) }.unwrap_err();
        assert_eq!(err.to_string(), "invalid argument: out is NULL");

        let mut buf = [0u8; 3];
        assert_eq!(
            unsafe { try_out_buf(buf.as_mut_ptr(), 3, "buf") }
                .unwrap()
                .unwrap()
                .len(),
            3
        );
        assert!(unsafe { try_out_buf(ptr::null_mut(), 3, "buf") }
            .unwrap()
            .is_none());
        assert!(unsafe { try_out_buf(buf.as_mut_ptr(), 0, "buf") }
            .unwrap()
            .is_none());
        let err = unsafe { try_out_buf(buf.as_mut_ptr(), usize::MAX, "buf") }.unwrap_err();
        assert!(err.to_string().contains("buf length"), "{err}");
    }

    #[test]
    fn sized_struct_checks() {
        #[repr(C)]
        struct Versioned {
            size: usize,
            a: u64,
            b: u64,
        }
        let check = |size| {
            let v = Versioned { size, a: 0, b: 0 };
            unsafe { sized_struct_size(&v, "v", "versioned", 16) }
        };
        assert_eq!(check(24).unwrap(), 24);
        assert_eq!(check(16).unwrap(), 16);
        let small = check(8).unwrap_err().to_string();
        assert!(
            small.contains("v->size is 8, smaller than any versioned (16 bytes"),
            "{small}"
        );
        let big = check(32).unwrap_err().to_string();
        assert!(
            big.contains("v->size is 32, bigger than the versioned of this libaggbox (24"),
            "{big}"
        );
        assert!(big.contains("newer aggbox.h"), "{big}");
    }

    #[test]
    fn a_busy_or_poisoned_mutex_is_an_error() {
        let mutex = Mutex::new(1);
        {
            let _held = lock_exclusive(&mutex).unwrap();
            let busy = lock_exclusive(&mutex).unwrap_err();
            assert_eq!(busy.status(), aggbox_core::Status::InvalidArgument);
            assert!(
                busy.to_string().contains("in use by another thread"),
                "{busy}"
            );
        }
        std::thread::scope(|s| {
            let held = lock_exclusive(&mutex).unwrap();
            s.spawn(|| {
                let busy = lock_exclusive(&mutex).unwrap_err();
                assert!(
                    busy.to_string().contains("by one thread at a time"),
                    "{busy}"
                );
            })
            .join()
            .unwrap();
            drop(held);
        });
        assert_eq!(*lock_exclusive(&mutex).unwrap(), 1);

        let status = status_call("aggbox_barrier", || {
            let _guard = lock_exclusive(&mutex)?;
            panic!("in the middle of a barrier");
        });
        assert_eq!(status, aggbox_status::AGGBOX_ERR_INTERNAL);
        let poisoned = lock_exclusive(&mutex).unwrap_err();
        assert_eq!(poisoned.status(), aggbox_core::Status::Internal);
        assert!(poisoned.to_string().contains("destroy it"), "{poisoned}");
    }
}
