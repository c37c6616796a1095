//! `aggbox_agree`: approximate agreement that survives crashes and
//! restarts (docs/AGREEMENT.md).

use std::{
    ffi::{CStr, OsStr},
    mem::{offset_of, size_of},
    os::{raw::c_char, unix::ffi::OsStrExt},
    path::PathBuf,
    ptr,
    time::Duration,
};

use aggbox_core::{agree::AgreeConfig, Result};

use crate::{
    boundary::{check_ptr, invalid, sized_struct_size, status_call, value_call},
    comm::{aggbox_comm, CommRef},
    types::aggbox_status,
};

/// What an agreement is asked to do. Size-versioned: fill it in with
/// `aggbox_agree_config_init`, which sets `size` and every default, then
/// change the fields you need. Every rank passes the same `epsilon`, `f`,
/// `lo` and `hi`.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct aggbox_agree_config {
    /// `sizeof(aggbox_agree_config)` as the program was compiled; set by
    /// `aggbox_agree_config_init`.
    pub size: usize,
    /// Every returned value lies within `epsilon` of every other; above 0.
    /// Default 1e-6.
    pub epsilon: f64,
    /// Ranks that may crash forever; the group's size must be at least
    /// `2 f + 1`. Default 0.
    pub f: u32,
    /// Milliseconds to wait for a phase's values before failing with
    /// `AGGBOX_ERR_PEER_FAILED`; 0 (the default) is the communicator's
    /// timeout.
    pub timeout_ms: u32,
    /// This rank's persistent store: a NUL-terminated path of a file (one
    /// per rank and agreement; its directory must exist). Read during the
    /// call only. Required.
    pub store_path: *const c_char,
    /// Every rank's input lies in `[lo, hi]`; the number of phases follows
    /// from `(hi - lo) / epsilon`. Default: every finite double (about 1045
    /// phases at epsilon 1e-6), so pass the bounds you know.
    pub lo: f64,
    /// See `lo`.
    pub hi: f64,
    /// Milliseconds a rank that decided keeps answering ranks that lag
    /// behind, unless every rank told it it decided too. Default 1000.
    pub linger_ms: u32,
}

/// The smallest `size` accepted: up to and including `store_path`.
const MIN_SIZE: usize = offset_of!(aggbox_agree_config, store_path) + size_of::<*const c_char>();

impl Default for aggbox_agree_config {
    /// The defaults of [`AgreeConfig::default`].
    fn default() -> Self {
        let d = AgreeConfig::default();
        aggbox_agree_config {
            size: size_of::<aggbox_agree_config>(),
            epsilon: d.epsilon,
            f: d.f as u32,
            timeout_ms: 0,
            store_path: ptr::null(),
            lo: d.lo,
            hi: d.hi,
            linger_ms: d.linger.as_millis() as u32,
        }
    }
}

impl aggbox_agree_config {
    /// Reads and checks the caller's config at `ptr` (the fields beyond its
    /// `size` get their defaults).
    ///
    /// # Safety
    ///
    /// If `ptr` is not NULL it must be valid for reading `(*ptr).size`
    /// bytes, and its `store_path`, if not NULL, a NUL-terminated string.
    unsafe fn read(ptr: *const aggbox_agree_config) -> Result<AgreeConfig> {
        // SAFETY: the caller's promise.
        let size = unsafe { sized_struct_size(ptr, "config", "aggbox_agree_config", MIN_SIZE) }?;
        let mut config = aggbox_agree_config::default();
        // SAFETY: `size` bytes are readable at `ptr` (the caller's promise)
        // and fit in `config` (checked); every field is plain data.
        unsafe { ptr::copy_nonoverlapping(ptr.cast::<u8>(), (&raw mut config).cast::<u8>(), size) };
        if config.store_path.is_null() {
            return Err(invalid("config->store_path is NULL: every rank needs its own persistent store"));
        }
        // SAFETY: not NULL, NUL-terminated (the caller's promise).
        let path = unsafe { CStr::from_ptr(config.store_path) };
        Ok(AgreeConfig {
            epsilon: config.epsilon,
            f: config.f as usize,
            store: PathBuf::from(OsStr::from_bytes(path.to_bytes())),
            timeout: (config.timeout_ms != 0).then(|| Duration::from_millis(config.timeout_ms.into())),
            lo: config.lo,
            hi: config.hi,
            linger: Duration::from_millis(config.linger_ms.into()),
        })
    }
}

/// Fills `config` with the defaults and sets its `size`. Does nothing when
/// `config` is NULL.
///
/// # Safety
///
/// `config` is NULL or valid for writing an `aggbox_agree_config`.
#[no_mangle]
pub unsafe extern "C" fn aggbox_agree_config_init(config: *mut aggbox_agree_config) {
    value_call("aggbox_agree_config_init", (), || {
        check_ptr(config.cast_const(), "config")?;
        // SAFETY: not NULL and aligned (checked), writable (the caller's promise).
        unsafe { config.write(aggbox_agree_config::default()) };
        Ok(())
    })
}

/// Approximate agreement (collective). Every rank passes its input in
/// `*value`; when the call returns `AGGBOX_OK`, `*value` holds a value
/// within the range of the inputs and within `config->epsilon` of the value
/// every other rank gets. Up to `config->f` ranks may crash forever; every
/// other rank may crash and be started again any number of times: started
/// again with the same rank, address, port and store (and a communicator
/// that rejoined its group through an external store, `AGGBOX_STORE`), it
/// resumes from its store, and never sends, for a phase it took part in, a
/// value other than the one it sent before. The store is written (write,
/// fsync, rename) before any value of a new phase is sent.
///
/// Fails, with nothing sent, with `AGGBOX_ERR_INVALID_ARGUMENT` when an
/// argument is NULL, `config->size` is wrong, `epsilon` is not above 0, the
/// group is smaller than `2 f + 1`, the input is NaN or outside `[lo, hi]`,
/// or the store exists but is truncated, corrupted, or of another group,
/// rank or configuration (never a silent fresh start). Fails with
/// `AGGBOX_ERR_PEER_FAILED`, naming a rank it did not hear from, when a
/// phase's `n - f` values do not arrive within the timeout.
///
/// # Safety
///
/// `comm` is NULL or a live communicator, `config` NULL or valid for
/// reading `config->size` bytes (its `store_path` NULL or a NUL-terminated
/// string), `value` NULL or valid for reading and writing a `double`.
#[no_mangle]
pub unsafe extern "C" fn aggbox_agree(
    comm: *mut aggbox_comm,
    config: *const aggbox_agree_config,
    value: *mut f64,
) -> aggbox_status {
    status_call("aggbox_agree", || {
        check_ptr(value.cast_const(), "value")?;
        // SAFETY: the caller's promise.
        let handle = unsafe { CommRef::new(comm) }?;
        // SAFETY: the caller's promise.
        let config = unsafe { aggbox_agree_config::read(config) }?;
        // SAFETY: not NULL and aligned (checked), readable (the caller's promise).
        let input = unsafe { value.read() };
        let decided = handle.progress().run(&handle, move |comm| comm.agree(&config, input))?;
        // SAFETY: as above, writable.
        unsafe { value.write(decided) };
        Ok(())
    })
}

#[cfg(test)]
mod tests {
    use std::{ffi::CString, thread};

    use super::*;
    use crate::{
        aggbox_comm_destroy,
        testing::{last_error, loopback_comm as comm},
    };

    fn store_dir(name: &str) -> PathBuf {
        let dir = std::env::temp_dir().join(format!("aggbox-ffi-agree-{}-{name}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        dir
    }

    fn config(path: &CString, f: u32) -> aggbox_agree_config {
        let mut config = aggbox_agree_config { size: 0, ..Default::default() };
        unsafe { aggbox_agree_config_init(&mut config) };
        config.store_path = path.as_ptr();
        config.f = f;
        config.lo = -10.0;
        config.hi = 10.0;
        config.epsilon = 1e-3;
        config
    }

    #[test]
    fn three_loopback_ranks_agree_and_a_damaged_store_is_refused() {
        let dir = store_dir("three");
        let inputs = [-10.0, 3.5, 10.0];
        let handles: Vec<_> = (0..3)
            .map(|rank| {
                let path = CString::new(dir.join(format!("r{rank}")).display().to_string()).unwrap();
                thread::spawn(move || {
                    let comm = comm(rank, 3, 29_681);
                    let config = config(&path, 1);
                    let mut value = inputs[rank];
                    assert_eq!(unsafe { aggbox_agree(comm, &config, &mut value) }, aggbox_status::AGGBOX_OK, "{}", last_error());
                    unsafe { aggbox_comm_destroy(comm) };
                    value
                })
            })
            .collect();
        let values: Vec<f64> = handles.into_iter().map(|h| h.join().unwrap()).collect();
        for a in &values {
            assert!((-10.0..=10.0).contains(a));
            for b in &values {
                assert!((a - b).abs() <= 1e-3, "{values:?}");
            }
        }
        // The same stores on a new group of one rank: another group, refused.
        let comm = comm(0, 1, 29_682);
        let path = CString::new(dir.join("r0").display().to_string()).unwrap();
        let mut value = 1.0;
        let st = unsafe { aggbox_agree(comm, &config(&path, 0), &mut value) };
        assert_eq!(st, aggbox_status::AGGBOX_ERR_INVALID_ARGUMENT);
        assert!(last_error().contains("another group"), "{}", last_error());
        // Truncated: refused, and the file is left as it was.
        let bytes = std::fs::read(dir.join("r0")).unwrap();
        std::fs::write(dir.join("r0"), &bytes[..17]).unwrap();
        let st = unsafe { aggbox_agree(comm, &config(&path, 0), &mut value) };
        assert_eq!(st, aggbox_status::AGGBOX_ERR_INVALID_ARGUMENT);
        assert!(last_error().contains("holds 17 bytes"), "{}", last_error());
        assert_eq!(std::fs::read(dir.join("r0")).unwrap().len(), 17);
        assert_eq!(value, 1.0, "the value is left alone on failure");
        unsafe { aggbox_comm_destroy(comm) };
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn bad_arguments_get_a_status_and_a_message() {
        let dir = store_dir("bad");
        let path = CString::new(dir.join("s").display().to_string()).unwrap();
        let comm = comm(0, 1, 29_683);
        let mut value = 0.5;
        let cases: [(aggbox_agree_config, f64, &str); 5] = [
            (aggbox_agree_config { epsilon: 0.0, ..config(&path, 0) }, 0.5, "epsilon"),
            (aggbox_agree_config { epsilon: -1.0, ..config(&path, 0) }, 0.5, "epsilon"),
            (config(&path, 1), 0.5, "2f + 1"),
            (config(&path, 0), f64::NAN, "NaN"),
            (aggbox_agree_config { store_path: ptr::null(), ..config(&path, 0) }, 0.5, "store_path is NULL"),
        ];
        for (config, input, what) in cases {
            value = input;
            let st = unsafe { aggbox_agree(comm, &config, &mut value) };
            assert_eq!(st, aggbox_status::AGGBOX_ERR_INVALID_ARGUMENT, "{what}");
            assert!(last_error().contains(what), "{what}: {}", last_error());
        }
        assert!(!dir.join("s").exists(), "nothing was stored for a refused call");
        let good = config(&path, 0);
        let st = unsafe { aggbox_agree(comm, &good, ptr::null_mut()) };
        assert_eq!(st, aggbox_status::AGGBOX_ERR_INVALID_ARGUMENT);
        assert!(last_error().contains("value is NULL"), "{}", last_error());
        let st = unsafe { aggbox_agree(comm, ptr::null(), &mut value) };
        assert_eq!(st, aggbox_status::AGGBOX_ERR_INVALID_ARGUMENT);
        let st = unsafe { aggbox_agree(ptr::null_mut(), &good, &mut value) };
        assert_eq!(st, aggbox_status::AGGBOX_ERR_INVALID_ARGUMENT);
        // One rank agrees with itself: its input.
        value = 0.25;
        assert_eq!(unsafe { aggbox_agree(comm, &good, &mut value) }, aggbox_status::AGGBOX_OK, "{}", last_error());
        assert_eq!(value, 0.25);
        unsafe { aggbox_comm_destroy(comm) };
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
