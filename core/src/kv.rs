//! Key-value reduce, the collective a MapReduce shuffle with a
//! reduce-by-key becomes (docs/KV.md).
//!
//! Every rank is a mapper and an owner. [`Comm::kv_begin`] opens an
//! operation; [`Comm::kv_emit`] takes batches of (key, value) pairs, any
//! number of times; [`Comm::kv_finish`] (collective) returns the reduced
//! pairs of the keys this rank owns. A key is owned by rank
//! [`key_owner`]: the FNV-1a hash of its bytes, mod N.
//!
//! A mapper folds the pairs of keys it owns into its own table, combines
//! the others per owner (when configured, as MapReduce's combiner) and packs
//! them into one batch per owner (`KV_DATA`, up to the group's chunk size
//! of pairs). Batches to each owner are numbered 1, 2, … across operations,
//! at most [`WINDOW`] of them unacknowledged; the owner counts each batch
//! once (a window of counted numbers per mapper, kept across operations) and
//! acknowledges it (`KV_ACK`), also when it repeats one already counted; the
//! mapper sends again the oldest unacknowledged batches on a retransmission
//! timeout. At finish a mapper tells each owner how many batches it sent it
//! in this operation (`KV_FIN`), and the owner answers `KV_FIN_ACK` once it
//! has counted exactly that many from it: a rank returns when every owner
//! answered it and it answered every mapper, so no pair is lost or counted
//! twice.
//!
//! On the user datapath the owner's table is a hash map in user space (this
//! module). On the kernel datapath the first program on the owner's
//! interface (TC ingress on the TC hooks, XDP ingress on the XDP hooks; one
//! body, `ebpf/aggbox_kv.h`; "XDP" below stands for either) does the
//! owner's part: it keeps the window of counted batch numbers per mapper
//! in a kernel map, folds each batch's pairs into a kernel table the
//! process made for the operation, and acknowledges the batch itself
//! (`XDP_TX`, or `bpf_redirect` from TC); a batch with a pair it cannot fold
//! (a long key, a full table) comes up to the socket flagged `KV_SPILL`,
//! and the process folds the rest. At finish the process adds what the
//! kernel counted per mapper to what it
//! counted itself, and drains the kernel table into its own.

use std::{
    collections::HashSet,
    os::fd::OwnedFd,
    time::{Duration, Instant},
};

use hashbrown::HashTable;

use crate::{
    comm::{receiver_grace, Backoff, Comm, Received},
    dtype::Dtype,
    kvmap,
    maps::{names, CTL_SLOTS},
    op::ReduceOp,
    wire::{seq_at_or_before, Header, Kind, FLAG_MISMATCH, FLAG_RETRANSMIT},
    Datapath, Error, Result,
};

#[path = "kvfloor.rs"]
pub mod floor;

/// The smallest key maximum a [`KvConfig`] may set.
pub const KEY_MAX_MIN: usize = 32;
/// The largest key maximum a [`KvConfig`] may set (a pair must fit one
/// batch datagram of the group's chunk size, too).
pub const KEY_MAX_LIMIT: usize = 1024;
/// Bytes of a pair on the wire besides its key: the key's length (u16) and
/// the value (8 bytes), little-endian.
pub const PAIR_OVERHEAD: usize = 10;
/// Batches a mapper keeps unacknowledged per owner (and the size of an
/// owner's window of counted batch numbers per mapper).
pub const WINDOW: usize = 256;

/// Batches a mapper keeps unacknowledged to an owner on the kernel
/// datapath: XDP on veth takes frames from a ring of 256, which the bursts
/// of eight mappers with [`WINDOW`] each overflowed (the drops cost
/// retransmission timeouts); 7 mappers × 32 fit it.
pub const KERNEL_WINDOW: usize = 32;

/// Keys a mapper's combining table holds per owner before it sends them.
pub const COMBINE_MAX: usize = 1 << 15;

/// How often an owner on the kernel datapath reads what XDP counted while
/// a mapper's `KV_FIN` waits for it.
const KERNEL_POLL: Duration = Duration::from_millis(1);
/// First retransmission timeout of a mapper's batches.
const KV_RTO_INITIAL: Duration = Duration::from_millis(4);
/// The largest.
const KV_RTO_MAX: Duration = Duration::from_millis(50);
/// Batches sent again per owner per retransmission timeout, the oldest
/// first.
const RESEND_MAX: usize = 64;
/// Copies of each `KV_ABORT` sent (it is not acknowledged).
const ABORT_COPIES: usize = 3;

/// The FNV-1a 64-bit hash of `key`: the documented hash that partitions
/// the keys (docs/KV.md).
pub fn key_hash(key: &[u8]) -> u64 {
    let mut hash: u64 = 0xcbf2_9ce4_8422_2325;
    for &byte in key {
        hash ^= u64::from(byte);
        hash = hash.wrapping_mul(0x0100_0000_01b3);
    }
    hash
}

/// The rank of a group of `ranks` that owns `key`: [`key_hash`] mod
/// `ranks`.
pub fn key_owner(key: &[u8], ranks: usize) -> usize {
    (key_hash(key) % ranks as u64) as usize
}

/// What a key-value reduce does: the same on every rank (the ranks' calls
/// are checked against each other).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct KvConfig {
    /// The longest key, in bytes: [`KEY_MAX_MIN`] to [`KEY_MAX_LIMIT`].
    pub key_max: usize,
    /// The values' type: [`Dtype::I64`], [`Dtype::U64`] or [`Dtype::F64`].
    pub dtype: Dtype,
    /// How values of one key combine: SUM, MIN or MAX.
    pub op: ReduceOp,
    /// Most keys the owner's kernel table holds for one operation (the
    /// kernel datapath; pairs beyond it spill to user space). Not used by
    /// the user datapath; at least 1.
    pub kernel_capacity: usize,
    /// Combine on the mapper (as MapReduce's combiner): pairs of one key
    /// bound for one owner are folded into one before they are sent, in a
    /// table of up to [`COMBINE_MAX`] keys per owner (sent when it is full,
    /// and at finish). The result is the same (SUM, MIN and MAX are
    /// associative and commutative; an f64 SUM adds in another order).
    pub combine: bool,
}

impl Default for KvConfig {
    fn default() -> KvConfig {
        KvConfig { key_max: 64, dtype: Dtype::I64, op: ReduceOp::Sum, kernel_capacity: 1 << 16, combine: true }
    }
}

impl KvConfig {
    /// Checks the configuration against a group whose chunk size is
    /// `chunk` bytes.
    pub fn check(&self, chunk: usize) -> Result<()> {
        if !(KEY_MAX_MIN..=KEY_MAX_LIMIT).contains(&self.key_max) {
            return Err(Error::InvalidArgument(format!(
                "key-value reduce: key_max {} is outside {KEY_MAX_MIN}..={KEY_MAX_LIMIT}",
                self.key_max
            )));
        }
        if self.key_max + PAIR_OVERHEAD > chunk {
            return Err(Error::InvalidArgument(format!(
                "key-value reduce: a pair of a {}-byte key does not fit this group's {chunk}-byte datagrams",
                self.key_max
            )));
        }
        if !matches!(self.dtype, Dtype::I64 | Dtype::U64 | Dtype::F64) {
            return Err(Error::InvalidArgument(format!(
                "key-value reduce: values are i64, u64 or f64, not {}",
                self.dtype
            )));
        }
        if !matches!(self.op, ReduceOp::Sum | ReduceOp::Min | ReduceOp::Max) {
            return Err(Error::InvalidArgument(format!(
                "key-value reduce: the op is sum, min or max, not {}",
                self.op
            )));
        }
        if self.kernel_capacity == 0 {
            return Err(Error::InvalidArgument("key-value reduce: kernel_capacity is 0".into()));
        }
        Ok(())
    }
}

/// `op` of two values of `dtype`, as their 64 bits. SUM wraps on integers;
/// MIN and MAX of f64 propagate NaN (as the reductions do).
pub fn combine(dtype: Dtype, op: ReduceOp, a: u64, b: u64) -> u64 {
    match (dtype, op) {
        (Dtype::F64, _) => {
            let (x, y) = (f64::from_bits(a), f64::from_bits(b));
            let r = match op {
                ReduceOp::Min if x.is_nan() || y.is_nan() => f64::NAN,
                ReduceOp::Max if x.is_nan() || y.is_nan() => f64::NAN,
                ReduceOp::Min => if y < x { y } else { x },
                ReduceOp::Max => if y > x { y } else { x },
                _ => x + y,
            };
            r.to_bits()
        }
        (Dtype::I64, ReduceOp::Min) => (a as i64).min(b as i64) as u64,
        (Dtype::I64, ReduceOp::Max) => (a as i64).max(b as i64) as u64,
        (_, ReduceOp::Min) => a.min(b),
        (_, ReduceOp::Max) => a.max(b),
        _ => a.wrapping_add(b),
    }
}

/// Counters of one key-value reduce at this rank.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct KvStats {
    /// Pairs this rank emitted.
    pub pairs_emitted: u64,
    /// Of those, pairs of keys it owns (folded at once, never sent).
    pub pairs_local: u64,
    /// Of those, pairs the mapper combined into an earlier pair of the
    /// same key before sending ([`KvConfig::combine`]).
    pub pairs_combined: u64,
    /// Batches sent to owners, first transmissions only.
    pub batches_sent: u64,
    /// Batches sent again (not acknowledged in time).
    pub retransmits: u64,
    /// Batches received again after they were counted (not folded again).
    pub duplicates: u64,
    /// Pairs from other ranks this owner folded in user space.
    pub pairs_folded_user: u64,
    /// Pairs the owner's XDP folded into the kernel table (kernel datapath;
    /// 0 until it is built).
    pub pairs_folded_kernel: u64,
    /// Pairs the kernel left to user space (a key longer than the kernel
    /// key, the kernel table full) and user space merged.
    pub spilled: u64,
    /// Kernel datapath: batches that reached this owner's socket unfolded
    /// and not spilled (dropped; they come again). XDP holds off a batch
    /// that comes before it is armed for its operation, so this stays 0.
    pub batches_unarmed: u64,
}

/// The reduced pairs of the keys this rank owns, sorted by key bytes.
#[derive(Clone, Debug, Default)]
pub struct KvResult {
    keys: Vec<u8>,
    /// Where each key ends in `keys`.
    ends: Vec<usize>,
    values: Vec<u64>,
    dtype: Option<Dtype>,
    stats: KvStats,
}

impl KvResult {
    /// Number of pairs.
    pub fn len(&self) -> usize {
        self.values.len()
    }

    /// Whether there are none.
    pub fn is_empty(&self) -> bool {
        self.values.is_empty()
    }

    /// Pair `i`: its key and its value's 64 bits (of [`KvResult::dtype`]).
    pub fn get(&self, i: usize) -> Option<(&[u8], u64)> {
        let value = *self.values.get(i)?;
        let start = if i == 0 { 0 } else { self.ends[i - 1] };
        Some((&self.keys[start..self.ends[i]], value))
    }

    /// Every pair, in order.
    pub fn iter(&self) -> impl Iterator<Item = (&[u8], u64)> + '_ {
        (0..self.len()).filter_map(|i| self.get(i))
    }

    /// The values' type.
    pub fn dtype(&self) -> Option<Dtype> {
        self.dtype
    }

    /// What the operation did at this rank.
    pub fn stats(&self) -> KvStats {
        self.stats
    }
}

/// One key of the owner's table: where its bytes are in the arena.
#[derive(Clone, Copy, Debug)]
struct Slot {
    hash: u64,
    start: u32,
    len: u32,
    value: u64,
}

/// The owner's user-space table: an open-addressing hash table of slots
/// whose keys live in one arena (no allocation per key once grown).
#[derive(Debug)]
struct Table {
    index: HashTable<Slot>,
    arena: Vec<u8>,
    dtype: Dtype,
    op: ReduceOp,
}

/// Mixes the partition hash for the table: every key of an owner has the
/// same hash mod N, so its low bits alone would crowd the buckets.
fn table_hash(key: &[u8]) -> u64 {
    let mut z = key_hash(key);
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

impl Table {
    fn new(dtype: Dtype, op: ReduceOp) -> Table {
        Table { index: HashTable::new(), arena: Vec::new(), dtype, op }
    }

    /// Keys held.
    fn len(&self) -> usize {
        self.index.len()
    }

    /// Forgets every key, keeping the room.
    fn clear(&mut self) {
        self.index.clear();
        self.arena.clear();
    }

    /// Every (key, value).
    fn pairs(&self) -> impl Iterator<Item = (&[u8], u64)> + '_ {
        self.index.iter().map(|s| (&self.arena[s.start as usize..][..s.len as usize], s.value))
    }

    /// Folds `value` into `key`'s entry (made when it is new); returns
    /// whether the key was there.
    fn fold(&mut self, key: &[u8], value: u64) -> bool {
        let hash = table_hash(key);
        let arena = &self.arena;
        let found = self.index.find_mut(hash, |s| s.hash == hash && &arena[s.start as usize..][..s.len as usize] == key);
        match found {
            Some(slot) => {
                slot.value = combine(self.dtype, self.op, slot.value, value);
                true
            }
            None => {
                let start = self.arena.len() as u32;
                self.arena.extend_from_slice(key);
                let slot = Slot { hash, start, len: key.len() as u32, value };
                self.index.insert_unique(hash, slot, |s| s.hash);
                false
            }
        }
    }

    /// The pairs, sorted by key.
    fn into_result(self, stats: KvStats) -> KvResult {
        let arena = self.arena;
        let mut slots: Vec<Slot> = self.index.into_iter().collect();
        slots.sort_unstable_by(|a, b| arena[a.start as usize..][..a.len as usize].cmp(&arena[b.start as usize..][..b.len as usize]));
        let mut keys = Vec::with_capacity(arena.len());
        let mut ends = Vec::with_capacity(slots.len());
        let mut values = Vec::with_capacity(slots.len());
        for slot in &slots {
            keys.extend_from_slice(&arena[slot.start as usize..][..slot.len as usize]);
            ends.push(keys.len());
            values.push(slot.value);
        }
        KvResult { keys, ends, values, dtype: Some(self.dtype), stats }
    }
}

/// Which batch numbers from one mapper an owner has counted: every number
/// below `base`, and those marked in the ring above it.
#[derive(Clone, Debug)]
struct Counted {
    base: u32,
    ring: Vec<bool>,
}

impl Counted {
    fn new() -> Counted {
        Counted { base: 1, ring: vec![false; WINDOW] }
    }

    /// Whether batch `b` was counted; `None` when it lies beyond the window
    /// (a mapper keeps to its window, so it cannot come yet).
    fn has(&self, b: u32) -> Option<bool> {
        if seq_at_or_before(self.base, b) {
            let ahead = b.wrapping_sub(self.base) as usize;
            (ahead < WINDOW).then(|| self.ring[b as usize % WINDOW])
        } else {
            Some(true)
        }
    }

    /// Marks batch `b` (inside the window, not counted) as counted.
    fn mark(&mut self, b: u32) {
        self.ring[b as usize % WINDOW] = true;
        while self.ring[self.base as usize % WINDOW] {
            self.ring[self.base as usize % WINDOW] = false;
            self.base = self.base.wrapping_add(1);
        }
    }
}

/// `AGGBOX_KV_KEY`: key bytes of the kernel table; longer keys spill.
pub const KERNEL_KEY: usize = 32;
/// `AGGBOX_FLAG_KV_SPILL`: a `KV_DATA` XDP passed up; the first
/// `nchunks >> 16` of its pairs are folded in the kernel.
pub const FLAG_KV_SPILL: u16 = 0x0020;
/// `AGGBOX_KVSTAT_*` names, in index order (`ab_kvstats`).
pub const KVSTAT_NAMES: [&str; 7] = ["pairs", "batches", "spilled", "duplicates", "to_user", "errors", "held"];
/// Entries one `BPF_MAP_LOOKUP_AND_DELETE_BATCH` takes.
const DRAIN_BATCH: usize = 8192;

/// `struct aggbox_kvctl`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[repr(C)]
pub struct KvCtl {
    /// The armed operation; 0: none.
    pub seq: u32,
    /// The communicator's group.
    pub group: u32,
    /// Its rank: the sender of XDP's acknowledgments.
    pub rank: u32,
    /// The header's `nchunks`: the key maximum.
    pub key_max: u32,
    /// The header's dtype.
    pub dtype: u8,
    /// The header's op.
    pub op: u8,
    /// 1: fold pairs; 0: spill every batch (f64 SUM, which the kernel cannot add).
    pub fold: u8,
    /// The kind of the kernel table: [`KVTAB_HASH`] or [`KVTAB_ARRAY`].
    pub table: u8,
    /// An array table's slots - 1 (a power of 2).
    pub mask: u32,
}

/// `AGGBOX_KVTAB_HASH`: the kernel table is a BPF hash map in `ab_kvtabs`.
pub const KVTAB_HASH: u8 = 0;
/// `AGGBOX_KVTAB_ARRAY`: an open-addressing array in `ab_kvarrs`.
pub const KVTAB_ARRAY: u8 = 1;
/// Most slots of an array table (48 MiB).
pub const ARRAY_SLOTS_MAX: usize = 1 << 20;

/// `struct aggbox_kvslot`: one slot of an array table.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[repr(C)]
pub struct KvSlot {
    /// 0: empty; 1: being filled; else the key's hash with the low 16 bits
    /// (length << 2 | 2).
    pub tag: u64,
    /// The folded value.
    pub value: u64,
    /// The key, zero-padded.
    pub words: [u64; KERNEL_KEY / 8],
}

/// Which kernel table the kernel datapath folds into: the open-addressing
/// array (the default: measured faster, docs/BENCHMARKS.md), or, with
/// `AGGBOX_KV_TABLE=hash` in the environment, a BPF hash map per
/// operation (what came first; `aggbox bench kv` compares the two).
pub fn array_table_wanted() -> bool {
    std::env::var("AGGBOX_KV_TABLE").map_or(true, |v| v != "hash")
}

/// An open-addressing array table, mapped into the process: XDP fills its
/// slots, the process reads and clears them at finish. Kept across a
/// communicator's operations (made anew when one fails, or needs more
/// slots). One element more than its slots: the header (keys claimed,
/// capacity).
struct ArrayTable {
    fd: OwnedFd,
    slots: usize,
    map: *mut KvSlot,
    len: usize,
    /// Armed and not cleared since.
    dirty: bool,
}

impl ArrayTable {
    fn new(slots: usize) -> Result<ArrayTable> {
        let fd = kvmap::create_array(
            "ab_kvarr",
            std::mem::size_of::<KvSlot>() as u32,
            slots as u32 + 1,
            kvmap::ARRAY_TABLE_FLAGS,
        )?;
        let len = ((slots + 1) * std::mem::size_of::<KvSlot>()).div_ceil(4096) * 4096;
        // SAFETY: mapping a BPF_F_MMAPABLE array's value area, as the
        // kernel allows (shared, read-write); unmapped on drop.
        let map = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                len,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_SHARED,
                std::os::fd::AsRawFd::as_raw_fd(&fd),
                0,
            )
        };
        if map == libc::MAP_FAILED {
            return Err(Error::system("mapping the kernel array table", std::io::Error::last_os_error()));
        }
        Ok(ArrayTable { fd, slots, map: map.cast(), len, dirty: false })
    }

    /// Sets the most keys XDP may claim (the header's value).
    fn set_capacity(&mut self, capacity: usize) {
        // SAFETY: the header element, inside the mapping; XDP only reads
        // it while the table is armed.
        unsafe { std::ptr::write_volatile(&mut (*self.map.add(self.slots)).value, capacity as u64) };
    }

    /// Folds every filled slot into `table` and empties it.
    fn drain(&mut self, table: &mut Table) {
        for i in 0..self.slots {
            // SAFETY: i < slots, inside the mapping; XDP writes none of
            // them now (the operation is complete and disarmed).
            let slot = unsafe { &mut *self.map.add(i) };
            let tag = unsafe { std::ptr::read_volatile(&slot.tag) };
            if tag == 0 {
                continue;
            }
            let len = ((tag >> 2) & 0x3fff) as usize;
            let mut bytes = [0u8; KERNEL_KEY];
            for (w, chunk) in slot.words.iter().zip(bytes.chunks_mut(8)) {
                chunk.copy_from_slice(&w.to_le_bytes());
            }
            if tag != 1 && len > 0 && len <= KERNEL_KEY {
                table.fold(&bytes[..len], slot.value);
            }
            *slot = KvSlot::default();
        }
        // SAFETY: the header element, inside the mapping.
        unsafe { std::ptr::write_volatile(&mut (*self.map.add(self.slots)).tag, 0) };
        self.dirty = false;
    }
}

// SAFETY: the mapping is owned by the table and only touched through
// `&mut self` (drain) or on drop; XDP's writes are to other slots or done.
unsafe impl Send for ArrayTable {}
// SAFETY: as above: nothing reads or writes the mapping through `&self`.
unsafe impl Sync for ArrayTable {}

impl Drop for ArrayTable {
    fn drop(&mut self) {
        // SAFETY: the mapping made in new().
        unsafe { libc::munmap(self.map.cast(), self.len) };
    }
}

/// `struct aggbox_kvkey`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[repr(C)]
pub struct KvKey {
    /// Bytes of the key.
    pub len: u32,
    /// The key, zero-padded.
    pub bytes: [u8; KERNEL_KEY],
}

/// `struct aggbox_kvcount`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[repr(C)]
pub struct KvCount {
    /// Batches XDP folded whole and acknowledged.
    pub batches: u64,
    /// Pairs XDP folded (spilled batches' first pairs included).
    pub pairs: u64,
}

/// A communicator's handles on the key-value maps of its attachment.
struct KvKernel {
    ctl: u32,
    kvctl: OwnedFd,
    kvtabs: OwnedFd,
    kvarrs: OwnedFd,
    kvcount: OwnedFd,
    /// The array table, once an operation used one.
    array: Option<ArrayTable>,
    /// The last arming written (its group and rank stay when disarmed, so
    /// XDP still answers repeats of folded batches).
    arming: KvCtl,
}

impl KvKernel {
    /// Opens the maps and clears this communicator's windows (a
    /// communicator that used the control block before left its batch
    /// numbers there).
    fn open(comm: &Comm) -> Result<Option<KvKernel>> {
        let Some(attachment) = comm.attachment.as_ref().filter(|_| comm.datapath() == Datapath::Kernel) else {
            return Ok(None);
        };
        let Some(ctl) = attachment.windows().map(|w| w.index()).filter(|&c| c < CTL_SLOTS) else { return Ok(None) };
        let dir = attachment.pin_dir();
        let kvwin = kvmap::open_pinned(&dir.join(names::KVWIN))?;
        let zero = [0u64; WINDOW];
        for mapper in 0..comm.size() as u32 {
            let index = ctl * crate::wire::MAX_RANKS as u32 + mapper;
            kvmap::update(&kvwin, &index, &zero, "clearing a key-value window")?;
        }
        let arming = KvCtl { group: comm.group.group, rank: comm.rank() as u32, ..KvCtl::default() };
        let kernel = KvKernel {
            ctl,
            kvctl: kvmap::open_pinned(&dir.join(names::KVCTL))?,
            kvtabs: kvmap::open_pinned(&dir.join(names::KVTABS))?,
            kvarrs: kvmap::open_pinned(&dir.join(names::KVARRS))?,
            kvcount: kvmap::open_pinned(&dir.join(names::KVCOUNT))?,
            array: None,
            arming,
        };
        kvmap::update(&kernel.kvctl, &ctl, &arming, "writing ab_kvctl")?;
        Ok(Some(kernel))
    }

    /// The kvcount index of `mapper`.
    fn index(&self, mapper: usize) -> u32 {
        self.ctl * crate::wire::MAX_RANKS as u32 + mapper as u32
    }

    /// Arms operation `seq` of `config` with `table` as its kernel table:
    /// counters zeroed, table in place, then the arming.
    /// With `table` None, into the array table (of at least twice
    /// `kernel_capacity` slots, up to [`ARRAY_SLOTS_MAX`]), made or
    /// remade first when needed.
    fn arm(&mut self, seq: u32, config: &KvConfig, ranks: usize, table: Option<&OwnedFd>) -> Result<()> {
        for mapper in 0..ranks {
            kvmap::update(&self.kvcount, &self.index(mapper), &KvCount::default(), "zeroing ab_kvcount")?;
        }
        let (kind, mask) = match table {
            Some(table) => {
                let fd = std::os::fd::AsRawFd::as_raw_fd(table) as u32;
                kvmap::update(&self.kvtabs, &self.ctl, &fd, "putting the kernel table in ab_kvtabs")?;
                (KVTAB_HASH, 0)
            }
            None => {
                let slots = config.kernel_capacity.saturating_mul(2).next_power_of_two().clamp(64, ARRAY_SLOTS_MAX);
                // The table stays in ab_kvarrs between operations (XDP
                // folds into it only while armed): an update of an array
                // of maps waits for an RCU grace period (synchronize_rcu
                // in the bpf() call), 30 ms per operation as measured.
                if self.array.as_ref().is_none_or(|a| a.dirty || a.slots != slots) {
                    self.array = None;
                    let array = ArrayTable::new(slots)?;
                    let fd = std::os::fd::AsRawFd::as_raw_fd(&array.fd) as u32;
                    kvmap::update(&self.kvarrs, &self.ctl, &fd, "putting the kernel table in ab_kvarrs")?;
                    self.array = Some(array);
                }
                let array = self.array.as_mut().expect("made");
                array.set_capacity(config.kernel_capacity);
                array.dirty = true;
                (KVTAB_ARRAY, slots as u32 - 1)
            }
        };
        self.arming = KvCtl {
            seq,
            key_max: config.key_max as u32,
            dtype: config.dtype.code(),
            op: config.op.code(),
            fold: u8::from(!(config.dtype == Dtype::F64 && config.op == ReduceOp::Sum)),
            table: kind,
            mask,
            ..self.arming
        };
        kvmap::update(&self.kvctl, &self.ctl, &self.arming, "arming ab_kvctl")
    }

    /// Disarms: XDP folds nothing more (it still answers repeats), and
    /// the table leaves ab_kvtabs.
    fn disarm(&mut self) {
        self.arming.seq = 0;
        if let Err(e) = kvmap::update(&self.kvctl, &self.ctl, &self.arming, "disarming ab_kvctl") {
            tracing::warn!(error = %e, "key-value reduce");
        }
        // A hash table is the operation's: out of ab_kvtabs. The array
        // table stays in ab_kvarrs for the next operation (disarmed, XDP
        // folds nothing into it), until the communicator goes.
        if !array_table_wanted() {
            if let Err(e) = kvmap::delete(&self.kvtabs, &self.ctl, "removing the kernel table from ab_kvtabs") {
                tracing::warn!(error = %e, "key-value reduce");
            }
        }
    }

    /// What XDP counted for `mapper` in the armed operation.
    fn count(&self, mapper: usize) -> Result<KvCount> {
        let mut value = KvCount::default();
        kvmap::lookup(&self.kvcount, &self.index(mapper), &mut value, "reading ab_kvcount")?;
        Ok(value)
    }
}

impl Drop for KvKernel {
    fn drop(&mut self) {
        if self.array.is_some() {
            if let Err(e) = kvmap::delete(&self.kvarrs, &self.ctl, "removing the kernel table from ab_kvarrs") {
                tracing::warn!(error = %e, "key-value reduce");
            }
        }
    }
}

/// The kernel part of an open operation at its owner.
struct KvOpKernel {
    /// The hash map XDP folds into (None: the array table of the
    /// communicator's [`KvKernel`]).
    table: Option<OwnedFd>,
    /// Spilled batches the process folded in this operation: (mapper, batch).
    spilled: HashSet<(u16, u32)>,
    /// Per mapper: batches XDP folded whole, as last read.
    batches: Vec<u64>,
    /// When they were last read.
    read_at: Instant,
}

/// What key-value reduce keeps in the communicator between operations.
pub(crate) struct KvState {
    /// Sequence number of the last operation begun.
    seq: u32,
    /// The last operation that completed here, and its configuration (a
    /// repeat of its `KV_FIN` is answered).
    last_done: Option<u32>,
    /// Per owner: the next batch number to send it (1, 2, …).
    next_batch: Vec<u32>,
    /// Per mapper: the batch numbers counted from it.
    counted: Vec<Counted>,
    /// The open operation (dropped before `kernel`).
    op: Option<Box<KvOp>>,
    /// On the kernel datapath, once the first operation opened them: the
    /// key-value maps.
    kernel: Option<KvKernel>,
}

impl KvState {
    pub(crate) fn new(ranks: usize) -> KvState {
        KvState {
            seq: 0,
            last_done: None,
            next_batch: vec![1; ranks],
            counted: vec![Counted::new(); ranks],
            op: None,
            kernel: None,
        }
    }
}

impl Drop for KvState {
    fn drop(&mut self) {
        // An operation left open: XDP must not keep folding into its table.
        if let (Some(op), Some(kernel)) = (self.op.take(), self.kernel.as_mut()) {
            if op.kernel.is_some() {
                kernel.disarm();
            }
        }
    }
}

/// One mapper's stream of batches to one owner in the open operation.
#[derive(Debug)]
struct Stream {
    /// The first batch number of this operation.
    first: u32,
    /// The lowest batch number not acknowledged.
    low: u32,
    /// The batch being filled (sealed ones are below it).
    next: u32,
    /// Batches it may have unacknowledged ([`WINDOW`], or
    /// [`KERNEL_WINDOW`] to an owner on the kernel datapath).
    window: usize,
    /// Bytes and pairs in the batch being filled, and how many of those
    /// pairs have keys longer than the kernel key.
    fill: usize,
    pairs: u32,
    long: u32,
    /// Per ring slot: acknowledged, pairs, bytes.
    acked: Vec<bool>,
    slot_pairs: Vec<u32>,
    slot_len: Vec<usize>,
    /// `KV_FIN_ACK` came.
    fin_acked: bool,
    /// Owner side: the batches this mapper announced, and how many were
    /// counted in this operation.
    announced: Option<u32>,
    counted: u32,
}

/// The open operation.
pub(crate) struct KvOp {
    seq: u32,
    config: KvConfig,
    table: Table,
    /// Per rank (as owner and as mapper).
    streams: Vec<Stream>,
    /// The batches, `WINDOW` slots of `chunk` bytes per owner.
    out: Vec<u8>,
    chunk: usize,
    /// Per rank: when a datagram of this operation last came from it.
    heard: Vec<Instant>,
    /// Finish started: every batch is sealed and FINs are out.
    finishing: bool,
    /// An abort that came while another call served this one: (blamed,
    /// mismatch, sender).
    aborted: Option<(usize, bool, usize)>,
    stats: KvStats,
    backoff: Backoff,
    /// XDP folds for this owner (kernel datapath).
    kernel: Option<KvOpKernel>,
    /// Scratch of one batch, to put its long keys last.
    reorder: Vec<u8>,
    /// Per owner: the mapper's combining table (empty without
    /// [`KvConfig::combine`]).
    combining: Vec<Table>,
}

impl KvOp {
    /// Where the ring slot of batch `b` to `owner` starts in `out`.
    fn slot_at(&self, owner: usize, b: u32) -> usize {
        (owner * WINDOW + b as usize % WINDOW) * self.chunk
    }

    /// The `op` byte of this operation's headers.
    fn op_code(&self) -> u8 {
        self.config.op.code()
    }

    fn name(&self) -> String {
        format!("key-value reduce #{}", self.seq)
    }

    fn describe(&self) -> String {
        format!(
            "key-value reduce of {} values, op {}, keys up to {} bytes",
            self.config.dtype, self.config.op, self.config.key_max
        )
    }
}

impl Comm {
    /// Opens a key-value reduce (collective: every rank opens it, with the
    /// same `config`, in the same order as its other collectives). Fails
    /// with [`Error::InvalidArgument`] when `config` is unusable or an
    /// operation is already open on this communicator; nothing is sent.
    pub fn kv_begin(&mut self, config: &KvConfig) -> Result<()> {
        config.check(self.chunk)?;
        if self.kv.op.is_some() {
            return Err(Error::InvalidArgument(
                "key-value reduce: one is already open on this communicator (finish it first)".into(),
            ));
        }
        let n = self.size();
        let seq = self.kv.seq.wrapping_add(1);
        self.kv.seq = seq;
        let now = Instant::now();
        let streams = (0..n)
            .map(|o| {
                let first = self.kv.next_batch[o];
                Stream {
                    first,
                    low: first,
                    next: first,
                    window: if self.group.peers[o].datapath == Datapath::Kernel { KERNEL_WINDOW } else { WINDOW },
                    fill: 0,
                    pairs: 0,
                    long: 0,
                    acked: vec![false; WINDOW],
                    slot_pairs: vec![0; WINDOW],
                    slot_len: vec![0; WINDOW],
                    fin_acked: o == self.rank(),
                    announced: None,
                    counted: 0,
                }
            })
            .collect();
        if self.kv.kernel.is_none() && self.datapath() == Datapath::Kernel {
            self.kv.kernel = KvKernel::open(self)?;
        }
        let kernel = match self.kv.kernel.as_mut() {
            Some(k) => {
                let capacity = u32::try_from(config.kernel_capacity).unwrap_or(u32::MAX);
                let table = if array_table_wanted() {
                    None
                } else {
                    Some(kvmap::create_hash(
                        "ab_kvtab",
                        std::mem::size_of::<KvKey>() as u32,
                        8,
                        capacity,
                        kvmap::BPF_F_NO_PREALLOC,
                    )?)
                };
                k.arm(seq, config, n, table.as_ref())?;
                Some(KvOpKernel { table, spilled: HashSet::new(), batches: vec![0; n], read_at: now })
            }
            None => None,
        };
        self.kv.op = Some(Box::new(KvOp {
            kernel,
            reorder: Vec::with_capacity(self.chunk),
            combining: (0..n).map(|_| Table::new(config.dtype, config.op)).collect(),
            seq,
            config: *config,
            table: Table::new(config.dtype, config.op),
            streams,
            out: vec![0; n * WINDOW * self.chunk],
            chunk: self.chunk,
            heard: vec![now; n],
            finishing: false,
            aborted: None,
            stats: KvStats::default(),
            backoff: Backoff::starting(KV_RTO_INITIAL, KV_RTO_MAX),
        }));
        Ok(())
    }

    /// Whether a key-value reduce is open on this communicator.
    pub fn kv_is_open(&self) -> bool {
        self.kv.op.is_some()
    }

    /// Emits `key_lens.len()` pairs into the open key-value reduce: key `i`
    /// is the next `key_lens[i]` bytes of `keys` (concatenated), its value
    /// `values[i]` (the 64 bits of the configured type). Any number of
    /// times, on any rank, between [`Comm::kv_begin`] and
    /// [`Comm::kv_finish`].
    ///
    /// Fails with [`Error::InvalidArgument`], emitting nothing of the
    /// batch, when no operation is open, `values` and `key_lens` differ in
    /// length, a key is empty or longer than the configured maximum, or the
    /// lengths do not add up to `keys.len()`. It may also fail as the
    /// collective does ([`Error::PeerFailed`], a mismatch), which closes the
    /// operation.
    pub fn kv_emit(&mut self, keys: &[u8], key_lens: &[u32], values: &[u64]) -> Result<()> {
        let Some(op) = self.kv.op.as_ref() else {
            return Err(Error::InvalidArgument("key-value emit: no key-value reduce is open (call begin first)".into()));
        };
        if op.finishing {
            return Err(Error::InvalidArgument("key-value emit: the operation is finishing".into()));
        }
        if key_lens.len() != values.len() {
            return Err(Error::InvalidArgument(format!(
                "key-value emit: {} key lengths but {} values",
                key_lens.len(),
                values.len()
            )));
        }
        let key_max = op.config.key_max;
        let mut total = 0usize;
        for (i, &len) in key_lens.iter().enumerate() {
            if len == 0 || len as usize > key_max {
                return Err(Error::InvalidArgument(format!(
                    "key-value emit: key {i} has {len} bytes; keys have 1 to {key_max} (the configured key_max)"
                )));
            }
            total += len as usize;
        }
        if total != keys.len() {
            return Err(Error::InvalidArgument(format!(
                "key-value emit: the key lengths add up to {total} bytes but keys has {}",
                keys.len()
            )));
        }
        let result = self.kv_emit_checked(keys, key_lens, values);
        self.kv_close_on_error(result)
    }

    fn kv_emit_checked(&mut self, keys: &[u8], key_lens: &[u32], values: &[u64]) -> Result<()> {
        let n = self.size();
        let me = self.rank();
        let mut at = 0usize;
        for (&len, &value) in key_lens.iter().zip(values) {
            let key = &keys[at..at + len as usize];
            at += len as usize;
            let owner = key_owner(key, n);
            let op = self.kv.op.as_mut().expect("open");
            op.stats.pairs_emitted += 1;
            if owner == me {
                op.stats.pairs_local += 1;
                op.table.fold(key, value);
                continue;
            }
            if op.config.combine {
                if op.combining[owner].fold(key, value) {
                    op.stats.pairs_combined += 1;
                } else if op.combining[owner].len() >= COMBINE_MAX {
                    self.kv_send_combined(owner)?;
                }
                continue;
            }
            self.kv_append(owner, key, value)?;
        }
        self.kv_flush_data()?;
        // Take what came meanwhile (acknowledgments, others' batches),
        // without waiting.
        self.kv_progress(Instant::now())
    }

    /// Packs what `owner`'s combining table holds into batches, and
    /// empties it.
    fn kv_send_combined(&mut self, owner: usize) -> Result<()> {
        let op = self.kv.op.as_mut().expect("open");
        let empty = Table::new(op.config.dtype, op.config.op);
        let mut table = std::mem::replace(&mut op.combining[owner], empty);
        let result = table.pairs().try_for_each(|(key, value)| self.kv_append(owner, key, value));
        table.clear();
        if let Some(op) = self.kv.op.as_mut() {
            op.combining[owner] = table;
        }
        result
    }

    /// Appends a pair to the batch being filled for `owner`, sealing it
    /// first when the pair does not fit.
    fn kv_append(&mut self, owner: usize, key: &[u8], value: u64) -> Result<()> {
        {
            let op = self.kv.op.as_mut().expect("open");
            let need = PAIR_OVERHEAD + key.len();
            if op.streams[owner].fill + need > op.chunk {
                self.kv_seal(owner)?;
            }
            let op = self.kv.op.as_mut().expect("open");
            let stream = &op.streams[owner];
            let start = op.slot_at(owner, stream.next) + stream.fill;
            let pair = &mut op.out[start..start + need];
            pair[..2].copy_from_slice(&(key.len() as u16).to_le_bytes());
            pair[2..10].copy_from_slice(&value.to_le_bytes());
            pair[10..].copy_from_slice(key);
            let stream = &mut op.streams[owner];
            stream.fill += need;
            stream.pairs += 1;
            stream.long += u32::from(key.len() > KERNEL_KEY);
        }
        Ok(())
    }

    /// Seals the batch being filled for `owner` and queues it; waits for
    /// acknowledgments first while the window to `owner` is full.
    fn kv_seal(&mut self, owner: usize) -> Result<()> {
        loop {
            let op = self.kv.op.as_ref().expect("open");
            let stream = &op.streams[owner];
            // The ring holds batches low..=next (next is being filled):
            // the one after it needs a free slot.
            if (stream.next.wrapping_sub(stream.low) as usize) + 1 < stream.window {
                break;
            }
            // The window is full: the oldest batch is not acknowledged yet.
            let due = op.backoff.due();
            self.kv_flush_data()?;
            self.kv_progress(due)?;
            if self.kv.op.as_mut().expect("open").backoff.fire() {
                let timeout = self.timeout();
                self.kv_check_silent(timeout, timeout + receiver_grace(timeout))?;
                self.kv_resend()?;
            }
        }
        let header = self.kv_header(Kind::KvData);
        let op = self.kv.op.as_mut().expect("open");
        if op.streams[owner].long > 0 {
            // Keys longer than the kernel key last: an owner's XDP folds the
            // pairs before them and spills only those.
            let start = op.slot_at(owner, op.streams[owner].next);
            let fill = op.streams[owner].fill;
            long_keys_last(&mut op.out[start..start + fill], &mut op.reorder);
        }
        let stream = &mut op.streams[owner];
        stream.long = 0;
        let b = stream.next;
        let slot = b as usize % WINDOW;
        stream.acked[slot] = false;
        stream.slot_pairs[slot] = stream.pairs;
        stream.slot_len[slot] = stream.fill;
        stream.next = b.wrapping_add(1);
        stream.fill = 0;
        stream.pairs = 0;
        op.stats.batches_sent += 1;
        self.kv.next_batch[owner] = b.wrapping_add(1);
        self.kv_queue_batch(header, owner, b, false)
    }

    /// Queues batch `b` to `owner` (its bytes in the ring), flushing when
    /// the transport's batch is full.
    fn kv_queue_batch(&mut self, mut header: Header, owner: usize, b: u32, again: bool) -> Result<()> {
        let op = self.kv.op.as_ref().expect("open");
        let slot = b as usize % WINDOW;
        let start = op.slot_at(owner, b);
        header.chunk = b;
        header.count = op.streams[owner].slot_pairs[slot];
        if again {
            header.flags |= FLAG_RETRANSMIT;
        }
        let range = start..start + op.streams[owner].slot_len[slot];
        let to = self.group.peers[owner].addr();
        // A kernel owner folds batches one datagram at a time: a
        // super-packet of them would go up to its process whole.
        let full = if self.group.peers[owner].datapath == Datapath::Kernel {
            self.transport.queue_alone(&header, range, to)
        } else {
            self.transport.queue(&header, range, to)
        };
        if full {
            self.kv_flush_data()?;
        }
        Ok(())
    }

    /// Sends what the transport queued, the payloads from the batch ring.
    fn kv_flush_data(&mut self) -> Result<()> {
        let out: &[u8] = self.kv.op.as_ref().map_or(&[], |op| &op.out);
        let sent = self.transport.flush(out)?;
        self.user_stats.packets_sent += sent as u64;
        Ok(())
    }

    /// A header of the open operation.
    fn kv_header(&self, kind: Kind) -> Header {
        let op = self.kv.op.as_ref().expect("open");
        let mut header = self.header(kind, op.seq);
        header.dtype = op.config.dtype.code();
        header.op = op.op_code();
        header.nchunks = op.config.key_max as u32;
        header
    }

    /// Closes the open operation when `result` is an error.
    fn kv_close_on_error<T>(&mut self, result: Result<T>) -> Result<T> {
        if result.is_err() {
            if let Some(op) = self.kv.op.take() {
                if let (Some(_), Some(k)) = (op.kernel.as_ref(), self.kv.kernel.as_mut()) {
                    k.disarm();
                }
            }
        }
        result
    }

    /// Batches of `mapper` this owner counted in the open operation: by
    /// itself, and (kernel datapath) by XDP, as last read.
    fn kv_counted(&self, mapper: usize) -> u32 {
        let op = self.kv.op.as_ref().expect("open");
        let kernel = op.kernel.as_ref().map_or(0, |k| k.batches[mapper] as u32);
        op.streams[mapper].counted.wrapping_add(kernel)
    }

    /// Kernel datapath: reads what XDP counted for the mappers whose
    /// `KV_FIN` came and whose batches are not all counted (`only`: that
    /// one), and answers those now complete. At most every millisecond
    /// unless `only` is given.
    fn kv_refresh_kernel(&mut self, only: Option<usize>) -> Result<()> {
        let me = self.rank();
        let Some(op) = self.kv.op.as_ref() else { return Ok(()) };
        let Some(kop) = op.kernel.as_ref() else { return Ok(()) };
        if only.is_none() && kop.read_at.elapsed() < KERNEL_POLL {
            return Ok(());
        }
        let waiting: Vec<usize> = (0..self.size())
            .filter(|&m| m != me && only.is_none_or(|o| o == m))
            .filter(|&m| op.streams[m].announced.is_some_and(|a| a != self.kv_counted(m)))
            .collect();
        let Some(kernel) = self.kv.kernel.as_ref() else { return Ok(()) };
        let mut counts = Vec::with_capacity(waiting.len());
        for &m in &waiting {
            counts.push((m, kernel.count(m)?.batches));
        }
        let op = self.kv.op.as_mut().expect("open");
        let kop = op.kernel.as_mut().expect("kernel");
        kop.read_at = Instant::now();
        for &(m, batches) in &counts {
            kop.batches[m] = batches;
        }
        let fin = self.kv_header(Kind::KvFin);
        for (m, _) in counts {
            if self.kv.op.as_ref().expect("open").streams[m].announced == Some(self.kv_counted(m)) {
                self.kv_send_fin_ack(&fin, m)?;
            }
        }
        Ok(())
    }

    /// Ends the open key-value reduce (collective) and returns the reduced
    /// pairs of the keys this rank owns. It returns once this rank has
    /// counted every batch each mapper says it sent it, and every owner
    /// has counted every batch this rank sent it. Fails with
    /// [`Error::PeerFailed`] naming a rank that stopped answering within
    /// the timeout, with [`Error::Mismatch`] on every rank when the ranks'
    /// configurations disagree, and with [`Error::InvalidArgument`] when no
    /// operation is open. The operation is closed either way.
    pub fn kv_finish(&mut self) -> Result<KvResult> {
        if self.kv.op.is_none() {
            return Err(Error::InvalidArgument(
                "key-value finish: no key-value reduce is open (call begin first; a failed emit closes it)".into(),
            ));
        }
        let result = self.kv_finish_open();
        let result = self.kv_close_on_error(result)?;
        Ok(result)
    }

    fn kv_finish_open(&mut self) -> Result<KvResult> {
        let n = self.size();
        let me = self.rank();
        // Send what is combined, seal what is left, then tell every owner
        // how many batches it got.
        for owner in (0..n).filter(|&o| o != me) {
            self.kv_send_combined(owner)?;
            if self.kv.op.as_ref().expect("open").streams[owner].fill > 0 {
                self.kv_seal(owner)?;
            }
        }
        self.kv_flush_data()?;
        self.kv.op.as_mut().expect("open").finishing = true;
        self.kv_send_fins(false)?;
        let timeout = self.timeout();
        let silence = timeout + receiver_grace(timeout);
        loop {
            self.kv_check_abort()?;
            self.kv_refresh_kernel(None)?;
            if self.kv_complete() {
                break;
            }
            let mut due = self.kv.op.as_ref().expect("open").backoff.due();
            if self.kv_kernel_waiting() {
                // XDP counts the batches still missing, and nothing wakes
                // this process when it has: look again within 1 ms, not at
                // the retransmission timeout (up to 50 ms).
                due = due.min(Instant::now() + KERNEL_POLL);
            }
            self.kv_progress(due)?;
            if self.kv.op.as_mut().expect("open").backoff.fire() {
                self.kv_check_silent(timeout, silence)?;
                self.kv_resend()?;
                self.kv_send_fins(true)?;
            }
        }
        self.flush_queued()?;
        let mut op = self.kv.op.take().expect("open");
        self.kv.last_done = Some(op.seq);
        if let (Some(kop), Some(kernel)) = (op.kernel.take(), self.kv.kernel.as_mut()) {
            // Every batch is counted, so XDP folds nothing more for this
            // operation: disarm, then take the kernel table out.
            kernel.disarm();
            for mapper in (0..self.config.world_size).filter(|&m| m != self.config.rank) {
                op.stats.pairs_folded_kernel += kernel.count(mapper)?.pairs;
            }
            let table = &mut op.table;
            match (&kop.table, kernel.array.as_mut()) {
                (Some(hash), _) => kvmap::drain(hash, std::mem::size_of::<KvKey>(), DRAIN_BATCH, |key, value| {
                    let len = u32::from_ne_bytes(key[..4].try_into().expect("4 bytes")) as usize;
                    table.fold(&key[4..4 + len.min(KERNEL_KEY)], value);
                })?,
                (None, Some(array)) => array.drain(table),
                (None, None) => return Err(Error::Internal("key-value reduce: the array table is gone".into())),
            }
        }
        let stats = op.stats;
        Ok(op.table.into_result(stats))
    }

    /// Kernel datapath: whether a mapper's `KV_FIN` came and XDP has not
    /// counted all its batches yet (as last read).
    fn kv_kernel_waiting(&self) -> bool {
        let me = self.rank();
        let op = self.kv.op.as_ref().expect("open");
        op.kernel.is_some()
            && (0..self.size()).any(|m| m != me && op.streams[m].announced.is_some_and(|a| a != self.kv_counted(m)))
    }

    /// Whether the open operation is complete at this rank.
    fn kv_complete(&self) -> bool {
        let op = self.kv.op.as_ref().expect("open");
        let me = self.rank();
        op.streams.iter().enumerate().all(|(r, s)| r == me || (s.fin_acked && s.announced == Some(self.kv_counted(r))))
    }

    /// Sends `KV_FIN` to every owner that has not answered it.
    fn kv_send_fins(&mut self, again: bool) -> Result<()> {
        let mut header = self.kv_header(Kind::KvFin);
        if again {
            header.flags |= FLAG_RETRANSMIT;
        }
        let me = self.rank();
        for owner in 0..self.size() {
            let stream = &self.kv.op.as_ref().expect("open").streams[owner];
            if owner == me || stream.fin_acked {
                continue;
            }
            header.count = stream.next.wrapping_sub(stream.first);
            self.queue_control(&header, owner)?;
        }
        self.flush_queued()
    }

    /// Sends again, per owner, the oldest batches not acknowledged.
    fn kv_resend(&mut self) -> Result<()> {
        let header = self.kv_header(Kind::KvData);
        let me = self.rank();
        for owner in (0..self.size()).filter(|&o| o != me) {
            let op = self.kv.op.as_ref().expect("open");
            let stream = &op.streams[owner];
            if stream.fin_acked {
                continue;
            }
            let (low, next) = (stream.low, stream.next);
            let mut resent = 0;
            let mut b = low;
            while b != next && resent < RESEND_MAX {
                let acked = self.kv.op.as_ref().expect("open").streams[owner].acked[b as usize % WINDOW];
                if !acked {
                    self.kv_queue_batch(header, owner, b, true)?;
                    resent += 1;
                }
                b = b.wrapping_add(1);
            }
            let op = self.kv.op.as_mut().expect("open");
            op.stats.retransmits += resent as u64;
            self.user_stats.retransmits += resent as u64;
        }
        self.kv_flush_data()
    }

    /// Fails when a rank this one waits for has been silent too long: a
    /// mapper whose batches are not all counted for the timeout, an owner
    /// that has not counted this rank's for the timeout and a grace (it may
    /// itself be waiting for someone, and will say so).
    fn kv_check_silent(&mut self, timeout: Duration, silence: Duration) -> Result<()> {
        let now = Instant::now();
        let me = self.rank();
        let op = self.kv.op.as_ref().expect("open");
        let mut blamed = None;
        for (r, s) in op.streams.iter().enumerate().filter(|(r, _)| *r != me) {
            let quiet = now.duration_since(op.heard[r]);
            if s.announced != Some(self.kv_counted(r)) && quiet >= timeout {
                blamed = Some((r, "its batches did not all come"));
                break;
            }
        }
        if blamed.is_none() {
            for (r, s) in op.streams.iter().enumerate().filter(|(r, _)| *r != me) {
                let waiting = !s.fin_acked && (op.finishing || s.low != s.next);
                if waiting && now.duration_since(op.heard[r]) >= silence {
                    blamed = Some((r, "it did not acknowledge this rank's batches"));
                    break;
                }
            }
        }
        let Some((rank, why)) = blamed else { return Ok(()) };
        let name = op.name();
        self.kv_abort(rank, false)?;
        Err(Error::PeerFailed {
            rank,
            what: format!("{name}: {why} within {} ms (rank {me} gave up)", timeout.as_millis()),
        })
    }

    /// Tells every other rank that the open operation failed because of
    /// `blamed`.
    fn kv_abort(&mut self, blamed: usize, mismatch: bool) -> Result<()> {
        let mut header = self.kv_header(Kind::KvAbort);
        header.count = blamed as u32;
        if mismatch {
            header.flags |= FLAG_MISMATCH;
        }
        let me = self.rank();
        for _ in 0..ABORT_COPIES {
            for rank in (0..self.size()).filter(|&r| r != me) {
                self.queue_control(&header, rank)?;
            }
        }
        self.flush_queued()
    }

    /// Fails if an abort of the open operation came.
    fn kv_check_abort(&mut self) -> Result<()> {
        let op = self.kv.op.as_ref().expect("open");
        let Some((blamed, mismatch, sender)) = op.aborted else { return Ok(()) };
        Err(if mismatch {
            Error::Mismatch(format!(
                "{}: the ranks' calls disagree (rank {blamed} found it; rank {sender} said so); rank {} called {}",
                op.name(),
                self.rank(),
                op.describe()
            ))
        } else {
            Error::PeerFailed {
                rank: blamed,
                what: format!("{}: rank {sender} gave up on it because rank {blamed} failed", op.name()),
            }
        })
    }

    /// Handles what arrives until `deadline` (at least what is queued on
    /// the socket already), then fails if an abort came.
    fn kv_progress(&mut self, deadline: Instant) -> Result<()> {
        let mut until = deadline;
        while let Some(got) = self.recv_valid(until)? {
            let progress = match got.kind {
                Kind::KvData | Kind::KvAck | Kind::KvFin | Kind::KvFinAck | Kind::KvAbort => self.kv_on(&got)?,
                _ => {
                    self.serve_stale(&got)?;
                    false
                }
            };
            if progress {
                if let Some(op) = self.kv.op.as_mut() {
                    op.backoff = Backoff::starting(KV_RTO_INITIAL, KV_RTO_MAX);
                }
            }
            // Then what else is queued already, without waiting.
            until = Instant::now();
        }
        self.flush_queued()?;
        if self.kv.op.is_some() {
            self.kv_check_abort()?;
        }
        Ok(())
    }

    /// A key-value datagram outside the key-value calls (another
    /// collective, or closing, is receiving): handled the same way.
    pub(crate) fn serve_stale_kv(&mut self, got: &Received) -> Result<bool> {
        self.kv_on(got)?;
        Ok(true)
    }

    /// Handles a key-value datagram; returns whether it was progress of
    /// the open operation. An abort of it is recorded (and raised by the
    /// caller, [`Comm::kv_check_abort`]).
    fn kv_on(&mut self, got: &Received) -> Result<bool> {
        let header = got.header;
        let sender = header.sender as usize;
        let open = self.kv.op.as_ref().map(|op| op.seq);
        let current = open == Some(header.seq);
        if current {
            self.kv.op.as_mut().expect("open").heard[sender] = Instant::now();
            if got.kind != Kind::KvAbort {
                self.kv_check(&header)?;
            }
        }
        match got.kind {
            Kind::KvData => self.kv_on_data(got, current),
            Kind::KvAck if current => {
                let op = self.kv.op.as_mut().expect("open");
                let stream = &mut op.streams[sender];
                let b = header.chunk;
                let inside = seq_at_or_before(stream.low, b) && !seq_at_or_before(stream.next, b);
                if !inside || stream.acked[b as usize % WINDOW] {
                    self.user_stats.duplicates += 1;
                    return Ok(false);
                }
                stream.acked[b as usize % WINDOW] = true;
                while stream.low != stream.next && stream.acked[stream.low as usize % WINDOW] {
                    stream.low = stream.low.wrapping_add(1);
                }
                Ok(true)
            }
            Kind::KvFin if current => {
                let op = self.kv.op.as_mut().expect("open");
                op.streams[sender].announced = Some(header.count);
                if op.kernel.is_some() && self.kv_counted(sender) != header.count {
                    // XDP may have counted the rest (it answers it then).
                    return self.kv_refresh_kernel(Some(sender)).map(|()| true);
                }
                if self.kv_counted(sender) == header.count {
                    self.kv_send_fin_ack(&header, sender)?;
                }
                Ok(true)
            }
            Kind::KvFin => {
                // A repeat for an operation completed here (its answer was
                // lost): answer again. One not begun yet: it comes again.
                if self.kv.last_done.is_some_and(|done| seq_at_or_before(header.seq, done)) {
                    self.user_stats.duplicates += 1;
                    self.kv_send_fin_ack(&header, sender)?;
                }
                Ok(false)
            }
            Kind::KvFinAck if current => {
                let stream = &mut self.kv.op.as_mut().expect("open").streams[sender];
                if stream.fin_acked {
                    self.user_stats.duplicates += 1;
                    return Ok(false);
                }
                stream.fin_acked = true;
                Ok(true)
            }
            Kind::KvAbort if current => {
                let op = self.kv.op.as_mut().expect("open");
                if op.aborted.is_none() {
                    op.aborted = Some((header.count as usize, header.flags & FLAG_MISMATCH != 0, sender));
                }
                Ok(true)
            }
            _ => Ok(false),
        }
    }

    /// Checks a datagram of the open operation against it: on a mismatch,
    /// tells every rank and fails.
    fn kv_check(&mut self, header: &Header) -> Result<()> {
        let op = self.kv.op.as_ref().expect("open");
        let ours = (op.config.dtype.code(), op.op_code(), op.config.key_max as u32);
        let key_max = if header.flags & FLAG_KV_SPILL != 0 { header.nchunks & 0xffff } else { header.nchunks };
        let theirs = (header.dtype, header.op, key_max);
        if ours == theirs {
            return Ok(());
        }
        let what = format!(
            "{}: rank {} sent dtype code {}, op code {}, key_max {}; rank {} called {}: mismatched collective calls",
            op.name(),
            header.sender,
            header.dtype,
            header.op,
            header.nchunks,
            self.rank(),
            op.describe()
        );
        self.kv_abort(self.rank(), true)?;
        Err(Error::Mismatch(what))
    }

    /// A batch: counted and folded once, acknowledged every time it
    /// comes once counted.
    fn kv_on_data(&mut self, got: &Received, current: bool) -> Result<bool> {
        let header = got.header;
        let mapper = header.sender as usize;
        let b = header.chunk;
        if self.kv.kernel.is_some() {
            return self.kv_on_spill(got, current);
        }
        match self.kv.counted[mapper].has(b) {
            Some(true) => {
                // Counted before; its acknowledgment was lost.
                self.user_stats.duplicates += 1;
                if let Some(op) = self.kv.op.as_mut() {
                    op.stats.duplicates += 1;
                }
                self.kv_send_ack(&header, mapper)?;
                return Ok(false);
            }
            // Beyond the window, or of an operation not open here: it
            // comes again.
            None => return Ok(false),
            Some(false) if !current => return Ok(false),
            Some(false) => {}
        }
        let payload = match self.transport.datagram(got.slot) {
            Some(datagram) => &datagram.bytes[crate::wire::HDR_LEN..],
            None => &[],
        };
        let op = self.kv.op.as_mut().expect("open");
        let Some(pairs) = fold_batch(&mut op.table, payload, header.count, op.config.key_max) else {
            tracing::debug!(mapper, batch = b, "a malformed key-value batch");
            self.user_stats.dropped_malformed += 1;
            return Ok(false);
        };
        op.stats.pairs_folded_user += pairs;
        let stream = &mut op.streams[mapper];
        stream.counted += 1;
        let finished = stream.announced == Some(stream.counted);
        self.kv.counted[mapper].mark(b);
        self.kv_send_ack(&header, mapper)?;
        if finished {
            let fin = self.kv_header(Kind::KvFin);
            self.kv_send_fin_ack(&fin, mapper)?;
        }
        Ok(true)
    }

    /// Kernel datapath: a batch that reached the socket. XDP keeps the
    /// window of counted batches here, so only a spilled batch (flagged
    /// `KV_SPILL`, its first pairs folded by XDP) is the process's: it
    /// folds the rest, once. XDP holds off (drops) a new batch of an
    /// operation it is not armed for, so any other is odd (counted as
    /// `batches_unarmed`, dropped: it comes again).
    fn kv_on_spill(&mut self, got: &Received, current: bool) -> Result<bool> {
        let header = got.header;
        let mapper = header.sender as usize;
        let b = header.chunk;
        if header.flags & FLAG_KV_SPILL == 0 {
            if let Some(op) = self.kv.op.as_mut() {
                op.stats.batches_unarmed += 1;
            }
            return Ok(false);
        }
        let folded = header.nchunks >> 16;
        let repeat = match self.kv.op.as_ref().and_then(|op| op.kernel.as_ref()) {
            // A spilled batch of an earlier operation: that one completed
            // here, so it was counted.
            _ if !current => true,
            Some(kop) => kop.spilled.contains(&(header.sender, b)),
            None => true,
        };
        if repeat {
            self.user_stats.duplicates += 1;
            if let Some(op) = self.kv.op.as_mut() {
                op.stats.duplicates += 1;
            }
            self.kv_send_ack(&header, mapper)?;
            return Ok(false);
        }
        let payload = match self.transport.datagram(got.slot) {
            Some(datagram) => &datagram.bytes[crate::wire::HDR_LEN..],
            None => &[],
        };
        let op = self.kv.op.as_mut().expect("open");
        let Some(pairs) = fold_batch_from(&mut op.table, payload, header.count, op.config.key_max, folded) else {
            tracing::debug!(mapper, batch = b, "a malformed key-value batch");
            self.user_stats.dropped_malformed += 1;
            return Ok(false);
        };
        op.stats.spilled += pairs;
        op.kernel.as_mut().expect("kernel").spilled.insert((header.sender, b));
        op.streams[mapper].counted += 1;
        self.kv_send_ack(&header, mapper)?;
        if self.kv.op.as_ref().expect("open").streams[mapper].announced == Some(self.kv_counted(mapper)) {
            let fin = self.kv_header(Kind::KvFin);
            self.kv_send_fin_ack(&fin, mapper)?;
        }
        Ok(true)
    }

    /// Queues `KV_ACK` of the batch of `data` to its mapper.
    fn kv_send_ack(&mut self, data: &Header, mapper: usize) -> Result<()> {
        let mut header = self.header(Kind::KvAck, data.seq);
        header.dtype = data.dtype;
        header.op = data.op;
        header.nchunks = if data.flags & FLAG_KV_SPILL != 0 { data.nchunks & 0xffff } else { data.nchunks };
        header.chunk = data.chunk;
        self.queue_control(&header, mapper)
    }

    /// Queues `KV_FIN_ACK` of operation `fin.seq` to `mapper`.
    fn kv_send_fin_ack(&mut self, fin: &Header, mapper: usize) -> Result<()> {
        let mut header = self.header(Kind::KvFinAck, fin.seq);
        header.dtype = fin.dtype;
        header.op = fin.op;
        header.nchunks = fin.nchunks;
        self.queue_control(&header, mapper)
    }
}

/// Reorders the well-formed pairs of `batch` so that those whose keys are
/// longer than [`KERNEL_KEY`] come last (each group in its order), with
/// `scratch` as room.
fn long_keys_last(batch: &mut [u8], scratch: &mut Vec<u8>) {
    scratch.clear();
    for long in [false, true] {
        let mut at = 0;
        while at + PAIR_OVERHEAD <= batch.len() {
            let len = u16::from_le_bytes([batch[at], batch[at + 1]]) as usize;
            let end = at + PAIR_OVERHEAD + len;
            if (len > KERNEL_KEY) == long {
                scratch.extend_from_slice(&batch[at..end]);
            }
            at = end;
        }
    }
    batch.copy_from_slice(scratch);
}

/// XDP ingress loaded (not attached) as on a key-value owner's host, for
/// `BPF_PROG_TEST_RUN` of the fold: private shared maps in a scratch pin
/// directory `tag` (removed again: the fds hold them), the two-rank group
/// `group`/`token` registered with rank 0, this owner, at 10.77.0.1:47001 on
/// control slot 0 and rank 1 at 10.77.0.2:47002, and the pinned maps `maps`
/// opened, in order. The object is XDP ingress's, or with `tc` TC
/// ingress's as the TC hooks load it (the first program a datagram meets).
pub(crate) fn test_owner<const N: usize>(
    tag: &str,
    group: u32,
    token: u64,
    maps: [&str; N],
    tc: bool,
) -> Result<(aya::Ebpf, crate::loader::SharedMaps, [OwnedFd; N])> {
    use crate::rendezvous::{GroupInfo, PeerInfo};
    let dir = crate::loader::bpffs_root()?.join(format!("aggbox-{tag}-{}", std::process::id()));
    std::fs::create_dir_all(&dir).map_err(|e| Error::system(format!("creating {}", dir.display()), e))?;
    let opened = (|| -> Result<_> {
        let mut obj;
        if tc {
            obj = crate::loader::load_object(crate::bpf::TC_INGRESS, &dir, true)?;
            let program: &mut aya::programs::SchedClassifier = obj
                .program_mut(crate::bpf::programs::TC_INGRESS)
                .ok_or_else(|| Error::Internal("TC ingress missing from its object".into()))?
                .try_into()
                .map_err(|e| Error::Internal(format!("TC ingress: {e}")))?;
            program.load().map_err(|e| Error::Unsupported(format!("loading TC ingress: {e}")))?;
        } else {
            obj = crate::loader::load_object(crate::bpf::XDP_INGRESS, &dir, false)?;
            crate::loader::load_xdp(&mut obj)?;
        }
        let mut shared = crate::loader::SharedMaps::open(&dir)?;
        let peer = |rank: usize, last: u8, port| PeerInfo {
            rank,
            ipv4: std::net::Ipv4Addr::new(10, 77, 0, last),
            mac: [2, 0, 0, 0, 0, last],
            port,
            datapath: Datapath::Kernel,
            mtu: 1500,
        };
        shared.insert_group(&GroupInfo { group, token, peers: vec![peer(0, 1, 47_001), peer(1, 2, 47_002)] })?;
        let port = crate::maps::PortKey { ipv4: u32::from(std::net::Ipv4Addr::new(10, 77, 0, 1)).to_be(), port: 47_001, reserved: 0 };
        shared.insert_port(port, group, 0)?;
        let fds = maps.iter().map(|name| kvmap::open_pinned(&dir.join(name))).collect::<Result<Vec<_>>>()?;
        let fds: [OwnedFd; N] = fds.try_into().map_err(|_| Error::Internal("test_owner: map count".into()))?;
        Ok((obj, shared, fds))
    })();
    crate::loader::tear_down(&dir);
    opened
}

/// Folds the `count` pairs of a batch's `payload` into `table`; returns
/// how many, or `None` (nothing folded) when the payload is not `count`
/// well-formed pairs of keys of 1 to `key_max` bytes.
fn fold_batch(table: &mut Table, payload: &[u8], count: u32, key_max: usize) -> Option<u64> {
    fold_batch_from(table, payload, count, key_max, 0)
}

/// [`fold_batch`] of all pairs but the first `skip` (folded elsewhere);
/// returns how many it folded.
fn fold_batch_from(table: &mut Table, payload: &[u8], count: u32, key_max: usize, skip: u32) -> Option<u64> {
    if skip > count {
        return None;
    }
    // Checked whole first, so a malformed batch folds nothing.
    let mut at = 0;
    for _ in 0..count {
        let len = u16::from_le_bytes(payload.get(at..at + 2)?.try_into().ok()?) as usize;
        if len == 0 || len > key_max {
            return None;
        }
        at += PAIR_OVERHEAD + len;
        if at > payload.len() {
            return None;
        }
    }
    if at != payload.len() {
        return None;
    }
    let mut at = 0;
    for i in 0..count {
        let len = u16::from_le_bytes([payload[at], payload[at + 1]]) as usize;
        let value = u64::from_le_bytes(payload[at + 2..at + 10].try_into().expect("8 bytes"));
        if i >= skip {
            table.fold(&payload[at + 10..at + 10 + len], value);
        }
        at += PAIR_OVERHEAD + len;
    }
    Some(u64::from(count - skip))
}

#[cfg(test)]
mod tests {
    use std::collections::HashMap;

    use super::*;
    use crate::comm::testing::ranks;

    /// splitmix64.
    fn mix(mut z: u64) -> u64 {
        z = z.wrapping_add(0x9E37_79B9_7F4A_7C15);
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    /// Rank `rank`'s pairs: `count` keys drawn from `distinct`, of 1 to 40
    /// bytes.
    fn pairs(rank: usize, count: usize, distinct: u64) -> (Vec<u8>, Vec<u32>, Vec<u64>) {
        let (mut keys, mut lens, mut values) = (Vec::new(), Vec::new(), Vec::new());
        for i in 0..count {
            let h = mix((rank as u64) << 32 | i as u64);
            let id = h % distinct;
            let key = format!("k{id}-{}", "x".repeat((mix(id) % 34) as usize));
            keys.extend_from_slice(key.as_bytes());
            lens.push(key.len() as u32);
            values.push(h >> 40);
        }
        (keys, lens, values)
    }

    #[test]
    fn fnv1a_is_the_documented_hash() {
        assert_eq!(key_hash(b""), 0xcbf2_9ce4_8422_2325);
        assert_eq!(key_hash(b"a"), 0xaf63_dc4c_8601_ec8c);
        assert_eq!(key_hash(b"foobar"), 0x8594_4171_f739_67e8);
    }

    /// A KV_DATA frame from rank 1 (10.77.0.2:47002) to rank 0
    /// (10.77.0.1:47001) of group `GROUP`: batch `batch` of operation
    /// `seq` holding `pairs`, with i64 SUM and key_max 64.
    fn kv_frame(seq: u32, batch: u32, pairs: &[(&[u8], u64)]) -> Vec<u8> {
        kv_frame_with(seq, batch, pairs, &[])
    }

    /// [`kv_frame`] with `trailing` bytes after the last pair.
    fn kv_frame_with(seq: u32, batch: u32, pairs: &[(&[u8], u64)], trailing: &[u8]) -> Vec<u8> {
        let mut body = Vec::new();
        for (key, value) in pairs {
            body.extend_from_slice(&(key.len() as u16).to_le_bytes());
            body.extend_from_slice(&value.to_le_bytes());
            body.extend_from_slice(key);
        }
        body.extend_from_slice(trailing);
        let mut header = Header::new(Kind::KvData, TEST_GROUP, TEST_TOKEN, 1, seq);
        header.dtype = Dtype::I64.code();
        header.op = ReduceOp::Sum.code();
        header.nchunks = 64;
        header.chunk = batch;
        header.count = pairs.len() as u32;
        let mut udp_payload = vec![0u8; crate::wire::HDR_LEN];
        header.write_to(&mut udp_payload);
        udp_payload.extend_from_slice(&body);
        let mut udp = Vec::new();
        udp.extend_from_slice(&47_002u16.to_be_bytes());
        udp.extend_from_slice(&47_001u16.to_be_bytes());
        udp.extend_from_slice(&(8 + udp_payload.len() as u16).to_be_bytes());
        udp.extend_from_slice(&[0, 0]);
        udp.extend_from_slice(&udp_payload);
        let mut ip = vec![0x45, 0];
        ip.extend_from_slice(&(20 + udp.len() as u16).to_be_bytes());
        ip.extend_from_slice(&[0, 1, 0x40, 0, 64, 17, 0, 0, 10, 77, 0, 2, 10, 77, 0, 1]);
        let mut sum: u32 = ip.chunks(2).map(|w| u32::from(u16::from_be_bytes([w[0], w[1]]))).sum();
        while sum > 0xffff {
            sum = (sum & 0xffff) + (sum >> 16);
        }
        ip[10..12].copy_from_slice(&(!(sum as u16)).to_be_bytes());
        ip.extend_from_slice(&udp);
        let mut frame = vec![2, 0, 0, 0, 0, 1, 2, 0, 0, 0, 0, 2, 0x08, 0x00];
        frame.extend_from_slice(&ip);
        frame
    }

    const TEST_GROUP: u32 = 0x0a0b_0c0d;
    const TEST_TOKEN: u64 = 0x1234_5678_9abc_def0;

    fn kernel_value(table: &OwnedFd, key: &[u8]) -> Option<u64> {
        let mut k = KvKey { len: key.len() as u32, ..KvKey::default() };
        k.bytes[..key.len()].copy_from_slice(key);
        let mut value = 0u64;
        kvmap::lookup(table, &k, &mut value, "test lookup").ok().map(|()| value)
    }

    /// The first program batches meet: XDP ingress on the XDP hooks, TC
    /// ingress on the TC hooks; one body (`aggbox_kv_data`), two sets of
    /// verdicts.
    struct First {
        tc: bool,
        program: &'static str,
        /// Up to the process.
        pass: u32,
        /// Consumed.
        drop: u32,
        /// Sent back out as the KV_ACK.
        ack: u32,
    }

    const XDP_FIRST: First = First {
        tc: false,
        program: crate::bpf::programs::XDP_INGRESS,
        pass: crate::testrun::xdp::PASS,
        drop: crate::testrun::xdp::DROP,
        ack: crate::testrun::xdp::TX,
    };
    const TC_FIRST: First = First {
        tc: true,
        program: crate::bpf::programs::TC_INGRESS,
        pass: crate::testrun::tc::OK,
        drop: crate::testrun::tc::SHOT,
        ack: crate::testrun::tc::REDIRECT,
    };

    #[test]
    fn xdp_folds_acknowledges_and_spills_crafted_batches() {
        folds_acknowledges_and_spills_crafted_batches(&XDP_FIRST, "kvtest-xdp");
    }

    #[test]
    fn tc_folds_acknowledges_and_spills_crafted_batches() {
        folds_acknowledges_and_spills_crafted_batches(&TC_FIRST, "kvtest-tc");
    }

    #[test]
    fn xdp_folds_crafted_batches_into_an_array_table() {
        folds_crafted_batches_into_an_array_table(&XDP_FIRST, "kvarrtest-xdp");
    }

    #[test]
    fn tc_folds_crafted_batches_into_an_array_table() {
        folds_crafted_batches_into_an_array_table(&TC_FIRST, "kvarrtest-tc");
    }

    /// The first program alone (BPF_PROG_TEST_RUN) on crafted KV_DATA
    /// frames at an armed owner: a batch is folded into the kernel table
    /// and turned into its KV_ACK (sent back); its repeat is acknowledged
    /// and not folded again; a batch whose last key is longer than 32 bytes
    /// folds the rest and goes up flagged KV_SPILL (again on a repeat); a
    /// full table spills from the first new key; a new batch of an
    /// operation not armed (yet) is held off (dropped unacknowledged) and
    /// folded once armed; one of the armed operation with another dtype
    /// goes up; a count beyond the pairs and bytes after the last pair go
    /// up with what was folded.
    fn folds_acknowledges_and_spills_crafted_batches(at: &First, tag: &str) {
        use crate::testrun::test_run;
        let (obj, _maps, [kvctl, kvtabs, kvcount]) =
            test_owner(tag, TEST_GROUP, TEST_TOKEN, [names::KVCTL, names::KVTABS, names::KVCOUNT], at.tc).unwrap();
        let table = kvmap::create_hash("ab_kvtab", size_of_key(), 8, 4, kvmap::BPF_F_NO_PREALLOC).unwrap();
        let fd = std::os::fd::AsRawFd::as_raw_fd(&table) as u32;
        kvmap::update(&kvtabs, &0u32, &fd, "kvtabs").unwrap();
        let arming = KvCtl { seq: 1, group: TEST_GROUP, rank: 0, key_max: 64, dtype: Dtype::I64.code(), op: 0, fold: 1, ..KvCtl::default() };
        kvmap::update(&kvctl, &0u32, &arming, "kvctl").unwrap();
        let program = obj.program(at.program).unwrap();
        let run = |frame: &[u8]| test_run(program.fd().unwrap().as_fd(), frame).unwrap();
        use std::os::fd::AsFd;

        let frame = kv_frame(1, 1, &[(b"cat", 2), (b"dog", 5), (b"cat", 1)]);
        let out = run(&frame);
        assert_eq!(out.retval, at.ack, "folded and acknowledged");
        let (ack, kind) = Header::read_from(&out.frame[42..]).unwrap();
        assert_eq!((kind, ack.sender, ack.chunk, ack.seq), (Kind::KvAck, 0, 1, 1));
        assert_eq!(out.frame.len(), 42 + crate::wire::HDR_LEN, "payload cut");
        assert_eq!(&out.frame[26..30], &[10, 77, 0, 1], "from the owner");
        assert_eq!(&out.frame[30..34], &[10, 77, 0, 2], "to the mapper");
        assert_eq!((kernel_value(&table, b"cat"), kernel_value(&table, b"dog")), (Some(3), Some(5)));
        let mut count = KvCount::default();
        kvmap::lookup(&kvcount, &1u32, &mut count, "kvcount").unwrap();
        assert_eq!(count, KvCount { batches: 1, pairs: 3 });

        // A repeat: acknowledged again, not folded again.
        assert_eq!(run(&frame).retval, at.ack);
        assert_eq!(kernel_value(&table, b"cat"), Some(3));

        // A long key last: the first two folded, the batch goes up.
        let long = [b'x'; 40];
        let spill = kv_frame(1, 2, &[(b"cat", 10), (b"emu", 1), (&long, 7)]);
        for _ in 0..2 {
            let out = run(&spill);
            assert_eq!(out.retval, at.pass);
            let (h, _) = Header::read_from(&out.frame[42..]).unwrap();
            assert_eq!(h.flags & FLAG_KV_SPILL, FLAG_KV_SPILL);
            assert_eq!((h.nchunks & 0xffff, h.nchunks >> 16), (64, 2), "two pairs folded");
            assert_eq!(&out.frame[42 + crate::wire::HDR_LEN..], &spill[42 + crate::wire::HDR_LEN..], "pairs unchanged");
        }
        assert_eq!((kernel_value(&table, b"cat"), kernel_value(&table, b"emu")), (Some(13), Some(1)));

        // The table holds 4 keys: a fourth fits, the fifth spills from there.
        let full = kv_frame(1, 3, &[(b"dog", 1), (b"fox", 1), (b"gnu", 1), (b"cat", 1)]);
        let out = run(&full);
        assert_eq!(out.retval, at.pass);
        let (h, _) = Header::read_from(&out.frame[42..]).unwrap();
        assert_eq!(h.nchunks >> 16, 2, "dog and fox folded, gnu did not fit");
        assert_eq!((kernel_value(&table, b"fox"), kernel_value(&table, b"gnu")), (Some(1), None));

        // A new batch of another operation than the armed one: held off
        // (dropped unacknowledged, the window untouched), folded once
        // that operation is armed.
        let other = kv_frame(2, 4, &[(b"cat", 1)]);
        assert_eq!(run(&other).retval, at.drop);
        assert_eq!(kernel_value(&table, b"cat"), Some(13));
        // Likewise before the communicator wrote its arming at all.
        kvmap::update(&kvctl, &0u32, &KvCtl::default(), "kvctl").unwrap();
        assert_eq!(run(&kv_frame(1, 5, &[(b"cat", 1)])).retval, at.drop);
        kvmap::update(&kvctl, &0u32, &KvCtl { seq: 2, ..arming }, "kvctl").unwrap();
        assert_eq!(run(&other).retval, at.ack, "armed now: folded");
        assert_eq!(kernel_value(&table, b"cat"), Some(14));
        // The armed operation with another dtype: up, for the process to
        // fail the call as mismatched.
        let odd = kv_frame(2, 6, &[(b"cat", 1)]);
        kvmap::update(&kvctl, &0u32, &KvCtl { seq: 2, dtype: Dtype::U64.code(), ..arming }, "kvctl").unwrap();
        assert_eq!(run(&odd).retval, at.pass);
        assert_eq!(kernel_value(&table, b"cat"), Some(14));
        kvmap::update(&kvctl, &0u32, &KvCtl { seq: 2, ..arming }, "kvctl").unwrap();
        // A count beyond its pairs, and bytes after the last pair: what
        // was folded is said, the process finds the batch malformed.
        let mut short = kv_frame(2, 7, &[(b"cat", 1), (b"dog", 1)]);
        short[42 + 36..42 + 40].copy_from_slice(&3u32.to_le_bytes()); // the header's count
        let out = run(&short);
        assert_eq!(out.retval, at.pass);
        let (h, _) = Header::read_from(&out.frame[42..]).unwrap();
        assert_eq!((h.flags & FLAG_KV_SPILL, h.nchunks >> 16), (FLAG_KV_SPILL, 2));
        let out = run(&kv_frame_with(2, 8, &[(b"cat", 1)], &[0, 0, 0]));
        assert_eq!(out.retval, at.pass);
        let (h, _) = Header::read_from(&out.frame[42..]).unwrap();
        assert_eq!((h.flags & FLAG_KV_SPILL, h.nchunks >> 16), (FLAG_KV_SPILL, 1));
        assert_eq!(kernel_value(&table, b"cat"), Some(16), "14, and 1 from each batch: the pairs before the stop");
    }

    /// The same first program folding into an open-addressing array table
    /// (`AGGBOX_KVTAB_ARRAY`): a batch is folded and acknowledged, its
    /// repeat not folded again, a long key spills the rest, a table whose
    /// probes find no free slot spills from the first new key, MAX keeps
    /// the largest; what the process drains equals a plain loop, and the
    /// drained table is empty.
    fn folds_crafted_batches_into_an_array_table(at: &First, tag: &str) {
        use std::os::fd::AsFd;

        use crate::testrun::test_run;
        let (obj, _maps, [kvctl, kvarrs]) = test_owner(tag, TEST_GROUP, TEST_TOKEN, [names::KVCTL, names::KVARRS], at.tc).unwrap();
        let program = obj.program(at.program).unwrap();
        let run = |frame: &[u8]| test_run(program.fd().unwrap().as_fd(), frame).unwrap();
        let drained = |array: &mut ArrayTable, op: ReduceOp| {
            let mut table = Table::new(Dtype::I64, op);
            array.drain(&mut table);
            let mut pairs: Vec<(Vec<u8>, u64)> = table.pairs().map(|(k, v)| (k.to_vec(), v)).collect();
            pairs.sort();
            pairs
        };
        let own = |pairs: &[(&[u8], u64)]| pairs.iter().map(|(k, v)| (k.to_vec(), *v)).collect::<Vec<_>>();

        // 4 slots (mask 3): the probes reach every one.
        let mut array = ArrayTable::new(4).unwrap();
        array.set_capacity(4);
        kvmap::update(&kvarrs, &0u32, &(std::os::fd::AsRawFd::as_raw_fd(&array.fd) as u32), "kvarrs").unwrap();
        let arming = KvCtl {
            seq: 1,
            group: TEST_GROUP,
            rank: 0,
            key_max: 64,
            dtype: Dtype::I64.code(),
            op: 0,
            fold: 1,
            table: KVTAB_ARRAY,
            mask: 3,
            ..KvCtl::default()
        };
        kvmap::update(&kvctl, &0u32, &arming, "kvctl").unwrap();
        let frame = kv_frame(1, 1, &[(b"cat", 2), (b"dog", 5), (b"cat", 1)]);
        assert_eq!(run(&frame).retval, at.ack, "folded and acknowledged");
        assert_eq!(run(&frame).retval, at.ack, "a repeat, acknowledged again");
        let long = [b'x'; 40];
        let out = run(&kv_frame(1, 2, &[(b"cat", 10), (b"emu", 1), (&long, 7)]));
        assert_eq!(out.retval, at.pass);
        let (h, _) = Header::read_from(&out.frame[42..]).unwrap();
        assert_eq!((h.flags & FLAG_KV_SPILL, h.nchunks >> 16), (FLAG_KV_SPILL, 2), "two pairs folded, the long key spilled");
        let out = run(&kv_frame(1, 3, &[(b"dog", 1), (b"gnu", 1), (b"yak", 1), (b"cat", 1)]));
        assert_eq!(out.retval, at.pass, "4 slots: cat, dog, emu, gnu; yak finds none");
        let (h, _) = Header::read_from(&out.frame[42..]).unwrap();
        assert_eq!(h.nchunks >> 16, 2);
        assert_eq!(drained(&mut array, ReduceOp::Sum), own(&[(b"cat", 13), (b"dog", 6), (b"emu", 1), (b"gnu", 1)]));
        assert_eq!(drained(&mut array, ReduceOp::Sum), own(&[]), "drained empty");

        // MAX, after the drain: the same slots serve the next operation.
        kvmap::update(&kvctl, &0u32, &KvCtl { seq: 2, op: ReduceOp::Max.code(), ..arming }, "kvctl").unwrap();
        let mut max = kv_frame(2, 4, &[(b"cat", 4), (b"cat", 9), (b"cat", 2), (b"owl", 3)]);
        max[42 + 15] = ReduceOp::Max.code();
        assert_eq!(run(&max).retval, at.ack);
        assert_eq!(drained(&mut array, ReduceOp::Max), own(&[(b"cat", 9), (b"owl", 3)]));

        // A capacity of 2 keys: the third new key spills, though slots are free.
        array.set_capacity(2);
        kvmap::update(&kvctl, &0u32, &KvCtl { seq: 3, ..arming }, "kvctl").unwrap();
        let out = run(&kv_frame(3, 5, &[(b"ant", 1), (b"bee", 2), (b"ant", 3), (b"cow", 1)]));
        assert_eq!(out.retval, at.pass);
        let (h, _) = Header::read_from(&out.frame[42..]).unwrap();
        assert_eq!(h.nchunks >> 16, 3, "ant, bee, ant folded; cow over the capacity");
        assert_eq!(drained(&mut array, ReduceOp::Sum), own(&[(b"ant", 4), (b"bee", 2)]));
    }

    fn size_of_key() -> u32 {
        std::mem::size_of::<KvKey>() as u32
    }

    #[test]
    fn kernel_structs_match_the_c_definitions() {
        use std::mem::{offset_of, size_of};
        let exprs: Vec<String> = [
            "sizeof(struct aggbox_kvctl)",
            "offsetof(struct aggbox_kvctl, group)",
            "offsetof(struct aggbox_kvctl, rank)",
            "offsetof(struct aggbox_kvctl, key_max)",
            "offsetof(struct aggbox_kvctl, dtype)",
            "offsetof(struct aggbox_kvctl, op)",
            "offsetof(struct aggbox_kvctl, fold)",
            "offsetof(struct aggbox_kvctl, table)",
            "offsetof(struct aggbox_kvctl, mask)",
            "sizeof(struct aggbox_kvslot)",
            "offsetof(struct aggbox_kvslot, value)",
            "offsetof(struct aggbox_kvslot, words)",
            "AGGBOX_KVTAB_ARRAY",
            "AGGBOX_KVSLOT_BUSY",
            "sizeof(struct aggbox_kvkey)",
            "offsetof(struct aggbox_kvkey, bytes)",
            "sizeof(struct aggbox_kvcount)",
            "offsetof(struct aggbox_kvcount, pairs)",
            "sizeof(struct aggbox_kvwin)",
            "AGGBOX_KV_KEY",
            "AGGBOX_KV_WINDOW",
            "AGGBOX_KV_PAIR",
            "AGGBOX_FLAG_KV_SPILL",
            "AGGBOX_KVSTAT_MAX",
        ]
        .map(String::from)
        .to_vec();
        let rust = vec![
            size_of::<KvCtl>() as u64,
            offset_of!(KvCtl, group) as u64,
            offset_of!(KvCtl, rank) as u64,
            offset_of!(KvCtl, key_max) as u64,
            offset_of!(KvCtl, dtype) as u64,
            offset_of!(KvCtl, op) as u64,
            offset_of!(KvCtl, fold) as u64,
            offset_of!(KvCtl, table) as u64,
            offset_of!(KvCtl, mask) as u64,
            size_of::<KvSlot>() as u64,
            offset_of!(KvSlot, value) as u64,
            offset_of!(KvSlot, words) as u64,
            u64::from(KVTAB_ARRAY),
            1,
            size_of::<KvKey>() as u64,
            offset_of!(KvKey, bytes) as u64,
            size_of::<KvCount>() as u64,
            offset_of!(KvCount, pairs) as u64,
            (WINDOW * 8) as u64,
            KERNEL_KEY as u64,
            WINDOW as u64,
            PAIR_OVERHEAD as u64,
            u64::from(FLAG_KV_SPILL),
            KVSTAT_NAMES.len() as u64,
        ];
        assert_eq!(rust, crate::layout_check::c_values("aggbox_kv.h", &exprs));
    }

    #[test]
    fn long_keys_go_last_in_a_batch() {
        let pair = |key: &[u8], v: u64| {
            let mut p = (key.len() as u16).to_le_bytes().to_vec();
            p.extend_from_slice(&v.to_le_bytes());
            p.extend_from_slice(key);
            p
        };
        let long = [b'L'; 40];
        let mut batch = [pair(&long, 1), pair(b"a", 2), pair(&long[..33], 3), pair(b"bb", 4)].concat();
        long_keys_last(&mut batch, &mut Vec::new());
        assert_eq!(batch, [pair(b"a", 2), pair(b"bb", 4), pair(&long, 1), pair(&long[..33], 3)].concat());
    }

    #[test]
    fn counted_window_dedups_across_its_wrap() {
        let mut c = Counted::new();
        assert_eq!(c.has(1), Some(false));
        c.mark(2);
        assert_eq!(c.has(2), Some(true));
        assert_eq!(c.base, 1);
        c.mark(1);
        assert_eq!(c.base, 3);
        assert_eq!(c.has(1), Some(true));
        assert_eq!(c.has(3 + WINDOW as u32), None);
        for b in 3..3 + 10 * WINDOW as u32 {
            assert_eq!(c.has(b), Some(false));
            c.mark(b);
        }
        assert_eq!(c.base, 3 + 10 * WINDOW as u32);
    }

    #[test]
    fn sum_min_max_on_three_loopback_ranks_match_a_plain_loop() {
        let n = 3;
        let results = ranks(n, 29_661, 10_000, move |rank, comm| {
            let mut out = Vec::new();
            for (op, dtype, combine) in [(ReduceOp::Sum, Dtype::I64, false), (ReduceOp::Min, Dtype::I64, true), (ReduceOp::Max, Dtype::U64, false)] {
                let config = KvConfig { dtype, op, combine, ..KvConfig::default() };
                comm.kv_begin(&config).unwrap();
                let (keys, lens, values) = pairs(rank, 20_000, 3_000);
                // In a few emits of different sizes.
                let (mut k, mut v) = (0, 0);
                for step in [1, 999, 5000, 14_000] {
                    let bytes: usize = lens[v..v + step].iter().map(|&l| l as usize).sum();
                    comm.kv_emit(&keys[k..k + bytes], &lens[v..v + step], &values[v..v + step]).unwrap();
                    k += bytes;
                    v += step;
                    // Another collective meanwhile: it handles the batches
                    // that arrive during it.
                    comm.barrier().unwrap();
                }
                let result = comm.kv_finish().unwrap();
                let got: HashMap<Vec<u8>, u64> = result.iter().map(|(k, v)| (k.to_vec(), v)).collect();
                out.push((op, dtype, got, result.stats()));
            }
            out
        });
        for (case, (op, dtype)) in [(ReduceOp::Sum, Dtype::I64), (ReduceOp::Min, Dtype::I64), (ReduceOp::Max, Dtype::U64)].into_iter().enumerate() {
            let mut want: HashMap<Vec<u8>, u64> = HashMap::new();
            for rank in 0..n {
                let (keys, lens, values) = pairs(rank, 20_000, 3_000);
                let mut at = 0;
                for (len, value) in lens.iter().zip(values) {
                    let key = keys[at..at + *len as usize].to_vec();
                    at += *len as usize;
                    want.entry(key).and_modify(|v| *v = combine(dtype, op, *v, value)).or_insert(value);
                }
            }
            let mut seen = 0;
            for (rank, result) in results.iter().enumerate() {
                let (_, _, got, stats) = &result[case];
                for (key, value) in got {
                    assert_eq!(key_owner(key, n), rank, "owned here");
                    assert_eq!(want.get(key), Some(value), "{op} of {:?}", String::from_utf8_lossy(key));
                }
                seen += got.len();
                assert_eq!(stats.pairs_emitted, 20_000);
            }
            assert_eq!(seen, want.len(), "every key somewhere");
        }
    }

    #[test]
    fn bad_arguments_are_refused_and_nothing_is_left_open() {
        ranks(2, 29_662, 10_000, move |rank, comm| {
            let err = comm.kv_emit(b"a", &[1], &[1]).unwrap_err();
            assert!(err.to_string().contains("no key-value reduce is open"), "{err}");
            assert!(comm.kv_finish().unwrap_err().to_string().contains("no key-value reduce is open"));
            for bad in [
                KvConfig { key_max: 31, ..KvConfig::default() },
                KvConfig { key_max: 2000, ..KvConfig::default() },
                KvConfig { dtype: Dtype::I32, ..KvConfig::default() },
                KvConfig { op: ReduceOp::Avg, ..KvConfig::default() },
                KvConfig { kernel_capacity: 0, ..KvConfig::default() },
            ] {
                assert_eq!(comm.kv_begin(&bad).unwrap_err().status(), crate::Status::InvalidArgument);
            }
            let config = KvConfig { key_max: 32, ..KvConfig::default() };
            comm.kv_begin(&config).unwrap();
            assert!(comm.kv_begin(&config).unwrap_err().to_string().contains("already open"));
            let long = [b'x'; 33];
            let err = comm.kv_emit(&long, &[33], &[1]).unwrap_err();
            assert!(err.to_string().contains("key 0 has 33 bytes"), "{err}");
            let err = comm.kv_emit(b"", &[0], &[1]).unwrap_err();
            assert!(err.to_string().contains("key 0 has 0 bytes"), "{err}");
            let err = comm.kv_emit(b"abc", &[1, 1], &[1, 2]).unwrap_err();
            assert!(err.to_string().contains("add up to 2 bytes"), "{err}");
            let err = comm.kv_emit(b"ab", &[1, 1], &[1]).unwrap_err();
            assert!(err.to_string().contains("2 key lengths but 1 values"), "{err}");
            // Still open and in step after the refused calls.
            comm.kv_emit(b"hello", &[5], &[rank as u64 + 1]).unwrap();
            let result = comm.kv_finish().unwrap();
            let total: u64 = result.iter().map(|(_, v)| v).sum();
            assert_eq!(total, if key_owner(b"hello", 2) == rank { 3 } else { 0 });
        });
    }
}
