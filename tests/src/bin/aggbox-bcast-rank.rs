//! A rank process for the broadcast tests: joins the group from the
//! environment (RANK, WORLD_SIZE, MASTER_ADDR, AGGBOX_DATAPATH, …), runs
//! broadcasts and checks every byte.
//!
//! `aggbox-bcast-rank --seed N --case SIZE:ROOTS [--case …] [--forever] [--barrier] [--mismatch count|root --at RANK]`
//! - each `--case` broadcasts SIZE bytes (u8) from each root of ROOTS
//!   (`all`, or a comma-separated list), in order. The root's buffer is
//!   `fill_random` of `case_seed(N, root, SIZE)`; every other rank fills its
//!   buffer with other bytes first, then regenerates the root's buffer from
//!   the seed and compares byte for byte. One line per broadcast:
//!   `bcast size=S root=R match=1 us=T` (`match=0 first_diff=OFFSET` and
//!   exit 3 when they differ), then `report rank=… datapath=… broadcasts=…
//!   retransmits=… duplicates=… chunks_sent=… acks_received=… sent=…
//!   received=… xdp_accepted=…`;
//! - `--forever`: repeats the first case until a broadcast fails;
//! - `--barrier`: a barrier before each broadcast;
//! - `--mismatch count --at R`: rank R calls with one byte more;
//!   `--mismatch root --at R`: rank R calls with itself as root.
//!
//! A failed broadcast prints `error status=STATUS blamed=RANK message=…`
//! (blamed is `-` unless a peer failed) and exits 1.

use std::time::Instant;

use aggbox_core::{maps::Prog, Comm, Dtype};
use aggbox_tests::{case_seed, fail, fill_random};

/// One `--case`: a size and the roots to broadcast it from.
struct Case {
    size: usize,
    roots: Vec<usize>,
}

/// The command line.
struct Args {
    seed: u64,
    cases: Vec<Case>,
    forever: bool,
    barrier: bool,
    mismatch: Option<(String, usize)>,
}

fn parse_case(text: &str, ranks: usize) -> Case {
    let (size, roots) = text.split_once(':').expect("--case SIZE:ROOTS");
    let roots = if roots == "all" {
        (0..ranks).collect()
    } else {
        roots.split(',').map(|r| r.parse().expect("a root")).collect()
    };
    Case { size: size.parse().expect("a size"), roots }
}

fn parse_args(ranks: usize) -> Args {
    let mut args = Args { seed: 1, cases: Vec::new(), forever: false, barrier: false, mismatch: None };
    let argv: Vec<String> = std::env::args().skip(1).collect();
    let value = |i: usize| argv.get(i + 1).cloned().unwrap_or_else(|| panic!("{} needs a value", argv[i]));
    let mut mismatch_kind = None;
    let mut at = None;
    let mut i = 0;
    while i < argv.len() {
        match argv[i].as_str() {
            "--seed" => args.seed = value(i).parse().expect("a seed"),
            "--case" => args.cases.push(parse_case(&value(i), ranks)),
            "--mismatch" => mismatch_kind = Some(value(i)),
            "--at" => at = Some(value(i).parse().expect("a rank")),
            "--forever" => {
                args.forever = true;
                i += 1;
                continue;
            }
            "--barrier" => {
                args.barrier = true;
                i += 1;
                continue;
            }
            other => panic!("unknown argument {other}"),
        }
        i += 2;
    }
    args.mismatch = mismatch_kind.map(|kind| (kind, at.expect("--mismatch needs --at")));
    args
}

/// The root's buffer of the last case, regenerated when the case changes.
struct Expected {
    case: Option<(usize, usize)>,
    bytes: Vec<u8>,
}

impl Expected {
    /// The bytes `root` broadcasts in a case of `size` bytes.
    fn of(&mut self, seed: u64, root: usize, size: usize) -> &[u8] {
        if self.case != Some((root, size)) {
            self.bytes.resize(size, 0);
            fill_random(&mut self.bytes, case_seed(seed, root, size));
            self.case = Some((root, size));
        }
        &self.bytes
    }
}

/// Broadcasts `size` bytes from `root` and checks them; prints the line.
fn broadcast(comm: &mut Comm, args: &Args, size: usize, root: usize, buf: &mut Vec<u8>, expected: &mut Expected) {
    let me = comm.rank();
    let (mut len, mut call_root) = (size, root);
    match &args.mismatch {
        Some((kind, at)) if *at == me && kind == "count" => len += 1,
        Some((kind, at)) if *at == me && kind == "root" => call_root = me,
        _ => {}
    }
    let expected = expected.of(args.seed, root, size);
    buf.resize(len, 0);
    if me == call_root {
        buf[..size].copy_from_slice(expected);
    } else {
        // Not the root's bytes (a chunk left unwritten cannot match).
        buf.fill(0xa5 ^ me as u8);
    }
    let start = Instant::now();
    if let Err(e) = comm.broadcast(buf, Dtype::U8, call_root) {
        fail(&e);
    }
    let us = start.elapsed().as_micros();
    // Slice equality is one memcmp; the first difference is looked for only
    // when there is one.
    let differs = buf[..size] != *expected;
    match differs.then(|| buf.iter().zip(expected.iter()).position(|(a, b)| a != b).unwrap_or(size)) {
        None => println!("bcast size={size} root={root} match=1 us={us}"),
        Some(offset) => {
            println!("bcast size={size} root={root} match=0 first_diff={offset} us={us}");
            std::process::exit(3);
        }
    }
}

fn report(comm: &Comm) {
    let stats = comm.stats().expect("stats");
    let user = &stats.user;
    // The host's kernel broadcast counters (every communicator of the host
    // adds to them; here there is one per host).
    let kernel = comm.attachment().map(|a| a.broadcast_stats().expect("broadcast stats")).unwrap_or_default();
    // The first program a datagram meets: XDP ingress, or on the TC hooks TC ingress.
    let hooks = comm.attachment().map(|a| a.hooks());
    let first = if hooks == Some(aggbox_core::loader::Hooks::Tc) { Prog::TcIngress } else { Prog::XdpIngress };
    let kernel: Vec<String> =
        aggbox_core::maps::BSTAT_NAMES.iter().zip(kernel).map(|(name, value)| format!("k_{name}={value}")).collect();
    println!(
        "report rank={} size={} datapath={} chunk={} broadcasts={} retransmits={} duplicates={} chunks_sent={} acks_received={} sent={} received={} xdp_accepted={} ingress_accepted={} hooks={} gso_sends={} gso_segments={} gro_receives={} gro_segments={} group_acks={} landed={} chunks_received={} placed_from_socket={} windowed={} {}",
        comm.rank(),
        comm.size(),
        comm.datapath().name(),
        comm.chunk_size(),
        user.broadcasts,
        user.retransmits,
        user.duplicates,
        user.bcast_chunks_sent,
        user.bcast_acks_received,
        user.packets_sent,
        user.packets_received,
        stats.kernel.get(Prog::XdpIngress, "accepted"),
        stats.kernel.get(first, "accepted"),
        hooks.map_or("none", |h| h.name()),
        comm.gso_sends().0,
        comm.gso_sends().1,
        comm.gro_receives().0,
        comm.gro_receives().1,
        user.bcast_group_acks,
        user.bcast_landed,
        user.bcast_chunks_received,
        user.bcast_placed_from_socket,
        comm.attachment().is_some_and(|a| a.windows().is_some()) as u8,
        kernel.join(" "),
    );
}

fn main() {
    let mut comm = Comm::from_env().unwrap_or_else(|e| fail(&e));
    let args = parse_args(comm.size());
    let (mut buf, mut expected) = (Vec::new(), Expected { case: None, bytes: Vec::new() });
    loop {
        for case in &args.cases {
            for &root in &case.roots {
                if args.barrier {
                    comm.barrier().unwrap_or_else(|e| fail(&e));
                }
                broadcast(&mut comm, &args, case.size, root, &mut buf, &mut expected);
            }
            if args.forever {
                break;
            }
        }
        if !args.forever {
            break;
        }
    }
    report(&comm);
}
