//! The XDP floor of `aggbox bench kv` (docs/BENCHMARKS.md): a trivial XDP
//! program (`ebpf/xdp_kv_floor.bpf.c`) that drops and counts the `KV_DATA`
//! datagrams to one UDP port on an interface, and the batches a mapper
//! sends, packed as [`Comm::kv_emit`](crate::Comm::kv_emit) packs them. The
//! bench attaches the program at every owner, has every mapper send its
//! batches, and divides the pairs counted by the time they took: the rate
//! at which the kernel merely drops those packets on that cluster.
//!
//! Nothing here is pinned: the link belongs to the [`FloorDrop`], and
//! dropping it (or the process ending) detaches the program.

use aya::{
    maps::PerCpuArray,
    programs::{Xdp, XdpMode},
    EbpfLoader,
};

use super::{key_owner, long_keys_last, Table, COMBINE_MAX, KERNEL_KEY, PAIR_OVERHEAD};
use crate::{bpf, error::chain, Dtype, Error, ReduceOp, Result};

/// What the floor program counted on one interface (over every CPU).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct FloorCounts {
    /// `KV_DATA` datagrams dropped.
    pub packets: u64,
    /// The pairs their headers announce.
    pub pairs: u64,
    /// `CLOCK_MONOTONIC` nanoseconds of the first (0: none).
    pub first_ns: u64,
    /// And of the last.
    pub last_ns: u64,
}

/// The floor program attached to one interface of this network namespace.
pub struct FloorDrop {
    ebpf: aya::Ebpf,
    mode: &'static str,
}

impl FloorDrop {
    /// Loads the floor program for UDP port `port` and attaches it to
    /// `iface` (driver mode, else SKB mode). Fails when another XDP program
    /// is attached there.
    pub fn attach(iface: &str, port: u16) -> Result<FloorDrop> {
        let mut ebpf = EbpfLoader::new()
            .override_global("floor_port", &port, true)
            .load(bpf::XDP_KV_FLOOR)
            .map_err(|e| Error::Unsupported(format!("loading the XDP floor program: {}", chain(&e))))?;
        let prog: &mut Xdp = ebpf
            .program_mut("aggbox_xdp_kv_floor")
            .ok_or_else(|| Error::Internal("the floor program is missing from its object".into()))?
            .try_into()
            .map_err(|e| Error::Internal(format!("the floor program: {e}")))?;
        prog.load().map_err(|e| Error::Unsupported(format!("loading the XDP floor program: {}", chain(&e))))?;
        let mode = match prog.attach(iface, XdpMode::Driver) {
            Ok(_) => "driver",
            Err(driver) => {
                prog.attach(iface, XdpMode::Skb).map_err(|e| {
                    Error::Unsupported(format!("attaching the XDP floor program to {iface} (driver: {driver}; SKB: {e})"))
                })?;
                "skb"
            }
        };
        Ok(FloorDrop { ebpf, mode })
    }

    /// The XDP mode it got: "driver" or "skb".
    pub fn mode(&self) -> &'static str {
        self.mode
    }

    fn map(&mut self) -> Result<PerCpuArray<&mut aya::maps::MapData, [u64; 4]>> {
        let map = self.ebpf.map_mut("ab_kvfloor").ok_or_else(|| Error::Internal("ab_kvfloor missing".into()))?;
        PerCpuArray::try_from(map).map_err(|e| Error::Internal(format!("ab_kvfloor: {e}")))
    }

    /// The counters, summed over the CPUs (first: the earliest, last: the
    /// latest).
    pub fn counts(&mut self) -> Result<FloorCounts> {
        let values = self.map()?.get(&0, 0).map_err(|e| Error::Internal(format!("reading ab_kvfloor: {e}")))?;
        let mut c = FloorCounts::default();
        for v in values.iter() {
            c.packets += v[0];
            c.pairs += v[1];
            if v[2] != 0 && (c.first_ns == 0 || v[2] < c.first_ns) {
                c.first_ns = v[2];
            }
            c.last_ns = c.last_ns.max(v[3]);
        }
        Ok(c)
    }

    /// Zeroes the counters.
    pub fn reset(&mut self) -> Result<()> {
        let cpus = aya::util::nr_cpus().map_err(|(_, e)| Error::system("counting CPUs", e))?;
        let zero = aya::maps::PerCpuValues::try_from(vec![[0u64; 4]; cpus])
            .map_err(|e| Error::Internal(format!("ab_kvfloor zeroes: {e}")))?;
        self.map()?.set(0, zero, 0).map_err(|e| Error::Internal(format!("zeroing ab_kvfloor: {e}")))
    }
}

/// One batch a mapper sends: its owner, its pairs as on the wire, and
/// how many.
#[derive(Clone, Debug)]
pub struct PackedBatch {
    /// The rank it goes to.
    pub owner: usize,
    /// Its pairs, as on the wire.
    pub payload: Vec<u8>,
    /// How many.
    pub pairs: u32,
}

/// The batches rank `me` of `ranks` sends for these pairs (keys
/// concatenated as for [`Comm::kv_emit`](crate::Comm::kv_emit), emitted in
/// one operation and finished), packed as the communicator packs them into
/// `chunk`-byte datagrams: its own keys stay home, the others are combined
/// per owner when `combine` is set (a table of up to [`COMBINE_MAX`] keys,
/// sent when full and at the end) and appended in order, a batch sealed
/// when the next pair does not fit, long keys last.
#[allow(clippy::too_many_arguments)]
pub fn pack_batches(
    keys: &[u8],
    key_lens: &[u32],
    values: &[u64],
    ranks: usize,
    me: usize,
    chunk: usize,
    combine: bool,
    dtype: Dtype,
    op: ReduceOp,
) -> Vec<PackedBatch> {
    struct Filling {
        buf: Vec<u8>,
        pairs: u32,
        long: bool,
    }
    fn seal(owner: usize, f: &mut Filling, out: &mut Vec<PackedBatch>, scratch: &mut Vec<u8>, chunk: usize) {
        if f.pairs == 0 {
            return;
        }
        if f.long {
            long_keys_last(&mut f.buf, scratch);
        }
        out.push(PackedBatch { owner, payload: std::mem::replace(&mut f.buf, Vec::with_capacity(chunk)), pairs: f.pairs });
        f.pairs = 0;
        f.long = false;
    }
    fn append(owner: usize, key: &[u8], value: u64, f: &mut Filling, out: &mut Vec<PackedBatch>, scratch: &mut Vec<u8>, chunk: usize) {
        if f.buf.len() + PAIR_OVERHEAD + key.len() > chunk {
            seal(owner, f, out, scratch, chunk);
        }
        f.buf.extend_from_slice(&(key.len() as u16).to_le_bytes());
        f.buf.extend_from_slice(&value.to_le_bytes());
        f.buf.extend_from_slice(key);
        f.pairs += 1;
        f.long |= key.len() > KERNEL_KEY;
    }
    let mut out = Vec::new();
    let mut filling: Vec<Filling> = (0..ranks).map(|_| Filling { buf: Vec::with_capacity(chunk), pairs: 0, long: false }).collect();
    let mut scratch = Vec::new();
    let mut combining: Vec<Table> = (0..ranks).map(|_| Table::new(dtype, op)).collect();
    let mut at = 0;
    for (&len, &value) in key_lens.iter().zip(values) {
        let key = &keys[at..at + len as usize];
        at += len as usize;
        let owner = key_owner(key, ranks);
        if owner == me {
            continue;
        }
        if combine {
            if !combining[owner].fold(key, value) && combining[owner].len() >= COMBINE_MAX {
                for (k, v) in combining[owner].pairs() {
                    append(owner, k, v, &mut filling[owner], &mut out, &mut scratch, chunk);
                }
                combining[owner].clear();
            }
            continue;
        }
        append(owner, key, value, &mut filling[owner], &mut out, &mut scratch, chunk);
    }
    for owner in 0..ranks {
        for (k, v) in combining[owner].pairs() {
            append(owner, k, v, &mut filling[owner], &mut out, &mut scratch, chunk);
        }
        seal(owner, &mut filling[owner], &mut out, &mut scratch, chunk);
    }
    out
}

/// What folding the same batches cost, per pair, in each owner's table.
#[derive(Clone, Copy, Debug, Default)]
pub struct FoldCost {
    /// Batches folded (each table the same ones).
    pub batches: usize,
    /// Their pairs.
    pub pairs: u64,
    /// Mean ns per pair of XDP ingress with its fold stages (the kernel's
    /// `BPF_PROG_TEST_RUN` duration of each batch, summed) into a BPF hash
    /// map.
    pub xdp_hash_ns: f64,
    /// The same into the array table.
    pub xdp_array_ns: f64,
    /// Mean ns per pair of the user datapath's owner table (the batch
    /// parsed and folded in this process, no socket).
    pub user_ns: f64,
}

/// A `KV_DATA` frame from rank 1 (10.77.0.2:47002) to rank 0
/// (10.77.0.1:47001) of group `group`: batch `batch` of operation `seq`.
fn frame(group: u32, token: u64, seq: u32, batch: u32, b: &PackedBatch) -> Vec<u8> {
    use crate::wire::{Header, Kind, HDR_LEN};
    let mut header = Header::new(Kind::KvData, group, token, 1, seq);
    header.dtype = Dtype::I64.code();
    header.op = ReduceOp::Sum.code();
    header.nchunks = 32;
    header.chunk = batch;
    header.count = b.pairs;
    let udp_len = 8 + HDR_LEN + b.payload.len();
    let mut f = vec![2, 0, 0, 0, 0, 1, 2, 0, 0, 0, 0, 2, 0x08, 0x00, 0x45, 0];
    f.extend_from_slice(&(20 + udp_len as u16).to_be_bytes());
    f.extend_from_slice(&[0, 1, 0x40, 0, 64, 17, 0, 0, 10, 77, 0, 2, 10, 77, 0, 1]);
    let mut sum: u32 = f[14..34].chunks(2).map(|w| u32::from(u16::from_be_bytes([w[0], w[1]]))).sum();
    while sum > 0xffff {
        sum = (sum & 0xffff) + (sum >> 16);
    }
    f[24..26].copy_from_slice(&(!(sum as u16)).to_be_bytes());
    f.extend_from_slice(&47_002u16.to_be_bytes());
    f.extend_from_slice(&47_001u16.to_be_bytes());
    f.extend_from_slice(&(udp_len as u16).to_be_bytes());
    f.extend_from_slice(&[0, 0]);
    let mut h = [0u8; HDR_LEN];
    header.write_to(&mut h);
    f.extend_from_slice(&h);
    f.extend_from_slice(&b.payload);
    f
}

/// Folds `batches` (i64 SUM, keys of at most 32 bytes, all to one owner)
/// at an owner armed as the kernel datapath arms it, once into a BPF hash
/// map and once into an array table, with XDP ingress run by
/// `BPF_PROG_TEST_RUN` (no network, no other process), and once into the
/// user datapath's table; checks that the three tables hold the same sums
/// as a plain loop, and returns the cost per pair of each.
pub fn fold_cost(batches: &[PackedBatch]) -> Result<FoldCost> {
    use std::{collections::HashMap, os::fd::AsFd, time::Instant};

    use super::{fold_batch, kvmap, ArrayTable, KvCtl, KvKey, KVTAB_ARRAY, KVTAB_HASH};
    use crate::{
        maps::names,
        testrun::{test_run_timed, xdp},
    };
    const GROUP: u32 = 0x0a0b_0c0e;
    const TOKEN: u64 = 0x0fed_cba9_8765_4321;
    let (obj, _maps, [kvctl, kvtabs, kvarrs]) =
        super::test_owner("kvfold", GROUP, TOKEN, [names::KVCTL, names::KVTABS, names::KVARRS], false)?;
    let program = obj
        .program(bpf::programs::XDP_INGRESS)
        .and_then(|p| p.fd().ok())
        .ok_or_else(|| Error::Internal("XDP ingress is not loaded".into()))?;

    let mut want: HashMap<Vec<u8>, u64> = HashMap::new();
    for b in batches {
        let mut table = Table::new(Dtype::I64, ReduceOp::Sum);
        fold_batch(&mut table, &b.payload, b.pairs, 32).ok_or_else(|| Error::Internal("a malformed batch".into()))?;
        for (k, v) in table.pairs() {
            *want.entry(k.to_vec()).or_default() += v;
        }
    }
    let pairs: u64 = batches.iter().map(|b| u64::from(b.pairs)).sum();
    let mut cost = FoldCost { batches: batches.len(), pairs, ..FoldCost::default() };
    let arming = KvCtl { seq: 1, group: GROUP, rank: 0, key_max: 32, dtype: Dtype::I64.code(), op: 0, fold: 1, ..KvCtl::default() };
    let capacity = (want.len() * 2).next_power_of_two().max(64); // as an owner of capacity want.len() makes it
    for (round, kind) in [KVTAB_HASH, KVTAB_ARRAY].into_iter().enumerate() {
        let mut got = Table::new(Dtype::I64, ReduceOp::Sum);
        let hash = kvmap::create_hash("ab_kvtab", std::mem::size_of::<KvKey>() as u32, 8, capacity as u32, kvmap::BPF_F_NO_PREALLOC)?;
        let mut array = ArrayTable::new(capacity)?;
        array.set_capacity(want.len());
        let fd = |f: &std::os::fd::OwnedFd| std::os::fd::AsRawFd::as_raw_fd(f) as u32;
        if kind == KVTAB_HASH {
            kvmap::update(&kvtabs, &0u32, &fd(&hash), "ab_kvtabs")?;
        } else {
            kvmap::update(&kvarrs, &0u32, &fd(&array.fd), "ab_kvarrs")?;
        }
        kvmap::update(&kvctl, &0u32, &KvCtl { table: kind, mask: capacity as u32 - 1, ..arming }, "ab_kvctl")?;
        let mut ns = 0u64;
        for (i, b) in batches.iter().enumerate() {
            let f = frame(GROUP, TOKEN, 1, (round * batches.len() + i + 1) as u32, b);
            let (run, duration) = test_run_timed(program.as_fd(), &f, 1)?;
            if run.retval != xdp::TX {
                return Err(Error::Internal(format!("batch {i} was not folded whole (XDP verdict {})", run.retval)));
            }
            ns += u64::from(duration);
        }
        if kind == KVTAB_HASH {
            kvmap::drain(&hash, std::mem::size_of::<KvKey>(), 8192, |key, value| {
                let len = u32::from_ne_bytes(key[..4].try_into().expect("4 bytes")) as usize;
                got.fold(&key[4..4 + len.min(KERNEL_KEY)], value);
            })?;
            cost.xdp_hash_ns = ns as f64 / pairs as f64;
        } else {
            array.drain(&mut got);
            cost.xdp_array_ns = ns as f64 / pairs as f64;
        }
        let got: HashMap<Vec<u8>, u64> = got.pairs().map(|(k, v)| (k.to_vec(), v)).collect();
        if got != want {
            return Err(Error::Internal(format!("the {} table does not hold the plain loop's sums", ["hash", "array"][round])));
        }
    }
    let mut user = Table::new(Dtype::I64, ReduceOp::Sum);
    let start = Instant::now();
    for b in batches {
        fold_batch(&mut user, &b.payload, b.pairs, 32);
    }
    cost.user_ns = start.elapsed().as_nanos() as f64 / pairs as f64;
    let user: HashMap<Vec<u8>, u64> = user.pairs().map(|(k, v)| (k.to_vec(), v)).collect();
    if user != want {
        return Err(Error::Internal("the user table does not hold the plain loop's sums".into()));
    }
    Ok(cost)
}

#[cfg(test)]
mod tests {
    use std::collections::HashMap;

    use super::*;

    /// Every pair bound for another rank is in exactly one batch (summed
    /// per key when combined), and every batch fits the chunk.
    #[test]
    fn packed_batches_hold_every_sent_pair_once() {
        let (ranks, me, chunk) = (4, 1, 1432);
        let (mut keys, mut lens) = (Vec::new(), Vec::new());
        for i in 0..50_000u64 {
            let key = if i % 97 == 0 { format!("a-long-key-of-more-than-32-bytes-{}", i % 13) } else { format!("k{}", (i * i) % 3001) };
            keys.extend_from_slice(key.as_bytes());
            lens.push(key.len() as u32);
        }
        let values: Vec<u64> = (0..lens.len() as u64).map(|i| i % 7 + 1).collect();
        let mut want: HashMap<(usize, Vec<u8>), u64> = HashMap::new();
        let mut sent = 0;
        let mut at = 0;
        for (&len, &v) in lens.iter().zip(&values) {
            let key = &keys[at..at + len as usize];
            at += len as usize;
            let owner = key_owner(key, ranks);
            if owner != me {
                sent += 1;
                *want.entry((owner, key.to_vec())).or_default() += v;
            }
        }
        for combine in [false, true] {
            let batches = pack_batches(&keys, &lens, &values, ranks, me, chunk, combine, Dtype::I64, ReduceOp::Sum);
            let mut got: HashMap<(usize, Vec<u8>), u64> = HashMap::new();
            let mut pairs = 0;
            for b in &batches {
                assert!(b.payload.len() <= chunk && b.pairs > 0 && b.owner != me);
                let (mut at, mut n) = (0, 0);
                let mut seen_long = false;
                while at < b.payload.len() {
                    let len = u16::from_le_bytes([b.payload[at], b.payload[at + 1]]) as usize;
                    let v = u64::from_le_bytes(b.payload[at + 2..at + 10].try_into().unwrap());
                    assert!(!seen_long || len > KERNEL_KEY, "long keys last");
                    seen_long |= len > KERNEL_KEY;
                    *got.entry((b.owner, b.payload[at + 10..at + 10 + len].to_vec())).or_default() += v;
                    at += PAIR_OVERHEAD + len;
                    n += 1;
                }
                assert_eq!((at, n), (b.payload.len(), b.pairs));
                pairs += n as usize;
            }
            assert_eq!(got, want, "combine {combine}");
            if combine {
                assert_eq!(pairs, want.len());
            } else {
                assert_eq!(pairs, sent);
            }
        }
    }
}
