//! Communicator configuration, from code or from the environment.

use std::{net::Ipv4Addr, str::FromStr, time::Duration};

use crate::{Error, Result};

/// Which datapath a communicator uses.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Datapath {
    /// The kernel datapath where it can be had, else the user datapath (and
    /// the communicator says why).
    Auto,
    /// The BPF programs do the work; init fails when they cannot be loaded.
    Kernel,
    /// The same wire protocol done entirely in user space.
    User,
}

impl Datapath {
    /// The name used in `AGGBOX_DATAPATH` and in reports.
    pub fn name(self) -> &'static str {
        match self {
            Datapath::Auto => "auto",
            Datapath::Kernel => "kernel",
            Datapath::User => "user",
        }
    }
}

impl FromStr for Datapath {
    type Err = Error;
    fn from_str(s: &str) -> Result<Self> {
        match s.to_ascii_lowercase().as_str() {
            "auto" | "" => Ok(Datapath::Auto),
            "kernel" => Ok(Datapath::Kernel),
            "user" => Ok(Datapath::User),
            other => Err(Error::InvalidArgument(format!(
                "datapath {other:?}: expected auto, kernel or user"
            ))),
        }
    }
}

/// The UDP port a communicator uses when none is configured: the first free
/// one from here on.
pub const DEFAULT_PORT_BASE: u16 = 47000;
/// How many ports from [`DEFAULT_PORT_BASE`] on are tried.
pub const DEFAULT_PORT_SPAN: u16 = 64;
/// Default rendezvous port (as torch's MASTER_PORT).
pub const DEFAULT_MASTER_PORT: u16 = 29500;
/// Default timeout of rendezvous and of every operation.
pub const DEFAULT_TIMEOUT: Duration = Duration::from_secs(30);

/// Who hosts the rendezvous store at `master_addr:master_port`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum StoreHost {
    /// Rank 0 hosts it for the length of rendezvous (as torch's env
    /// rendezvous); a rank that restarts cannot rejoin.
    RankZero,
    /// A store that outlives the ranks (`aggbox store`, or
    /// [`crate::rendezvous::Store`]); every rank, rank 0 included, joins it,
    /// and a rank that crashed and is started again with the same address
    /// rejoins its group (what crash-recovery agreement needs).
    External,
}

impl FromStr for StoreHost {
    type Err = Error;
    fn from_str(s: &str) -> Result<Self> {
        match s.to_ascii_lowercase().as_str() {
            "rank0" | "" => Ok(StoreHost::RankZero),
            "external" => Ok(StoreHost::External),
            other => Err(Error::InvalidArgument(format!("store {other:?}: expected rank0 or external"))),
        }
    }
}

/// Everything a communicator needs to start.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Config {
    /// This process's rank, `0..world_size`.
    pub rank: usize,
    /// Number of ranks in the group.
    pub world_size: usize,
    /// Address of rank 0's rendezvous store.
    pub master_addr: Ipv4Addr,
    /// Port of rank 0's rendezvous store.
    pub master_port: u16,
    /// Interface to use; `None` picks the one that reaches `master_addr`.
    pub iface: Option<String>,
    /// Local UDP port; 0 picks a free one from [`DEFAULT_PORT_BASE`] on.
    pub port: u16,
    /// Requested datapath.
    pub datapath: Datapath,
    /// Timeout of rendezvous and of every operation.
    pub timeout: Duration,
    /// Who hosts the rendezvous store.
    pub store: StoreHost,
}

impl Default for Config {
    fn default() -> Self {
        Config {
            rank: 0,
            world_size: 1,
            master_addr: Ipv4Addr::LOCALHOST,
            master_port: DEFAULT_MASTER_PORT,
            iface: None,
            port: 0,
            datapath: Datapath::Auto,
            timeout: DEFAULT_TIMEOUT,
            store: StoreHost::RankZero,
        }
    }
}

fn parse_var<T: FromStr>(
    get: &impl Fn(&str) -> Option<String>,
    name: &str,
    default: Option<T>,
) -> Result<T> {
    match get(name) {
        Some(value) => value.trim().parse().map_err(|_| {
            Error::InvalidArgument(format!("environment variable {name}={value:?} is not valid"))
        }),
        None => default.ok_or_else(|| {
            Error::InvalidArgument(format!("environment variable {name} is not set"))
        }),
    }
}

impl Config {
    /// Reads RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT (as torch and Horovod
    /// use them), AGGBOX_IFACE, AGGBOX_PORT, AGGBOX_DATAPATH and
    /// AGGBOX_TIMEOUT_MS and AGGBOX_STORE (`rank0` or `external`) from the
    /// process environment.
    pub fn from_env() -> Result<Self> {
        Self::from_lookup(|name| std::env::var(name).ok())
    }

    /// Like [`Config::from_env`] with a custom variable lookup (for tests).
    pub fn from_lookup(get: impl Fn(&str) -> Option<String>) -> Result<Self> {
        let defaults = Config::default();
        let config = Config {
            rank: parse_var(&get, "RANK", None)?,
            world_size: parse_var(&get, "WORLD_SIZE", None)?,
            master_addr: parse_var(&get, "MASTER_ADDR", None)?,
            master_port: parse_var(&get, "MASTER_PORT", Some(defaults.master_port))?,
            iface: get("AGGBOX_IFACE").filter(|s| !s.is_empty()),
            port: parse_var(&get, "AGGBOX_PORT", Some(0))?,
            datapath: parse_var(&get, "AGGBOX_DATAPATH", Some(Datapath::Auto))?,
            timeout: Duration::from_millis(parse_var(
                &get,
                "AGGBOX_TIMEOUT_MS",
                Some(defaults.timeout.as_millis() as u64),
            )?),
            store: parse_var(&get, "AGGBOX_STORE", Some(StoreHost::RankZero))?,
        };
        config.validate()?;
        Ok(config)
    }

    /// Checks the fields against each other.
    pub fn validate(&self) -> Result<()> {
        if self.world_size == 0 || self.world_size > crate::wire::MAX_RANKS {
            return Err(Error::InvalidArgument(format!(
                "world size {} is not in 1..={}",
                self.world_size,
                crate::wire::MAX_RANKS
            )));
        }
        if self.rank >= self.world_size {
            return Err(Error::InvalidArgument(format!(
                "rank {} is not below the world size {}",
                self.rank, self.world_size
            )));
        }
        if self.timeout.is_zero() {
            return Err(Error::InvalidArgument("timeout must be above 0 ms".into()));
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use std::collections::HashMap;

    use super::*;

    fn lookup(vars: &[(&str, &str)]) -> impl Fn(&str) -> Option<String> {
        let map: HashMap<String, String> =
            vars.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect();
        move |name| map.get(name).cloned()
    }

    #[test]
    fn env_with_every_variable() {
        let config = Config::from_lookup(lookup(&[
            ("RANK", "3"),
            ("WORLD_SIZE", "8"),
            ("MASTER_ADDR", "10.1.2.3"),
            ("MASTER_PORT", "1234"),
            ("AGGBOX_IFACE", "eth0"),
            ("AGGBOX_PORT", "47010"),
            ("AGGBOX_DATAPATH", "kernel"),
            ("AGGBOX_TIMEOUT_MS", "1500"),
            ("AGGBOX_STORE", "external"),
        ]))
        .unwrap();
        assert_eq!(
            config,
            Config {
                rank: 3,
                world_size: 8,
                master_addr: Ipv4Addr::new(10, 1, 2, 3),
                master_port: 1234,
                iface: Some("eth0".into()),
                port: 47010,
                datapath: Datapath::Kernel,
                timeout: Duration::from_millis(1500),
                store: StoreHost::External,
            }
        );
    }

    #[test]
    fn env_defaults_and_errors() {
        let config = Config::from_lookup(lookup(&[
            ("RANK", "0"),
            ("WORLD_SIZE", "1"),
            ("MASTER_ADDR", "127.0.0.1"),
        ]))
        .unwrap();
        assert_eq!(config.master_port, DEFAULT_MASTER_PORT);
        assert_eq!(config.datapath, Datapath::Auto);
        assert_eq!(config.timeout, DEFAULT_TIMEOUT);

        let missing = Config::from_lookup(lookup(&[("RANK", "0")])).unwrap_err();
        assert!(missing.to_string().contains("WORLD_SIZE is not set"), "{missing}");
        let bad = Config::from_lookup(lookup(&[
            ("RANK", "8"),
            ("WORLD_SIZE", "8"),
            ("MASTER_ADDR", "127.0.0.1"),
        ]))
        .unwrap_err();
        assert!(bad.to_string().contains("rank 8 is not below the world size 8"), "{bad}");
        let datapath = Config::from_lookup(lookup(&[
            ("RANK", "0"),
            ("WORLD_SIZE", "1"),
            ("MASTER_ADDR", "127.0.0.1"),
            ("AGGBOX_DATAPATH", "dpdk"),
        ]))
        .unwrap_err();
        assert!(datapath.to_string().contains("AGGBOX_DATAPATH"), "{datapath}");
    }
}
