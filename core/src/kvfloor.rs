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
