//! `aggbox_kv_*`: key-value reduce (docs/KV.md), the collective a MapReduce
//! shuffle with a reduce-by-key becomes: `aggbox_kv_begin`, any number of
//! `aggbox_kv_emit`, then `aggbox_kv_finish`, which returns the reduced
//! pairs of the keys this rank owns in an `aggbox_kv_result`.
//!
//! An `aggbox_kv` names its communicator; each call runs on it as the other
//! blocking collectives do (behind pending asynchronous operations).

use std::{
    mem::{offset_of, size_of},
    os::raw::c_void,
    ptr,
};

use aggbox_core::{
    kv::{KvConfig, KvResult},
    Dtype, Error, ReduceOp, Result,
};

use crate::{
    boundary::{check_ptr, invalid, sized_struct_size, status_call, try_ref, try_write, value_call},
    comm::{aggbox_comm, CommRef},
    types::{aggbox_dtype, aggbox_status, RawDtype, RawOp},
};

/// The smallest key maximum `aggbox_kv_config.key_max` may set.
pub const AGGBOX_KV_KEY_MAX_MIN: u32 = aggbox_core::kv::KEY_MAX_MIN as u32;
/// The largest key maximum `aggbox_kv_config.key_max` may set.
pub const AGGBOX_KV_KEY_MAX_LIMIT: u32 = aggbox_core::kv::KEY_MAX_LIMIT as u32;

/// What a key-value reduce does; the same on every rank. Size-versioned:
/// fill it in with `aggbox_kv_config_init`, which sets `size` and every
/// default, then change the fields you need.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct aggbox_kv_config {
    /// `sizeof(aggbox_kv_config)` as the program was compiled; set by
    /// `aggbox_kv_config_init`.
    pub size: usize,
    /// The longest key, in bytes, from `AGGBOX_KV_KEY_MAX_MIN` (32) to
    /// `AGGBOX_KV_KEY_MAX_LIMIT` (1024). Default 64.
    pub key_max: u32,
    /// The values' type: `AGGBOX_DTYPE_I64`, `AGGBOX_DTYPE_U64` or
    /// `AGGBOX_DTYPE_F64`. Default `AGGBOX_DTYPE_I64`.
    pub dtype: RawDtype,
    /// How the values of one key combine: `AGGBOX_OP_SUM`, `AGGBOX_OP_MIN`
    /// or `AGGBOX_OP_MAX`. Default `AGGBOX_OP_SUM`.
    pub op: RawOp,
    /// Most keys the owner's kernel table holds for one operation on the
    /// kernel datapath (pairs beyond it spill to user space, still exact);
    /// at least 1. Default 65536.
    pub kernel_capacity: u64,
    /// 1 (the default): combine on the mapper, as MapReduce's combiner:
    /// pairs of one key bound for one owner are folded into one before they
    /// are sent (up to 32768 keys per owner at a time); the result is the
    /// same (an f64 SUM adds in another order). 0: send every pair.
    pub combine: u32,
}

/// The smallest `size` accepted: up to and including `op`.
const MIN_SIZE: usize = offset_of!(aggbox_kv_config, op) + size_of::<RawOp>();

impl Default for aggbox_kv_config {
    /// The defaults of [`KvConfig::default`].
    fn default() -> Self {
        let defaults = KvConfig::default();
        aggbox_kv_config {
            size: size_of::<aggbox_kv_config>(),
            key_max: defaults.key_max as u32,
            dtype: RawDtype::from(defaults.dtype.code()),
            op: defaults.op.code() as RawOp,
            kernel_capacity: defaults.kernel_capacity as u64,
            combine: u32::from(defaults.combine),
        }
    }
}

impl aggbox_kv_config {
    /// Reads and checks the caller's config at `ptr` (the fields beyond its
    /// `size` get their defaults).
    ///
    /// # Safety
    ///
    /// If `ptr` is not NULL it must be valid for reading `(*ptr).size` bytes.
    unsafe fn read(ptr: *const aggbox_kv_config) -> Result<KvConfig> {
        // SAFETY: the caller's promise.
        let size = unsafe { sized_struct_size(ptr, "config", "aggbox_kv_config", MIN_SIZE) }?;
        let mut config = aggbox_kv_config::default();
        // SAFETY: `size` bytes are readable at `ptr` (the caller's promise)
        // and fit in `config` (checked); every field is an integer.
        unsafe { ptr::copy_nonoverlapping(ptr.cast::<u8>(), (&raw mut config).cast::<u8>(), size) };
        config.size = size_of::<aggbox_kv_config>();
        let dtype: Dtype = aggbox_dtype::from_raw(config.dtype)
            .ok_or_else(|| invalid(format!("config->dtype {} is not an aggbox_dtype", config.dtype)))?
            .into();
        let op = u8::try_from(config.op)
            .ok()
            .and_then(ReduceOp::from_code)
            .ok_or_else(|| invalid(format!("config->op {} is not an aggbox_op", config.op)))?;
        Ok(KvConfig {
            key_max: config.key_max as usize,
            dtype,
            op,
            kernel_capacity: usize::try_from(config.kernel_capacity).unwrap_or(usize::MAX),
            combine: config.combine != 0,
        })
    }
}

/// Fills `config` with the defaults and sets its `size`. Does nothing when
/// `config` is NULL.
///
/// # Safety
///
/// `config` is NULL or valid for writing an `aggbox_kv_config`.
#[no_mangle]
pub unsafe extern "C" fn aggbox_kv_config_init(config: *mut aggbox_kv_config) {
    value_call("aggbox_kv_config_init", (), || {
        check_ptr(config.cast_const(), "config")?;
        // SAFETY: not NULL and aligned (checked), writable (the caller's promise).
        unsafe { config.write(aggbox_kv_config::default()) };
        Ok(())
    })
}

/// An open key-value reduce on a communicator. Opaque; made by
/// `aggbox_kv_begin`, freed by `aggbox_kv_finish` (always, whether it
/// succeeds or not).
pub struct aggbox_kv {
    comm: *mut aggbox_comm,
    /// Why an earlier emit failed (the operation is closed then; finish
    /// reports it).
    failed: Option<Error>,
}

/// The reduced pairs of the keys one rank owns, sorted by key bytes.
/// Opaque; made by `aggbox_kv_finish`, freed by `aggbox_kv_result_free`.
pub struct aggbox_kv_result {
    result: KvResult,
}

/// The caller's arrays of one emit, valid until the call returns (the
/// caller's promise): the thread that runs the call may read them.
struct Batch {
    keys: *const u8,
    keys_len: usize,
    key_lens: *const u32,
    values: *const u64,
    n: usize,
}

// SAFETY: see above; the call that sends it waits for its end.
unsafe impl Send for Batch {}

impl Batch {
    /// # Safety
    ///
    /// The pointers are valid for their lengths (non-NULL, aligned, or the
    /// lengths 0) and nothing writes them meanwhile.
    unsafe fn run(self, comm: &mut aggbox_core::Comm) -> Result<()> {
        let slice = |ptr: *const u8, len| {
            if len == 0 {
                &[][..]
            } else {
                // SAFETY: the caller's promise.
                unsafe { std::slice::from_raw_parts(ptr, len) }
            }
        };
        let keys = slice(self.keys, self.keys_len);
        let (key_lens, values) = if self.n == 0 {
            (&[][..], &[][..])
        } else {
            // SAFETY: the caller's promise.
            unsafe { (std::slice::from_raw_parts(self.key_lens, self.n), std::slice::from_raw_parts(self.values, self.n)) }
        };
        comm.kv_emit(keys, key_lens, values)
    }
}

/// Opens a key-value reduce on `comm` (collective: every rank opens it with
/// the same config, in the same order as its other collectives) and writes
/// its handle to `*out`. Keys are byte strings of 1 to `config->key_max`
/// bytes; each is owned by the rank `fnv1a64(key) mod N` (FNV-1a, 64 bits,
/// over the key's bytes: docs/KV.md), which gets its reduced value from
/// `aggbox_kv_finish`. One operation at a time per communicator; finish it
/// before destroying `comm`.
///
/// Fails, with nothing sent and `*out` NULL, with
/// `AGGBOX_ERR_INVALID_ARGUMENT` when an argument is NULL, `config->size`
/// is wrong, `key_max` is outside 32..1024 (or a pair of such a key does
/// not fit the group's datagrams), `dtype` is not i64, u64 or f64, `op` is
/// not SUM, MIN or MAX, `kernel_capacity` is 0, or an operation is already
/// open on `comm`.
///
/// # Safety
///
/// `comm` is NULL or a live communicator, `config` NULL or valid for
/// reading `config->size` bytes, `out` NULL or valid for writing a pointer.
#[no_mangle]
pub unsafe extern "C" fn aggbox_kv_begin(
    comm: *mut aggbox_comm,
    config: *const aggbox_kv_config,
    out: *mut *mut aggbox_kv,
) -> aggbox_status {
    status_call("aggbox_kv_begin", || {
        // SAFETY: the caller's promise.
        unsafe { try_write(out, "out", ptr::null_mut()) }?;
        // SAFETY: the caller's promise.
        let handle = unsafe { CommRef::new(comm) }?;
        // SAFETY: the caller's promise.
        let config = unsafe { aggbox_kv_config::read(config) }?;
        handle.progress().run(&handle, move |comm| comm.kv_begin(&config))?;
        let kv = Box::into_raw(Box::new(aggbox_kv { comm, failed: None }));
        // SAFETY: checked writable above.
        unsafe { out.write(kv) };
        Ok(())
    })
}

/// Emits `n` pairs into `kv`: key `i` is the next `key_lens[i]` bytes of
/// `keys` (the keys concatenated), its value `values[i]`, an `int64_t`,
/// `uint64_t` or `double` as the config's dtype says (8 bytes each). Any
/// number of times, on any rank; the pairs are sent to their owners in
/// batches as they fill, and the call also handles what the other ranks
/// sent meanwhile.
///
/// Fails, with none of the `n` pairs emitted, with
/// `AGGBOX_ERR_INVALID_ARGUMENT` when `kv` is NULL, `keys`, `key_lens` or
/// `values` is NULL while `n` is not 0, a key has length 0 or more than
/// `key_max`, or `values` is not 8-byte aligned. It may also fail as the
/// collective does (`AGGBOX_ERR_PEER_FAILED` naming a rank that stopped
/// answering, a mismatch across ranks), which ends the operation: call
/// `aggbox_kv_finish` to free `kv`, which returns the same error.
///
/// # Safety
///
/// `kv` is NULL or a live handle of `aggbox_kv_begin` whose communicator is
/// alive; `keys` is valid for reading the sum of the key lengths, `key_lens`
/// and `values` for reading `n` elements each.
#[no_mangle]
pub unsafe extern "C" fn aggbox_kv_emit(
    kv: *mut aggbox_kv,
    keys: *const u8,
    key_lens: *const u32,
    values: *const c_void,
    n: usize,
) -> aggbox_status {
    status_call("aggbox_kv_emit", || {
        check_ptr(kv.cast_const(), "kv")?;
        // SAFETY: not NULL and aligned (checked), a live handle (the caller's promise).
        let kv = unsafe { &mut *kv };
        if let Some(e) = &kv.failed {
            return Err(invalid(format!("the operation failed earlier (call aggbox_kv_finish to free it): {e}")));
        }
        if n > 0 {
            check_ptr(key_lens, "key_lens")?;
            check_ptr(values.cast::<u64>(), "values")?;
        }
        let mut keys_len = 0usize;
        if n > 0 {
            // SAFETY: checked non-NULL and aligned; `n` elements readable (the caller's promise).
            let lens = unsafe { std::slice::from_raw_parts(key_lens, n) };
            keys_len = lens.iter().map(|&l| l as usize).sum();
        }
        if keys_len > 0 {
            check_ptr(keys, "keys")?;
        }
        let batch = Batch { keys, keys_len, key_lens, values: values.cast(), n };
        // SAFETY: the caller's promise.
        let handle = unsafe { CommRef::new(kv.comm) }?;
        // SAFETY: the arrays were checked above and are valid until this
        // call returns (the caller's promise); `run` waits for the job.
        let result = handle.progress().run(&handle, move |comm| unsafe { batch.run(comm) });
        if let Err(e) = &result {
            // An emit that failed as the collective does closed the
            // operation: keep why, for finish.
            if !handle.progress().run(&handle, |comm| Ok(comm.kv_is_open())).unwrap_or(false) {
                kv.failed = Some(copy_error(e));
            }
        }
        result
    })
}

/// The same error again (`Error` is not `Clone`: its I/O source is not).
fn copy_error(e: &Error) -> Error {
    match e {
        Error::InvalidArgument(m) => Error::InvalidArgument(m.clone()),
        Error::Mismatch(m) => Error::Mismatch(m.clone()),
        Error::Timeout(m) => Error::Timeout(m.clone()),
        Error::PeerFailed { rank, what } => Error::PeerFailed { rank: *rank, what: what.clone() },
        Error::System { context, source } => Error::system(context.clone(), std::io::Error::new(source.kind(), source.to_string())),
        Error::Unsupported(m) => Error::Unsupported(m.clone()),
        Error::Internal(m) => Error::Internal(m.clone()),
    }
}

/// Ends the key-value reduce `kv` (collective) and frees it; on success
/// writes to `*out` the reduced pairs of the keys this rank owns, sorted
/// by key bytes (`*out` is NULL on failure). It returns once this rank has
/// counted every batch each rank says it sent it and every owner has
/// counted every batch this rank sent: no pair is lost or counted twice.
///
/// Fails with `AGGBOX_ERR_INVALID_ARGUMENT` when `kv` or `out` is NULL (a
/// NULL `out` frees nothing), when the ranks' configs disagree (the message
/// says "mismatched collective calls"), or with the error of an emit that
/// failed; with `AGGBOX_ERR_PEER_FAILED` naming a rank that stopped
/// answering within the timeout.
///
/// # Safety
///
/// `kv` is NULL or a live handle whose communicator is alive; `out` NULL or
/// valid for writing a pointer.
#[no_mangle]
pub unsafe extern "C" fn aggbox_kv_finish(kv: *mut aggbox_kv, out: *mut *mut aggbox_kv_result) -> aggbox_status {
    status_call("aggbox_kv_finish", || {
        check_ptr(kv.cast_const(), "kv")?;
        // SAFETY: the caller's promise.
        unsafe { try_write(out, "out", ptr::null_mut()) }?;
        // SAFETY: a live handle of aggbox_kv_begin (the caller's promise),
        // freed here, once.
        let kv = unsafe { Box::from_raw(kv) };
        if let Some(e) = kv.failed {
            return Err(e);
        }
        // SAFETY: the caller's promise.
        let handle = unsafe { CommRef::new(kv.comm) }?;
        let result = handle.progress().run(&handle, |comm| comm.kv_finish())?;
        let result = Box::into_raw(Box::new(aggbox_kv_result { result }));
        // SAFETY: checked writable above.
        unsafe { out.write(result) };
        Ok(())
    })
}

/// Number of pairs in `result`; 0 when it is NULL.
///
/// # Safety
///
/// `result` is NULL or a live result of `aggbox_kv_finish`.
#[no_mangle]
pub unsafe extern "C" fn aggbox_kv_result_len(result: *const aggbox_kv_result) -> usize {
    value_call("aggbox_kv_result_len", 0, || {
        // SAFETY: the caller's promise.
        Ok(unsafe { try_ref(result, "result") }?.result.len())
    })
}

/// Pair `i` of `result`: writes a pointer to its key's bytes (not
/// NUL-terminated, valid until `aggbox_kv_result_free`) to `*key`, its
/// length to `*key_len` and its value (8 bytes: `int64_t`, `uint64_t` or
/// `double`, as configured) to `*value`. Fails with
/// `AGGBOX_ERR_INVALID_ARGUMENT` when an argument is NULL or `i` is not
/// below `aggbox_kv_result_len`.
///
/// # Safety
///
/// `result` is NULL or a live result; `key`, `key_len` and `value` are NULL
/// or valid for writing a pointer, a `uint32_t` and 8 bytes (aligned).
#[no_mangle]
pub unsafe extern "C" fn aggbox_kv_result_get(
    result: *const aggbox_kv_result,
    i: usize,
    key: *mut *const u8,
    key_len: *mut u32,
    value: *mut c_void,
) -> aggbox_status {
    status_call("aggbox_kv_result_get", || {
        // SAFETY: the caller's promise.
        let result = unsafe { try_ref(result, "result") }?;
        check_ptr(key.cast_const(), "key")?;
        check_ptr(key_len.cast_const(), "key_len")?;
        check_ptr(value.cast_const().cast::<u64>(), "value")?;
        let len = result.result.len();
        let (k, v) = result
            .result
            .get(i)
            .ok_or_else(|| invalid(format!("i {i} is not below the result's {len} pairs")))?;
        // SAFETY: checked non-NULL and aligned; writable (the caller's promise).
        unsafe {
            key.write(k.as_ptr());
            key_len.write(k.len() as u32);
            value.cast::<u64>().write(v);
        }
        Ok(())
    })
}

/// Frees a result of `aggbox_kv_finish`; does nothing with NULL.
///
/// # Safety
///
/// `result` is NULL or a live result, not used afterwards.
#[no_mangle]
pub unsafe extern "C" fn aggbox_kv_result_free(result: *mut aggbox_kv_result) {
    value_call("aggbox_kv_result_free", (), || {
        if !result.is_null() {
            // SAFETY: a live result of aggbox_kv_finish (the caller's promise), freed once.
            drop(unsafe { Box::from_raw(result) });
        }
        Ok(())
    })
}

/// What the operation did at this rank (`aggbox_kv_result_stats`).
/// Size-versioned: set `size` to `sizeof(aggbox_kv_stats)` first.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct aggbox_kv_stats {
    /// `sizeof(aggbox_kv_stats)` as the program was compiled; set by the caller.
    pub size: usize,
    /// Pairs this rank emitted.
    pub pairs_emitted: u64,
    /// Of those, pairs of keys it owns (never sent).
    pub pairs_local: u64,
    /// Batches sent to owners, first transmissions only.
    pub batches_sent: u64,
    /// Batches sent again (not acknowledged in time).
    pub retransmits: u64,
    /// Batches received again after they were counted (not folded again).
    pub duplicates: u64,
    /// Pairs from other ranks this owner folded in user space.
    pub pairs_folded_user: u64,
    /// Pairs this owner's XDP folded into the kernel table.
    pub pairs_folded_kernel: u64,
    /// Pairs the kernel left to user space (long keys, a full kernel table).
    pub spilled: u64,
    /// Kernel datapath: batches that reached this owner's socket before it
    /// armed the operation (dropped; sent again and folded by XDP).
    pub batches_unarmed: u64,
    /// Pairs this rank combined into an earlier pair of the same key
    /// before sending (`aggbox_kv_config.combine`).
    pub pairs_combined: u64,
}

/// Writes what the operation of `result` did at this rank into `*stats`:
/// set `stats->size` first; the library writes that many bytes. Fails with
/// `AGGBOX_ERR_INVALID_ARGUMENT` when an argument is NULL or `size` is
/// wrong.
///
/// # Safety
///
/// `result` is NULL or a live result; `stats` NULL or valid for reading
/// and writing `stats->size` bytes.
#[no_mangle]
pub unsafe extern "C" fn aggbox_kv_result_stats(
    result: *const aggbox_kv_result,
    stats: *mut aggbox_kv_stats,
) -> aggbox_status {
    status_call("aggbox_kv_result_stats", || {
        // SAFETY: the caller's promise.
        let result = unsafe { try_ref(result, "result") }?;
        // SAFETY: the caller's promise.
        let size = unsafe { sized_struct_size(stats.cast_const(), "stats", "aggbox_kv_stats", size_of::<usize>() + 8) }?;
        let s = result.result.stats();
        let full = aggbox_kv_stats {
            size,
            pairs_emitted: s.pairs_emitted,
            pairs_local: s.pairs_local,
            batches_sent: s.batches_sent,
            retransmits: s.retransmits,
            duplicates: s.duplicates,
            pairs_folded_user: s.pairs_folded_user,
            pairs_folded_kernel: s.pairs_folded_kernel,
            spilled: s.spilled,
            batches_unarmed: s.batches_unarmed,
            pairs_combined: s.pairs_combined,
        };
        // SAFETY: `size` bytes are writable (the caller's promise) and no
        // more than the struct (checked).
        unsafe { ptr::copy_nonoverlapping((&raw const full).cast::<u8>(), stats.cast::<u8>(), size) };
        Ok(())
    })
}

#[cfg(test)]
mod tests {
    use std::thread;

    use super::*;
    use crate::{
        aggbox_comm_destroy,
        testing::{last_error, loopback_comm as comm},
        types::aggbox_op,
    };


    #[test]
    fn word_count_on_two_loopback_ranks_through_the_c_abi() {
        let handles: Vec<_> = (0..2)
            .map(|rank| {
                thread::spawn(move || {
                    let comm = comm(rank, 2, 29_671);
                    let mut config = aggbox_kv_config { size: 0, key_max: 0, dtype: 0, op: 0, kernel_capacity: 0, combine: 0 };
                    unsafe { aggbox_kv_config_init(&mut config) };
                    assert_eq!(config.key_max, 64);
                    let mut kv = ptr::null_mut();
                    assert_eq!(unsafe { aggbox_kv_begin(comm, &config, &mut kv) }, aggbox_status::AGGBOX_OK, "{}", last_error());
                    let words = ["the", "cat", "the", "hat", "a"];
                    let keys: Vec<u8> = words.concat().into_bytes();
                    let lens: Vec<u32> = words.iter().map(|w| w.len() as u32).collect();
                    let values = [1i64; 5];
                    let st = unsafe { aggbox_kv_emit(kv, keys.as_ptr(), lens.as_ptr(), values.as_ptr().cast(), 5) };
                    assert_eq!(st, aggbox_status::AGGBOX_OK, "{}", last_error());
                    // A key longer than key_max: refused, nothing emitted.
                    let long = [b'x'; 65];
                    let st = unsafe { aggbox_kv_emit(kv, long.as_ptr(), &65, values.as_ptr().cast(), 1) };
                    assert_eq!(st, aggbox_status::AGGBOX_ERR_INVALID_ARGUMENT);
                    assert!(last_error().contains("key 0 has 65 bytes"), "{}", last_error());
                    let st = unsafe { aggbox_kv_emit(kv, ptr::null(), lens.as_ptr(), values.as_ptr().cast(), 5) };
                    assert_eq!(st, aggbox_status::AGGBOX_ERR_INVALID_ARGUMENT);
                    assert!(last_error().contains("keys"), "{}", last_error());
                    let mut result = ptr::null_mut();
                    assert_eq!(unsafe { aggbox_kv_finish(kv, &mut result) }, aggbox_status::AGGBOX_OK, "{}", last_error());
                    let mut got = Vec::new();
                    for i in 0..unsafe { aggbox_kv_result_len(result) } {
                        let (mut key, mut len, mut value) = (ptr::null(), 0u32, 0i64);
                        let st = unsafe { aggbox_kv_result_get(result, i, &mut key, &mut len, (&raw mut value).cast()) };
                        assert_eq!(st, aggbox_status::AGGBOX_OK);
                        let key = unsafe { std::slice::from_raw_parts(key, len as usize) };
                        got.push((String::from_utf8(key.to_vec()).unwrap(), value));
                    }
                    let (mut key, mut len, mut value) = (ptr::null(), 0u32, 0i64);
                    let n = got.len();
                    let st = unsafe { aggbox_kv_result_get(result, n, &mut key, &mut len, (&raw mut value).cast()) };
                    assert_eq!(st, aggbox_status::AGGBOX_ERR_INVALID_ARGUMENT);
                    let mut stats = aggbox_kv_stats { size: size_of::<aggbox_kv_stats>(), ..Default::default() };
                    assert_eq!(unsafe { aggbox_kv_result_stats(result, &mut stats) }, aggbox_status::AGGBOX_OK);
                    assert_eq!(stats.pairs_emitted, 5);
                    unsafe { aggbox_kv_result_free(result) };
                    unsafe { aggbox_comm_destroy(comm) };
                    got
                })
            })
            .collect();
        let mut all: Vec<(String, i64)> = handles.into_iter().flat_map(|h| h.join().unwrap()).collect();
        all.sort();
        let want: Vec<(String, i64)> = [("a", 2), ("cat", 2), ("hat", 2), ("the", 4)].iter().map(|(k, v)| (k.to_string(), *v)).collect();
        assert_eq!(all, want);
    }

    #[test]
    fn null_and_bad_arguments() {
        let comm = comm(0, 1, 29_672);
        let mut kv = ptr::null_mut();
        let config = aggbox_kv_config::default();
        assert_eq!(unsafe { aggbox_kv_begin(ptr::null_mut(), &config, &mut kv) }, aggbox_status::AGGBOX_ERR_INVALID_ARGUMENT);
        assert_eq!(unsafe { aggbox_kv_begin(comm, ptr::null(), &mut kv) }, aggbox_status::AGGBOX_ERR_INVALID_ARGUMENT);
        assert_eq!(unsafe { aggbox_kv_begin(comm, &config, ptr::null_mut()) }, aggbox_status::AGGBOX_ERR_INVALID_ARGUMENT);
        for bad in [
            aggbox_kv_config { key_max: 16, ..config },
            aggbox_kv_config { dtype: aggbox_dtype::AGGBOX_DTYPE_F32 as RawDtype, ..config },
            aggbox_kv_config { dtype: 99, ..config },
            aggbox_kv_config { op: aggbox_op::AGGBOX_OP_AVG as RawOp, ..config },
            aggbox_kv_config { op: -1, ..config },
            aggbox_kv_config { size: 4, ..config },
        ] {
            assert_eq!(unsafe { aggbox_kv_begin(comm, &bad, &mut kv) }, aggbox_status::AGGBOX_ERR_INVALID_ARGUMENT);
            assert!(kv.is_null());
        }
        assert_eq!(unsafe { aggbox_kv_begin(comm, &config, &mut kv) }, aggbox_status::AGGBOX_OK);
        let mut second = ptr::null_mut();
        assert_eq!(unsafe { aggbox_kv_begin(comm, &config, &mut second) }, aggbox_status::AGGBOX_ERR_INVALID_ARGUMENT);
        assert!(last_error().contains("already open"), "{}", last_error());
        assert_eq!(unsafe { aggbox_kv_emit(ptr::null_mut(), ptr::null(), ptr::null(), ptr::null(), 0) }, aggbox_status::AGGBOX_ERR_INVALID_ARGUMENT);
        assert_eq!(unsafe { aggbox_kv_emit(kv, ptr::null(), ptr::null(), ptr::null(), 1) }, aggbox_status::AGGBOX_ERR_INVALID_ARGUMENT);
        assert_eq!(unsafe { aggbox_kv_emit(kv, ptr::null(), ptr::null(), ptr::null(), 0) }, aggbox_status::AGGBOX_OK);
        let zero = 0u32;
        let value = 1u64;
        assert_eq!(unsafe { aggbox_kv_emit(kv, b"x".as_ptr(), &zero, (&raw const value).cast(), 1) }, aggbox_status::AGGBOX_ERR_INVALID_ARGUMENT);
        assert!(last_error().contains("key 0 has 0 bytes"), "{}", last_error());
        assert_eq!(unsafe { aggbox_kv_finish(kv, ptr::null_mut()) }, aggbox_status::AGGBOX_ERR_INVALID_ARGUMENT);
        let mut result = ptr::null_mut();
        assert_eq!(unsafe { aggbox_kv_finish(kv, &mut result) }, aggbox_status::AGGBOX_OK);
        assert_eq!(unsafe { aggbox_kv_result_len(result) }, 0);
        assert_eq!(unsafe { aggbox_kv_result_len(ptr::null()) }, 0);
        unsafe { aggbox_kv_result_free(result) };
        unsafe { aggbox_kv_result_free(ptr::null_mut()) };
        unsafe { aggbox_comm_destroy(comm) };
    }
}
