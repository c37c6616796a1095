//! `aggbox_config`: what a communicator needs to start, as C fills it in.

use std::{
    ffi::CStr,
    mem::{offset_of, size_of},
    net::Ipv4Addr,
    os::raw::{c_char, c_int},
    ptr,
    time::Duration,
};

use aggbox_core::{Config, Result};

use crate::{
    boundary::{check_ptr, invalid, sized_struct_size, value_call},
    types::{aggbox_datapath, aggbox_store, RawDatapath, RawStore},
};

/// Size of `aggbox_config.master_addr`, its terminating NUL included.
pub const AGGBOX_MASTER_ADDR_LEN: usize = 64;
/// Size of `aggbox_config.iface`, its terminating NUL included.
pub const AGGBOX_IFACE_LEN: usize = 32;

/// What a communicator needs to start. Size-versioned: fill it in with
/// `aggbox_config_init`, which sets `size` and every default, then change the
/// fields you need. Later versions of the library only append fields, and
/// accept the smaller struct of a program built against an older header
/// (the fields it lacks get their defaults).
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct aggbox_config {
    /// `sizeof(aggbox_config)` as the program was compiled; set by
    /// `aggbox_config_init`.
    pub size: usize,
    /// This process's rank, `0 .. world_size - 1`. Default 0.
    pub rank: c_int,
    /// Number of ranks in the group (at most 256). Default 1.
    pub world_size: c_int,
    /// IPv4 address of rank 0's rendezvous store, NUL-terminated, like
    /// MASTER_ADDR. Default "127.0.0.1".
    pub master_addr: [c_char; AGGBOX_MASTER_ADDR_LEN],
    /// Port of rank 0's rendezvous store, like MASTER_PORT. Default 29500.
    pub master_port: u16,
    /// Network interface to use, NUL-terminated; empty (the default) picks
    /// the one that reaches `master_addr`.
    pub iface: [c_char; AGGBOX_IFACE_LEN],
    /// Local UDP port; 0 (the default) picks a free one.
    pub port: u16,
    /// Requested datapath. Default `AGGBOX_DATAPATH_AUTO`.
    pub datapath: RawDatapath,
    /// Timeout of rendezvous and of every operation, in milliseconds, above
    /// 0. Default 30000.
    pub timeout_ms: u32,
    /// Who hosts the rendezvous store at `master_addr:master_port`, as
    /// `AGGBOX_STORE` says for `aggbox_comm_init_from_env`:
    /// `AGGBOX_STORE_RANK0` (the default) or `AGGBOX_STORE_EXTERNAL`, an
    /// `aggbox store` that outlives the ranks (a restarted rank rejoins).
    /// Appended after `timeout_ms`; on LP64 it takes what was the struct's
    /// tail padding, so `sizeof(aggbox_config)` is unchanged (128) and a
    /// program that zeroed the struct or called `aggbox_config_init` (as it
    /// must) gets the default. A library older than this field ignores it.
    pub store: RawStore,
}

/// The smallest `size` accepted: a config must at least hold `rank` and
/// `world_size`.
pub(crate) const MIN_SIZE: usize = offset_of!(aggbox_config, world_size) + size_of::<c_int>();

/// Copies `s` into a fixed-size C string field (the caller makes sure it fits).
fn c_array<const N: usize>(s: &str) -> [c_char; N] {
    assert!(
        s.len() < N && !s.contains('\0'),
        "{s:?} does not fit in {N} bytes"
    );
    let mut array = [0; N];
    for (dst, src) in array.iter_mut().zip(s.bytes()) {
        *dst = src as c_char;
    }
    array
}

impl Default for aggbox_config {
    /// The defaults of [`Config::default`].
    fn default() -> Self {
        let defaults = Config::default();
        aggbox_config {
            size: size_of::<aggbox_config>(),
            rank: defaults.rank as c_int,
            world_size: defaults.world_size as c_int,
            master_addr: c_array(&defaults.master_addr.to_string()),
            master_port: defaults.master_port,
            iface: c_array(defaults.iface.as_deref().unwrap_or("")),
            port: defaults.port,
            datapath: aggbox_datapath::from(defaults.datapath) as RawDatapath,
            timeout_ms: defaults.timeout.as_millis() as u32,
            store: aggbox_store::from(defaults.store) as RawStore,
        }
    }
}

/// The text of the C string field `name`, which must hold a NUL.
fn c_field<'a>(field: &'a [c_char], name: &str) -> Result<&'a str> {
    // SAFETY: c_char and u8 have the same size and alignment.
    let bytes = unsafe { &*(field as *const [c_char] as *const [u8]) };
    let text = CStr::from_bytes_until_nul(bytes).map_err(|_| {
        invalid(format!(
            "config->{name} is not NUL-terminated within its {} bytes",
            field.len()
        ))
    })?;
    text.to_str()
        .map_err(|_| invalid(format!("config->{name} is not valid UTF-8")))
}

impl aggbox_config {
    /// Reads the caller's config at `ptr`: checks its `size`, copies the
    /// fields it has and gives the others their defaults.
    ///
    /// # Safety
    ///
    /// If `ptr` is not NULL it must be valid for reading `(*ptr).size` bytes.
    pub(crate) unsafe fn read(ptr: *const aggbox_config) -> Result<aggbox_config> {
        // SAFETY: the caller's promise.
        let size = unsafe { sized_struct_size(ptr, "config", "aggbox_config", MIN_SIZE) }?;
        let defaults = aggbox_config::default();
        let mut config = defaults;
        // SAFETY: `size` bytes are readable at `ptr` (the caller's promise)
        // and fit in `config` (checked); every field is an integer or a
        // char array, valid for any bytes.
        unsafe {
            ptr::copy_nonoverlapping(
                ptr.cast::<u8>(),
                ptr::from_mut(&mut config).cast::<u8>(),
                size,
            );
        }
        config.size = size;
        // A field the caller's struct holds only part of gets its default.
        macro_rules! default_if_cut {
            ($($field:ident),*) => {$(
                if offset_of!(aggbox_config, $field) + size_of_val(&config.$field) > size {
                    config.$field = defaults.$field;
                }
            )*};
        }
        default_if_cut!(
            rank,
            world_size,
            master_addr,
            master_port,
            iface,
            port,
            datapath,
            timeout_ms,
            store
        );
        Ok(config)
    }

    /// The core configuration these fields describe, checked.
    pub(crate) fn to_core(self) -> Result<Config> {
        let rank = usize::try_from(self.rank)
            .map_err(|_| invalid(format!("config->rank is {}, below 0", self.rank)))?;
        let world_size = usize::try_from(self.world_size).map_err(|_| {
            invalid(format!(
                "config->world_size is {}, below 1",
                self.world_size
            ))
        })?;
        let addr = c_field(&self.master_addr, "master_addr")?;
        let master_addr: Ipv4Addr = addr.parse().map_err(|_| {
            invalid(format!(
                "config->master_addr {addr:?} is not an IPv4 address (like \"10.0.0.1\")"
            ))
        })?;
        let iface = c_field(&self.iface, "iface")?;
        let datapath = aggbox_datapath::from_raw(self.datapath).ok_or_else(|| {
            invalid(format!(
                "config->datapath is {}, not an aggbox_datapath (AGGBOX_DATAPATH_AUTO, _KERNEL or _USER)",
                self.datapath
            ))
        })?;
        let store = aggbox_store::from_raw(self.store).ok_or_else(|| {
            invalid(format!(
                "config->store is {}, not an aggbox_store (AGGBOX_STORE_RANK0 or _EXTERNAL): \
                 was the config filled in with aggbox_config_init?",
                self.store
            ))
        })?;
        let config = Config {
            rank,
            world_size,
            master_addr,
            master_port: self.master_port,
            iface: (!iface.is_empty()).then(|| iface.to_owned()),
            port: self.port,
            datapath: datapath.into(),
            timeout: Duration::from_millis(self.timeout_ms.into()),
            store: store.into(),
        };
        config.validate()?;
        Ok(config)
    }
}

/// Fills `*config` with `size = sizeof(aggbox_config)` and every default:
/// rank 0, world_size 1, master_addr "127.0.0.1", master_port 29500, iface ""
/// (auto), port 0 (auto), datapath `AGGBOX_DATAPATH_AUTO`, timeout_ms 30000,
/// store `AGGBOX_STORE_RANK0`. Call it before setting any field. NULL is
/// ignored (and recorded as the last error).
///
/// It writes the `aggbox_config` of this version of the header; should a
/// later version grow the struct, this function will keep writing this
/// version's fields only, and the bigger struct will get a new initializer.
///
/// # Safety
///
/// `config` is NULL or points to a writable `aggbox_config`.
#[no_mangle]
pub unsafe extern "C" fn aggbox_config_init(config: *mut aggbox_config) {
    value_call("aggbox_config_init", (), || {
        check_ptr(config.cast_const(), "config")?;
        // SAFETY: not NULL and aligned (checked), writable (the caller's promise).
        unsafe { config.write(aggbox_config::default()) };
        Ok(())
    })
}

#[cfg(test)]
mod tests {
    use aggbox_core::Datapath;

    use super::*;
    use crate::boundary::copy_last_error;

    fn with_addr(addr: &str) -> aggbox_config {
        aggbox_config {
            master_addr: c_array(addr),
            ..Default::default()
        }
    }

    #[test]
    fn defaults_are_the_core_defaults() {
        let mut config = std::mem::MaybeUninit::<aggbox_config>::uninit();
        unsafe { aggbox_config_init(config.as_mut_ptr()) };
        let config = unsafe { config.assume_init() };
        assert_eq!(config.size, size_of::<aggbox_config>());
        assert_eq!(config.to_core().unwrap(), Config::default());
        assert_eq!(config.timeout_ms, 30000);
        assert_eq!(config.master_port, 29500);
        assert_eq!(
            c_field(&config.master_addr, "master_addr").unwrap(),
            "127.0.0.1"
        );

        unsafe { aggbox_config_init(ptr::null_mut()) };
        let mut buf = [0u8; 128];
        let len = copy_last_error(&mut buf);
        assert_eq!(
            &buf[..len],
            b"aggbox_config_init: invalid argument: config is NULL"
        );
    }

    #[test]
    fn fields_convert() {
        let config = aggbox_config {
            rank: 2,
            world_size: 4,
            master_addr: c_array("10.0.0.1"),
            master_port: 1234,
            iface: c_array("eth0"),
            port: 47001,
            datapath: aggbox_datapath::AGGBOX_DATAPATH_USER as RawDatapath,
            timeout_ms: 1500,
            store: aggbox_store::AGGBOX_STORE_EXTERNAL as RawStore,
            ..Default::default()
        };
        assert_eq!(
            config.to_core().unwrap(),
            Config {
                rank: 2,
                world_size: 4,
                master_addr: Ipv4Addr::new(10, 0, 0, 1),
                master_port: 1234,
                iface: Some("eth0".into()),
                port: 47001,
                datapath: Datapath::User,
                timeout: Duration::from_millis(1500),
                store: aggbox_core::StoreHost::External,
            }
        );
    }

    #[test]
    fn bad_fields_are_refused() {
        let message = |config: aggbox_config| config.to_core().unwrap_err().to_string();
        let rank = message(aggbox_config {
            rank: -1,
            ..Default::default()
        });
        assert_eq!(rank, "invalid argument: config->rank is -1, below 0");
        let world = message(aggbox_config {
            world_size: -3,
            ..Default::default()
        });
        assert_eq!(world, "invalid argument: config->world_size is -3, below 1");
        let above = message(aggbox_config {
            rank: 4,
            world_size: 4,
            ..Default::default()
        });
        assert!(
            above.contains("rank 4 is not below the world size 4"),
            "{above}"
        );
        let zero = message(aggbox_config {
            timeout_ms: 0,
            ..Default::default()
        });
        assert!(zero.contains("timeout"), "{zero}");
        let addr = message(with_addr("master.example"));
        assert!(
            addr.contains("config->master_addr \"master.example\" is not an IPv4 address"),
            "{addr}"
        );
        let unterminated = message(aggbox_config {
            iface: [b'x' as c_char; AGGBOX_IFACE_LEN],
            ..Default::default()
        });
        assert_eq!(
            unterminated,
            "invalid argument: config->iface is not NUL-terminated within its 32 bytes"
        );
        let mut latin1 = aggbox_config::default();
        latin1.iface[0] = 0xe9u8 as c_char;
        assert!(message(latin1).contains("config->iface is not valid UTF-8"));
        let datapath = message(aggbox_config {
            datapath: 7,
            ..Default::default()
        });
        assert!(
            datapath.contains("config->datapath is 7, not an aggbox_datapath"),
            "{datapath}"
        );
        let store = message(aggbox_config {
            store: 9,
            ..Default::default()
        });
        assert!(
            store.contains("config->store is 9, not an aggbox_store"),
            "{store}"
        );
    }

    /// `store` was appended into what was the tail padding of the struct of
    /// the first header: on LP64 the struct keeps its size, and a config of
    /// an older program (its padding zeroed, as `aggbox_config_init` and
    /// any initializer leave it) asks for rank 0's store.
    #[test]
    fn store_fits_in_the_old_tail_padding() {
        assert_eq!(
            offset_of!(aggbox_config, store),
            offset_of!(aggbox_config, timeout_ms) + 4
        );
        if size_of::<usize>() == 8 {
            assert_eq!(size_of::<aggbox_config>(), 128);
        }
        let mut old = [0u8; size_of::<aggbox_config>()];
        let defaults = aggbox_config::default();
        // SAFETY: any bytes are a valid aggbox_config.
        unsafe {
            ptr::copy_nonoverlapping(
                ptr::from_ref(&defaults).cast::<u8>(),
                old.as_mut_ptr(),
                offset_of!(aggbox_config, store),
            )
        };
        let words: Vec<u64> = old
            .chunks_exact(8)
            .map(|c| u64::from_ne_bytes(c.try_into().unwrap()))
            .collect();
        let read = unsafe { aggbox_config::read(words.as_ptr().cast()) }.unwrap();
        assert_eq!(
            read.to_core().unwrap().store,
            aggbox_core::StoreHost::RankZero
        );
    }

    #[test]
    fn older_smaller_configs_get_defaults_for_what_they_lack() {
        let full = aggbox_config {
            rank: 1,
            world_size: 2,
            master_addr: c_array("10.0.0.9"),
            port: 47005,
            datapath: aggbox_datapath::AGGBOX_DATAPATH_KERNEL as RawDatapath,
            timeout_ms: 99,
            ..Default::default()
        };
        let defaults = aggbox_config::default();

        let whole = unsafe { aggbox_config::read(&full) }.unwrap();
        assert_eq!(whole, full);

        // A struct that ends before `timeout_ms`.
        let older = aggbox_config {
            size: offset_of!(aggbox_config, timeout_ms),
            ..full
        };
        let read = unsafe { aggbox_config::read(&older) }.unwrap();
        assert_eq!(
            read,
            aggbox_config {
                timeout_ms: defaults.timeout_ms,
                ..older
            }
        );

        // The smallest: rank and world size only. Read it from a buffer of
        // exactly that many bytes, so reading further would be out of bounds
        // (and flagged by Miri or ASan).
        assert_eq!(MIN_SIZE, 16);
        let mut rank_and_world = [0u8; 8];
        rank_and_world[..4].copy_from_slice(&1i32.to_ne_bytes());
        rank_and_world[4..].copy_from_slice(&3i32.to_ne_bytes());
        let words = [MIN_SIZE as u64, u64::from_ne_bytes(rank_and_world)];
        let read = unsafe { aggbox_config::read(words.as_ptr().cast()) }.unwrap();
        assert_eq!(
            read,
            aggbox_config {
                size: MIN_SIZE,
                rank: 1,
                world_size: 3,
                ..defaults
            }
        );

        // A size that cuts `master_addr` leaves it at its default.
        let cut = aggbox_config {
            size: offset_of!(aggbox_config, master_addr) + 4,
            ..full
        };
        let read = unsafe { aggbox_config::read(&cut) }.unwrap();
        assert_eq!(read.master_addr, defaults.master_addr);
        assert_eq!(read.port, defaults.port);
        assert_eq!(read.rank, 1);
    }

    #[test]
    fn sizes_out_of_range_are_refused() {
        let read = |size| unsafe {
            aggbox_config::read(&aggbox_config {
                size,
                ..Default::default()
            })
        };
        let big = read(size_of::<aggbox_config>() + 8)
            .unwrap_err()
            .to_string();
        assert!(
            big.contains("config->size is") && big.contains("newer aggbox.h"),
            "{big}"
        );
        let zero = read(0).unwrap_err().to_string();
        assert!(
            zero.contains("config->size is 0, smaller than any aggbox_config"),
            "{zero}"
        );
        let null = unsafe { aggbox_config::read(ptr::null()) }
            .unwrap_err()
            .to_string();
        assert_eq!(null, "invalid argument: config is NULL");
    }
}
