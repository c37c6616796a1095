//! What the C ABI's unit tests share: the last error as a string, and a
//! communicator of loopback ranks made through the C ABI.

use std::{ffi::CStr, ptr};

use crate::{aggbox_comm, aggbox_comm_init, aggbox_config, aggbox_config_init, aggbox_last_error, aggbox_status};

/// This thread's last error message, through `aggbox_last_error`.
pub(crate) fn last_error() -> String {
    let mut buf = [0u8; 512];
    unsafe { aggbox_last_error(buf.as_mut_ptr().cast(), buf.len()) };
    CStr::from_bytes_until_nul(&buf).unwrap().to_str().unwrap().to_string()
}

/// Rank `rank` of `n` loopback ranks whose rendezvous is on `port`, made
/// with `aggbox_comm_init` (each rank on its own thread).
pub(crate) fn loopback_comm(rank: usize, n: usize, port: u16) -> *mut aggbox_comm {
    let mut config = aggbox_config { size: 0, ..Default::default() };
    unsafe { aggbox_config_init(&mut config) };
    config.rank = rank as i32;
    config.world_size = n as i32;
    config.master_port = port;
    config.timeout_ms = 10_000;
    let mut comm = ptr::null_mut();
    assert_eq!(unsafe { aggbox_comm_init(&config, &mut comm) }, aggbox_status::AGGBOX_OK, "{}", last_error());
    comm
}
