//! The C ABI of AggBox: `libaggbox.so` / `libaggbox.a`, declared by
//! `include/aggbox.h`, which cbindgen generates from this crate (the doc
//! comments here become the header's; `scripts/gen-header.sh` regenerates it
//! and `tests/header.rs` fails when it is stale).
//!
//! Rules every export follows (the header states them for C callers):
//! - **Errors**: a call that can fail returns an [`aggbox_status`]; on
//!   failure it records a message saying what failed and where, which
//!   [`aggbox_last_error`] returns on the same thread. A panic never crosses
//!   the boundary: it becomes `AGGBOX_ERR_INTERNAL` with the panic message.
//!   Recording the message cannot panic either, even while the thread exits
//!   (its thread-locals destroyed, when the call comes from a thread-local
//!   destructor): the message is then dropped. `src/boundary.rs` holds the
//!   one helper all exports go through.
//! - **Arguments**: every pointer is checked for NULL (and alignment), every
//!   length and struct `size` against what this library knows; a C enum is
//!   taken as its integer and checked, never as a Rust enum.
//! - **Ownership**: what `aggbox_*_init` returns is freed by the matching
//!   `_destroy`, a request of `aggbox_ibroadcast` by `aggbox_request_free`;
//!   the library keeps no caller pointer after a call returns, except the
//!   buffer of an asynchronous operation, until that operation finishes.
//! - **Threads**: a communicator may be used from any thread, one thread at a
//!   time; a second thread calling while a call is in progress gets
//!   `AGGBOX_ERR_INVALID_ARGUMENT`, not undefined behaviour. The exception
//!   is [`aggbox_comm_destroy`], which frees the handle: racing it with
//!   another call on the same communicator is a caller bug, which the
//!   library makes an error where it can (see there), but a call that
//!   reaches the handle once it is freed is a use after free.
//! - **Asynchronous operations** run on one progress thread per
//!   communicator (`src/progress.rs`), started by the first of them, in
//!   the order they were started; a blocking call made while any is pending
//!   queues behind them (collectives run in the same order on every rank),
//!   and destroying the communicator waits for them.

#![warn(missing_docs)]
#![deny(unsafe_op_in_unsafe_fn)]
#![allow(non_camel_case_types)]

use std::{ffi::CStr, os::raw::c_char};

// cbindgen writes the exports in this order: those of this file, then
// each module's.
pub mod agree;
mod boundary;
pub mod comm;
pub mod config;
pub mod error;
pub mod kv;
mod progress;
pub mod request;
pub mod stats;
#[cfg(test)]
mod testing;
pub mod types;

pub use agree::*;
pub use comm::*;
pub use config::*;
pub use error::*;
pub use kv::*;
pub use request::*;
pub use stats::*;
pub use types::*;

use boundary::value_call;

/// The version of the C ABI this header describes. Compare it with
/// `aggbox_abi_version()` to check that the library a program runs with is
/// the one it was built for. It changes only when a change would break
/// programs built against an older header; additions (new functions, fields
/// appended to size-versioned structs) keep it.
pub const AGGBOX_ABI_VERSION: u32 = 1;

/// The library version as a C string.
const VERSION: &CStr =
    match CStr::from_bytes_with_nul(concat!(env!("CARGO_PKG_VERSION"), "\0").as_bytes()) {
        Ok(version) => version,
        Err(_) => panic!("the package version is not a C string"),
    };

/// The version of the library, such as "0.1.0": a static NUL-terminated
/// string; do not free it.
#[no_mangle]
pub extern "C" fn aggbox_version() -> *const c_char {
    value_call("aggbox_version", VERSION.as_ptr(), || Ok(VERSION.as_ptr()))
}

/// The ABI version of the library, to compare with `AGGBOX_ABI_VERSION`.
#[no_mangle]
pub extern "C" fn aggbox_abi_version() -> u32 {
    value_call("aggbox_abi_version", AGGBOX_ABI_VERSION, || {
        Ok(AGGBOX_ABI_VERSION)
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn c_str(ptr: *const c_char) -> &'static str {
        assert!(!ptr.is_null());
        unsafe { CStr::from_ptr(ptr) }.to_str().unwrap()
    }

    #[test]
    fn versions() {
        assert_eq!(c_str(aggbox_version()), aggbox_core::VERSION);
        assert_eq!(aggbox_abi_version(), AGGBOX_ABI_VERSION);
    }
}
