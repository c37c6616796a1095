//! The few `bpf()` commands key-value reduce's kernel datapath makes
//! itself: opening its pinned maps, making a communicator's kernel table
//! (a hash map whose capacity is the operation's), updating and deleting
//! single elements, and draining a table with
//! `BPF_MAP_LOOKUP_AND_DELETE_BATCH`. aya has no batch operations, and
//! making an inner map of an array of maps at run time needs only the raw
//! command. All of these run at an operation's begin and finish, never per
//! packet.

use std::{
    ffi::CString,
    io,
    os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd},
    path::Path,
};

use crate::{Error, Result};

const BPF_MAP_CREATE: libc::c_long = 0;
const BPF_MAP_UPDATE_ELEM: libc::c_long = 2;
const BPF_MAP_DELETE_ELEM: libc::c_long = 3;
const BPF_OBJ_GET: libc::c_long = 7;
const BPF_MAP_LOOKUP_AND_DELETE_BATCH: libc::c_long = 25;
const BPF_MAP_TYPE_HASH: u32 = 1;
const BPF_MAP_TYPE_ARRAY: u32 = 2;
/// `BPF_F_MMAPABLE | BPF_F_INNER_MAP`: the flags of the array tables (as
/// their template in `ebpf/aggbox_kv.h`: mapped by the process, any size).
pub(crate) const ARRAY_TABLE_FLAGS: u32 = (1 << 10) | (1 << 12);
/// `BPF_F_NO_PREALLOC`: entries are allocated as they are inserted.
pub(crate) const BPF_F_NO_PREALLOC: u32 = 1;

/// `bpf(cmd, attr)` with `attr` as the kernel's union (zero-padded).
fn bpf(cmd: libc::c_long, attr: &mut [u64; 16]) -> io::Result<libc::c_long> {
    // SAFETY: attr is a zeroed 128-byte buffer laid out as the command's
    // part of union bpf_attr; the pointers in it point at live memory of
    // the caller.
    let rc = unsafe { libc::syscall(libc::SYS_bpf, cmd, attr.as_mut_ptr(), std::mem::size_of_val(attr)) };
    if rc < 0 {
        Err(io::Error::last_os_error())
    } else {
        Ok(rc)
    }
}

fn fd(rc: libc::c_long) -> OwnedFd {
    // SAFETY: a new file descriptor the kernel just returned to us.
    unsafe { OwnedFd::from_raw_fd(rc as RawFd) }
}

/// Opens the map pinned at `path`.
pub(crate) fn open_pinned(path: &Path) -> Result<OwnedFd> {
    let c = CString::new(path.as_os_str().as_encoded_bytes())
        .map_err(|_| Error::Internal(format!("{} holds a NUL", path.display())))?;
    let mut attr = [0u64; 16];
    attr[0] = c.as_ptr() as u64;
    bpf(BPF_OBJ_GET, &mut attr).map(fd).map_err(|e| Error::system(format!("opening pinned map {}", path.display()), e))
}

/// Makes a hash map of `max_entries` entries of `key_size`-byte keys and
/// `value_size`-byte values.
pub(crate) fn create_hash(name: &str, key_size: u32, value_size: u32, max_entries: u32, flags: u32) -> Result<OwnedFd> {
    create(BPF_MAP_TYPE_HASH, name, key_size, value_size, max_entries, flags)
}

/// Makes an array of `max_entries` `value_size`-byte values (u32 keys).
pub(crate) fn create_array(name: &str, value_size: u32, max_entries: u32, flags: u32) -> Result<OwnedFd> {
    create(BPF_MAP_TYPE_ARRAY, name, 4, value_size, max_entries, flags)
}

fn create(map_type: u32, name: &str, key_size: u32, value_size: u32, max_entries: u32, flags: u32) -> Result<OwnedFd> {
    let mut attr = [0u64; 16];
    attr[0] = u64::from(map_type) | u64::from(key_size) << 32;
    attr[1] = u64::from(value_size) | u64::from(max_entries) << 32;
    attr[2] = u64::from(flags); // map_flags; inner_map_fd 0
    // map_name at byte 28: the upper half of attr[3] and attr[4..6].
    let mut bytes = [0u8; 16];
    for (dst, src) in bytes.iter_mut().zip(name.bytes().take(15)) {
        *dst = src;
    }
    let mut raw = [0u8; 128];
    for (i, word) in attr.iter().enumerate() {
        raw[i * 8..i * 8 + 8].copy_from_slice(&word.to_ne_bytes());
    }
    raw[28..44].copy_from_slice(&bytes);
    for (i, word) in attr.iter_mut().enumerate() {
        *word = u64::from_ne_bytes(raw[i * 8..i * 8 + 8].try_into().expect("8 bytes"));
    }
    bpf(BPF_MAP_CREATE, &mut attr)
        .map(fd)
        .map_err(|e| Error::system(format!("creating the {max_entries}-entry kernel table {name}"), e))
}

/// Sets `key` to `value` in map `map`.
pub(crate) fn update<K, V>(map: &OwnedFd, key: &K, value: &V, what: &str) -> Result<()> {
    let mut attr = [0u64; 16];
    attr[0] = map.as_raw_fd() as u64;
    attr[1] = key as *const K as u64;
    attr[2] = value as *const V as u64;
    bpf(BPF_MAP_UPDATE_ELEM, &mut attr).map(drop).map_err(|e| Error::system(what.to_string(), e))
}

/// Deletes `key` from map `map` (an absent key is not an error).
pub(crate) fn delete<K>(map: &OwnedFd, key: &K, what: &str) -> Result<()> {
    let mut attr = [0u64; 16];
    attr[0] = map.as_raw_fd() as u64;
    attr[1] = key as *const K as u64;
    match bpf(BPF_MAP_DELETE_ELEM, &mut attr) {
        Ok(_) => Ok(()),
        Err(e) if e.raw_os_error() == Some(libc::ENOENT) => Ok(()),
        Err(e) => Err(Error::system(what.to_string(), e)),
    }
}

/// Takes every entry out of hash map `map` (keys of `key_size` bytes, u64
/// values) in batches of `batch` with `BPF_MAP_LOOKUP_AND_DELETE_BATCH`,
/// calling `each(key, value)` for each.
pub(crate) fn drain(map: &OwnedFd, key_size: usize, batch: usize, mut each: impl FnMut(&[u8], u64)) -> Result<()> {
    let mut keys = vec![0u8; key_size * batch];
    let mut values = vec![0u64; batch];
    let (mut token_in, mut token_out) = (0u64, 0u64);
    let mut first = true;
    loop {
        let mut attr = [0u64; 16];
        attr[0] = if first { 0 } else { &mut token_in as *mut u64 as u64 };
        attr[1] = &mut token_out as *mut u64 as u64;
        attr[2] = keys.as_mut_ptr() as u64;
        attr[3] = values.as_mut_ptr() as u64;
        attr[4] = batch as u64 | (map.as_raw_fd() as u64) << 32;
        let result = bpf(BPF_MAP_LOOKUP_AND_DELETE_BATCH, &mut attr);
        let count = (attr[4] & 0xffff_ffff) as usize;
        for i in 0..count.min(batch) {
            each(&keys[i * key_size..(i + 1) * key_size], values[i]);
        }
        match result {
            Ok(_) => {}
            Err(e) if e.raw_os_error() == Some(libc::ENOENT) => return Ok(()),
            Err(e) => return Err(Error::system("draining the kernel table (BPF_MAP_LOOKUP_AND_DELETE_BATCH)", e)),
        }
        token_in = token_out;
        first = false;
    }
}

const BPF_MAP_LOOKUP_ELEM: libc::c_long = 1;

/// Reads `key`'s value of map `map` into `value`.
pub(crate) fn lookup<K, V>(map: &OwnedFd, key: &K, value: &mut V, what: &str) -> Result<()> {
    let mut attr = [0u64; 16];
    attr[0] = map.as_raw_fd() as u64;
    attr[1] = key as *const K as u64;
    attr[2] = value as *mut V as u64;
    bpf(BPF_MAP_LOOKUP_ELEM, &mut attr).map(drop).map_err(|e| Error::system(what.to_string(), e))
}
