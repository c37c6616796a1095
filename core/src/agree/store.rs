//! The persistent store of one rank in one agreement: the three values the
//! algorithm keeps across crashes (its state, its phase and its start
//! counter), bound to the group, rank and configuration that made them.
//!
//! One fixed-size little-endian record, [`RECORD_LEN`] bytes, with an FNV-1a
//! checksum at its end. It is replaced atomically: written to `<path>.tmp`,
//! fsynced, renamed over `<path>`, and the directory fsynced, so a crash at
//! any moment leaves either the old record or the new one. A file that is
//! there but is not a whole, intact record of this group, rank and
//! configuration is an error, never a fresh start: a rank that forgot the
//! value it sent for a phase could send another one and break agreement.

use std::{
    fs::{self, File, OpenOptions},
    io::{self, Write},
    path::{Path, PathBuf},
};

use crate::{Error, Result};

/// The first bytes of a store.
const MAGIC: [u8; 8] = *b"AGBXAGR1";
/// Version of the record layout.
const VERSION: u32 = 1;
/// Bytes of a record: the fields below, then the checksum.
pub const RECORD_LEN: usize = 88;
/// Bytes the checksum covers.
const CHECKED_LEN: usize = 80;

/// Who and what a store belongs to: a record of another identity is refused.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Identity {
    /// The rank.
    pub rank: u32,
    /// The group's size.
    pub world: u32,
    /// The group id.
    pub group: u32,
    /// A hash of the group token (not the token).
    pub token_hash: u64,
    /// The agreement's number on its communicator.
    pub seq: u32,
    /// Ranks that may crash forever.
    pub f: u32,
    /// The agreement's ε.
    pub epsilon: f64,
    /// The bounds every input lies in.
    pub lo: f64,
    /// See `lo`.
    pub hi: f64,
}

/// The three values the algorithm persists.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Persisted {
    /// The rank's value of `phase` (its input at phase 0).
    pub state: f64,
    /// The phase `state` belongs to.
    pub phase: u32,
    /// How many times this rank has started this agreement (1 on the first
    /// start): see docs/AGREEMENT.md, "The counter".
    pub counter: u32,
}

/// A rank's store file.
pub struct Store {
    path: PathBuf,
    tmp: PathBuf,
    identity: Identity,
}

/// FNV-1a 64 of `bytes`.
pub fn fnv1a(bytes: &[u8]) -> u64 {
    bytes.iter().fold(0xcbf2_9ce4_8422_2325u64, |h, &b| (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3))
}

impl Store {
    /// The store at `path` for `identity` (nothing is read yet).
    pub fn new(path: &Path, identity: Identity) -> Result<Store> {
        if path.as_os_str().is_empty() {
            return Err(Error::InvalidArgument("agreement: the store path is empty".into()));
        }
        let mut tmp = path.as_os_str().to_owned();
        tmp.push(".tmp");
        Ok(Store { path: path.to_owned(), tmp: PathBuf::from(tmp), identity })
    }

    /// Where it is.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// What the store holds: `None` when there is no file (the first start);
    /// an error when there is one that is not an intact record of this
    /// identity.
    pub fn load(&self) -> Result<Option<Persisted>> {
        let bytes = match fs::read(&self.path) {
            Ok(bytes) => bytes,
            Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(None),
            Err(e) => return Err(Error::system(format!("agreement: reading the store {}", self.path.display()), e)),
        };
        self.decode(&bytes).map(Some)
    }

    fn refuse(&self, what: String) -> Error {
        Error::InvalidArgument(format!(
            "agreement store {}: {what}; refusing to start this rank from scratch, which could break agreement \
             (restore the store, or remove it only if this rank never sent a value)",
            self.path.display()
        ))
    }

    fn decode(&self, b: &[u8]) -> Result<Persisted> {
        if b.len() != RECORD_LEN {
            return Err(self.refuse(format!("it holds {} bytes, a record has {RECORD_LEN} (truncated or not a store)", b.len())));
        }
        if b[..8] != MAGIC {
            return Err(self.refuse("it does not start with an AggBox agreement store's magic".into()));
        }
        let u32_at = |o: usize| u32::from_le_bytes(b[o..o + 4].try_into().expect("4 bytes"));
        let u64_at = |o: usize| u64::from_le_bytes(b[o..o + 8].try_into().expect("8 bytes"));
        if u32_at(8) != VERSION {
            return Err(self.refuse(format!("record version {} (this library writes {VERSION})", u32_at(8))));
        }
        if u64_at(CHECKED_LEN) != fnv1a(&b[..CHECKED_LEN]) {
            return Err(self.refuse("its checksum does not match (corrupted)".into()));
        }
        let found = Identity {
            rank: u32_at(12),
            world: u32_at(16),
            f: u32_at(20),
            group: u32_at(24),
            seq: u32_at(28),
            token_hash: u64_at(32),
            epsilon: f64::from_bits(u64_at(40)),
            lo: f64::from_bits(u64_at(48)),
            hi: f64::from_bits(u64_at(56)),
        };
        let want = &self.identity;
        if found.group != want.group || found.token_hash != want.token_hash || found.world != want.world {
            return Err(self.refuse(format!(
                "it belongs to another group (group {:#x} of {} ranks; this one is {:#x} of {})",
                found.group, found.world, want.group, want.world
            )));
        }
        if found.rank != want.rank || found.seq != want.seq {
            return Err(self.refuse(format!(
                "it is rank {}'s store of agreement #{}, not rank {}'s of #{}",
                found.rank, found.seq, want.rank, want.seq
            )));
        }
        if found.f != want.f
            || found.epsilon.to_bits() != want.epsilon.to_bits()
            || found.lo.to_bits() != want.lo.to_bits()
            || found.hi.to_bits() != want.hi.to_bits()
        {
            return Err(self.refuse(format!(
                "it was made with f = {}, epsilon = {:e}, inputs in [{:e}, {:e}]; this call passes f = {}, epsilon = {:e}, [{:e}, {:e}]",
                found.f, found.epsilon, found.lo, found.hi, want.f, want.epsilon, want.lo, want.hi
            )));
        }
        Ok(Persisted { state: f64::from_bits(u64_at(64)), phase: u32_at(72), counter: u32_at(76) })
    }

    fn encode(&self, p: &Persisted) -> [u8; RECORD_LEN] {
        let id = &self.identity;
        let mut b = [0u8; RECORD_LEN];
        b[..8].copy_from_slice(&MAGIC);
        let put32 = |o: usize, v: u32, b: &mut [u8; RECORD_LEN]| b[o..o + 4].copy_from_slice(&v.to_le_bytes());
        put32(8, VERSION, &mut b);
        put32(12, id.rank, &mut b);
        put32(16, id.world, &mut b);
        put32(20, id.f, &mut b);
        put32(24, id.group, &mut b);
        put32(28, id.seq, &mut b);
        put32(72, p.phase, &mut b);
        put32(76, p.counter, &mut b);
        let put64 = |o: usize, v: u64, b: &mut [u8; RECORD_LEN]| b[o..o + 8].copy_from_slice(&v.to_le_bytes());
        put64(32, id.token_hash, &mut b);
        put64(40, id.epsilon.to_bits(), &mut b);
        put64(48, id.lo.to_bits(), &mut b);
        put64(56, id.hi.to_bits(), &mut b);
        put64(64, p.state.to_bits(), &mut b);
        let sum = fnv1a(&b[..CHECKED_LEN]);
        put64(CHECKED_LEN, sum, &mut b);
        b
    }

    /// Replaces the record with `p`, durably: when this returns, a crash
    /// leaves `p` in the store.
    pub fn save(&self, p: &Persisted) -> Result<()> {
        let io_err = |what: &str, e: io::Error| Error::system(format!("agreement: {what} {}", self.tmp.display()), e);
        let record = self.encode(p);
        let mut file = OpenOptions::new()
            .write(true)
            .create(true)
            .truncate(true)
            .open(&self.tmp)
            .map_err(|e| io_err("creating", e))?;
        file.write_all(&record).map_err(|e| io_err("writing", e))?;
        file.sync_all().map_err(|e| io_err("syncing", e))?;
        drop(file);
        fs::rename(&self.tmp, &self.path).map_err(|e| io_err("renaming", e))?;
        let dir = self.path.parent().filter(|d| !d.as_os_str().is_empty()).unwrap_or(Path::new("."));
        File::open(dir)
            .and_then(|d| d.sync_all())
            .map_err(|e| Error::system(format!("agreement: syncing the directory {}", dir.display()), e))?;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn identity() -> Identity {
        Identity { rank: 2, world: 5, group: 0xabc, token_hash: 77, seq: 1, f: 2, epsilon: 1e-6, lo: 0.0, hi: 1e6 }
    }

    fn temp(name: &str) -> PathBuf {
        let dir = std::env::temp_dir().join(format!("aggbox-store-test-{}-{name}", std::process::id()));
        let _ = fs::remove_dir_all(&dir);
        fs::create_dir_all(&dir).unwrap();
        dir.join("store")
    }

    #[test]
    fn a_record_survives_a_round_trip_and_is_replaced_whole() {
        let path = temp("roundtrip");
        let store = Store::new(&path, identity()).unwrap();
        assert_eq!(store.load().unwrap(), None);
        let first = Persisted { state: -0.0, phase: 0, counter: 1 };
        store.save(&first).unwrap();
        let got = store.load().unwrap().unwrap();
        assert_eq!(got.state.to_bits(), (-0.0f64).to_bits());
        assert_eq!((got.phase, got.counter), (0, 1));
        let next = Persisted { state: 123.456, phase: 7, counter: 3 };
        store.save(&next).unwrap();
        assert_eq!(store.load().unwrap(), Some(next));
        assert_eq!(fs::read(&path).unwrap().len(), RECORD_LEN);
        assert!(!store.tmp.exists());
        fs::remove_dir_all(path.parent().unwrap()).unwrap();
    }

    #[test]
    fn truncated_corrupted_and_foreign_stores_are_refused() {
        let path = temp("refused");
        let store = Store::new(&path, identity()).unwrap();
        store.save(&Persisted { state: 1.5, phase: 4, counter: 2 }).unwrap();
        let good = fs::read(&path).unwrap();

        fs::write(&path, &good[..40]).unwrap();
        let err = store.load().unwrap_err().to_string();
        assert!(err.contains("holds 40 bytes") && err.contains("refusing"), "{err}");

        let mut flipped = good.clone();
        flipped[66] ^= 0x10;
        fs::write(&path, &flipped).unwrap();
        let err = store.load().unwrap_err().to_string();
        assert!(err.contains("checksum"), "{err}");

        fs::write(&path, &good).unwrap();
        let other = Store::new(&path, Identity { group: 0xdef, ..identity() }).unwrap();
        let err = other.load().unwrap_err().to_string();
        assert!(err.contains("another group"), "{err}");
        let other = Store::new(&path, Identity { rank: 3, ..identity() }).unwrap();
        assert!(other.load().unwrap_err().to_string().contains("rank 2's store"));
        let other = Store::new(&path, Identity { epsilon: 1e-3, ..identity() }).unwrap();
        assert!(other.load().unwrap_err().to_string().contains("was made with"));

        fs::write(&path, b"").unwrap();
        assert!(store.load().unwrap_err().to_string().contains("holds 0 bytes"));
        fs::remove_dir_all(path.parent().unwrap()).unwrap();
    }
}
