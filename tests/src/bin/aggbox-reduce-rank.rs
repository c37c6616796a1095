//! A rank process for the reduction tests: joins the group from the
//! environment (RANK, WORLD_SIZE, MASTER_ADDR, AGGBOX_DATAPATH, …), runs
//! allreduce, reduce, reduce-scatter and allgather cases, and checks every
//! element against a plain loop over every rank's input.
//!
//! `aggbox-reduce-rank --seed N --case COLL:DTYPE:OP:COUNT[:ROOT] [--case …] [--special] [--forever] [--mismatch count --at RANK]`
//! - COLL is `allreduce`, `reduce` (ROOT, default 0), `reduce_scatter`
//!   (COUNT elements per rank) or `allgather` (COUNT elements per rank; OP
//!   is ignored, write `-`); DTYPE `i32 i64 u32 u64 f32 f64`; OP `sum min
//!   max avg`.
//! - Every rank's input element `i` is a hash of (seed, case, rank, i), so
//!   each rank computes the expected result itself. Integers cover their
//!   whole range (sums wrap); floats are k/1000 for |k| ≤ 10^6.
//! - `--special`: float inputs get NaN and ±Inf at elements 0..4 (rank 0
//!   NaN at 0; rank 0 +Inf at 1; rank 0 +Inf and rank 1 −Inf at 2; the
//!   last rank −Inf at 3).
//! - Float SUM and AVG are compared within 1e-6 × max|x| × N (f32) or
//!   1e-12 × max|x| × N (f64) of a sum in f64; NaN must be NaN and ±Inf
//!   exact; everything else exactly.
//! - One line per case: `red coll=… dtype=… op=… count=… match=1 us=T`
//!   (`match=0 first_diff=I got=… want=…` and exit 3 on a difference), then
//!   `report rank=… reductions=… retransmits=… duplicates=… …`.
//! - `--forever`: repeats the first case until a call fails.
//! - `--print-group`: rank 0 first prints `group id=… token=…` (for the
//!   test that crafts datagrams from outside the group).
//! - A failed call prints `error status=STATUS blamed=RANK message=…` and
//!   exits 1.

use std::time::Instant;

use aggbox_core::{Comm, Dtype, ReduceOp};
use aggbox_tests::fail;

#[derive(Clone, Copy)]
struct Case {
    coll: &'static str,
    dtype: Dtype,
    op: ReduceOp,
    count: usize,
    root: usize,
}

struct Args {
    seed: u64,
    cases: Vec<Case>,
    special: bool,
    forever: bool,
    print_group: bool,
    mismatch_at: Option<usize>,
}

fn parse_case(text: &str) -> Case {
    let parts: Vec<&str> = text.split(':').collect();
    assert!(parts.len() == 4 || parts.len() == 5, "--case COLL:DTYPE:OP:COUNT[:ROOT], not {text}");
    let dtype = match parts[1] {
        "i32" => Dtype::I32,
        "i64" => Dtype::I64,
        "u32" => Dtype::U32,
        "u64" => Dtype::U64,
        "f32" => Dtype::F32,
        "f64" => Dtype::F64,
        other => panic!("unknown dtype {other}"),
    };
    let op = match parts[2] {
        "sum" | "-" => ReduceOp::Sum,
        "min" => ReduceOp::Min,
        "max" => ReduceOp::Max,
        "avg" => ReduceOp::Avg,
        other => panic!("unknown op {other}"),
    };
    let coll = match parts[0] {
        "allreduce" => "allreduce",
        "reduce" => "reduce",
        "reduce_scatter" => "reduce_scatter",
        "allgather" => "allgather",
        other => panic!("unknown collective {other}"),
    };
    Case {
        coll,
        dtype,
        op,
        count: parts[3].parse().expect("a count"),
        root: parts.get(4).map_or(0, |r| r.parse().expect("a root")),
    }
}

fn parse_args() -> Args {
    let argv: Vec<String> = std::env::args().skip(1).collect();
    let mut args = Args { seed: 1, cases: Vec::new(), special: false, forever: false, print_group: false, mismatch_at: None };
    let mut i = 0;
    while i < argv.len() {
        let value = || argv.get(i + 1).cloned().unwrap_or_else(|| panic!("{} needs a value", argv[i]));
        match argv[i].as_str() {
            "--seed" => args.seed = value().parse().expect("a seed"),
            "--case" => args.cases.push(parse_case(&value())),
            "--at" => args.mismatch_at = Some(value().parse().expect("a rank")),
            "--mismatch" => assert_eq!(value(), "count", "only --mismatch count"),
            "--special" | "--forever" | "--print-group" => {
                match argv[i].as_str() {
                    "--special" => args.special = true,
                    "--forever" => args.forever = true,
                    _ => args.print_group = true,
                }
                i += 1;
                continue;
            }
            other => panic!("unknown argument {other}"),
        }
        i += 2;
    }
    args
}

/// splitmix64 of the element's coordinates.
fn hash(seed: u64, case: usize, rank: usize, i: usize) -> u64 {
    let mut z = seed ^ (case as u64).wrapping_mul(0x9E37_79B9_7F4A_7C15) ^ ((rank as u64) << 40) ^ (i as u64);
    z = z.wrapping_add(0x9E37_79B9_7F4A_7C15);
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

/// Largest |x| of a float input (not counting NaN and Inf).
const FLOAT_MAX: f64 = 1000.0;

/// The float input (as f64) of `rank` at `i`.
fn float_input(h: u64, rank: usize, i: usize, n: usize, special: bool) -> f64 {
    if special {
        match (i, rank) {
            (0, 0) => return f64::NAN,
            (1, 0) | (2, 0) => return f64::INFINITY,
            (2, 1) => return f64::NEG_INFINITY,
            (3, r) if r == n - 1 => return f64::NEG_INFINITY,
            _ => {}
        }
    }
    ((h % 2_000_001) as i64 - 1_000_000) as f64 / 1000.0
}

/// Which inputs: those of case `case` of the run seeded `seed`, on `n`
/// ranks, with NaN and Inf (`special`) or not.
struct Inputs {
    seed: u64,
    case: usize,
    n: usize,
    special: bool,
}

/// Writes rank `rank`'s input into `buf` (`count` elements of `dtype`).
fn fill(buf: &mut Vec<u8>, dtype: Dtype, count: usize, inputs: &Inputs, rank: usize) {
    let Inputs { seed, case, n, special } = *inputs;
    buf.clear();
    buf.reserve(count * dtype.size());
    for i in 0..count {
        let h = hash(seed, case, rank, i);
        match dtype {
            Dtype::I32 | Dtype::U32 => buf.extend_from_slice(&(h as u32).to_le_bytes()),
            Dtype::I64 | Dtype::U64 => buf.extend_from_slice(&h.to_le_bytes()),
            Dtype::F32 => buf.extend_from_slice(&(float_input(h, rank, i, n, special) as f32).to_le_bytes()),
            Dtype::F64 => buf.extend_from_slice(&float_input(h, rank, i, n, special).to_le_bytes()),
            Dtype::U8 => unreachable!(),
        }
    }
}

/// An element as the reference sees it.
#[derive(Clone, Copy, Debug, PartialEq)]
enum Value {
    Int(i128),
    Float(f64),
}

fn load(bytes: &[u8], dtype: Dtype, i: usize) -> Value {
    let s = dtype.size();
    let b = &bytes[i * s..(i + 1) * s];
    match dtype {
        Dtype::I32 => Value::Int(i32::from_le_bytes(b.try_into().unwrap()) as i128),
        Dtype::U32 => Value::Int(u32::from_le_bytes(b.try_into().unwrap()) as i128),
        Dtype::I64 => Value::Int(i64::from_le_bytes(b.try_into().unwrap()) as i128),
        Dtype::U64 => Value::Int(u64::from_le_bytes(b.try_into().unwrap()) as i128),
        Dtype::F32 => Value::Float(f32::from_le_bytes(b.try_into().unwrap()) as f64),
        Dtype::F64 => Value::Float(f64::from_le_bytes(b.try_into().unwrap())),
        Dtype::U8 => unreachable!(),
    }
}

/// Wraps an exact integer sum to `dtype`'s width, as two's complement.
fn wrap(v: i128, dtype: Dtype) -> i128 {
    match dtype {
        Dtype::I32 => v as i32 as i128,
        Dtype::U32 => v as u32 as i128,
        Dtype::I64 => v as i64 as i128,
        Dtype::U64 => v as u64 as i128,
        _ => v,
    }
}

/// Rank `r`'s input element `i` of case `index`, as the reference sees it.
fn input(dtype: Dtype, seed: u64, index: usize, r: usize, i: usize, n: usize, special: bool) -> Value {
    let h = hash(seed, index, r, i);
    match dtype {
        Dtype::I32 => Value::Int(h as u32 as i32 as i128),
        Dtype::U32 => Value::Int(h as u32 as i128),
        Dtype::I64 => Value::Int(h as i64 as i128),
        Dtype::U64 => Value::Int(h as i128),
        Dtype::F32 => Value::Float(float_input(h, r, i, n, special) as f32 as f64),
        _ => Value::Float(float_input(h, r, i, n, special)),
    }
}

/// The expected element `i`: `op` over every rank's input, by a plain loop.
fn expected(case: &Case, seed: u64, index: usize, i: usize, n: usize, special: bool) -> Value {
    let input = |r: usize| input(case.dtype, seed, index, r, i, n, special);
    let mut acc = input(0);
    for r in 1..n {
        acc = match (acc, input(r)) {
            (Value::Int(a), Value::Int(b)) => Value::Int(match case.op {
                ReduceOp::Sum | ReduceOp::Avg => a + b,
                ReduceOp::Min => a.min(b),
                ReduceOp::Max => a.max(b),
            }),
            (Value::Float(a), Value::Float(b)) => Value::Float(match case.op {
                ReduceOp::Sum | ReduceOp::Avg => a + b,
                _ if a.is_nan() || b.is_nan() => f64::NAN,
                ReduceOp::Min => a.min(b),
                ReduceOp::Max => a.max(b),
            }),
            _ => unreachable!(),
        };
    }
    match acc {
        Value::Int(v) => Value::Int(wrap(v, case.dtype)),
        Value::Float(v) if case.op == ReduceOp::Avg => Value::Float(v / n as f64),
        other => other,
    }
}

/// Whether `got` is `want` within the documented bound.
fn close(got: Value, want: Value, case: &Case, n: usize) -> bool {
    match (got, want) {
        (Value::Int(g), Value::Int(w)) => g == w,
        (Value::Float(g), Value::Float(w)) if w.is_nan() => g.is_nan(),
        (Value::Float(g), Value::Float(w)) if w.is_infinite() => g == w,
        (Value::Float(g), Value::Float(w)) => match case.op {
            ReduceOp::Sum | ReduceOp::Avg => {
                let eps = if case.dtype == Dtype::F32 { 1e-6 } else { 1e-12 };
                (g - w).abs() <= eps * FLOAT_MAX * n as f64
            }
            _ => g == w,
        },
        _ => false,
    }
}

fn run_case(comm: &mut Comm, args: &Args, index: usize, case: &Case) {
    let (me, n) = (comm.rank(), comm.size());
    let mut count = case.count;
    if args.mismatch_at == Some(me) {
        count += 1;
    }
    let d = case.dtype;
    let special = args.special && matches!(d, Dtype::F32 | Dtype::F64);
    let mut send = Vec::new();
    let per_rank_input = if case.coll == "reduce_scatter" { count * n } else { count };
    fill(&mut send, d, per_rank_input, &Inputs { seed: args.seed, case: index, n, special }, me);
    let start = Instant::now();
    let (result, out_len) = match case.coll {
        "allreduce" => {
            comm.allreduce(&mut send, d, case.op).unwrap_or_else(|e| fail(&e));
            (send, count)
        }
        "reduce" => {
            let mut recv = if me == case.root { vec![0u8; send.len()] } else { Vec::new() };
            comm.reduce_from(&send, &mut recv, d, case.op, case.root).unwrap_or_else(|e| fail(&e));
            let len = if me == case.root { count } else { 0 };
            (recv, len)
        }
        "reduce_scatter" => {
            let mut recv = vec![0u8; count * d.size()];
            comm.reduce_scatter(&send, &mut recv, d, case.op).unwrap_or_else(|e| fail(&e));
            (recv, count)
        }
        "allgather" => {
            let mut recv = vec![0u8; count * n * d.size()];
            comm.allgather(&send, &mut recv, d).unwrap_or_else(|e| fail(&e));
            (recv, count * n)
        }
        _ => unreachable!("checked when parsed"),
    };
    let us = start.elapsed().as_micros();
    let want = |j: usize| match case.coll {
        "reduce_scatter" => expected(case, args.seed, index, me * count + j, n, special),
        "allgather" => input(d, args.seed, index, j / count, j % count, n, special),
        _ => expected(case, args.seed, index, j, n, special),
    };
    // Allgather only copies: compared exactly (as MIN results are).
    let exact_case = Case { op: if case.coll == "allgather" { ReduceOp::Min } else { case.op }, ..*case };
    let line = format!("red coll={} dtype={d} op={} count={} root={}", case.coll, case.op, case.count, case.root);
    for j in 0..out_len {
        let (got, want) = (load(&result, d, j), want(j));
        if !close(got, want, &exact_case, n) {
            println!("{line} match=0 first_diff={j} got={got:?} want={want:?} us={us}");
            std::process::exit(3);
        }
    }
    println!("{line} match=1 us={us}");
}

fn main() {
    let mut comm = Comm::from_env().unwrap_or_else(|e| fail(&e));
    let args = parse_args();
    if args.print_group && comm.rank() == 0 {
        let group = comm.group_info();
        println!("group id={} token={}", group.group, group.token);
    }
    loop {
        for (index, case) in args.cases.iter().enumerate() {
            run_case(&mut comm, &args, index, case);
            if args.forever {
                break;
            }
        }
        if !args.forever {
            break;
        }
    }
    let stats = comm.stats().unwrap_or_else(|e| fail(&e));
    let u = stats.user;
    // The host's kernel reduction counters (one communicator per host here).
    let kernel = comm.attachment().map(|a| a.reduce_stats().expect("reduction stats")).unwrap_or_default();
    let mut kernel: Vec<String> =
        aggbox_core::maps::RSTAT_NAMES.iter().zip(kernel).map(|(name, value)| format!("k_red_{name}={value}")).collect();
    // Every map pinned for the host's attachment, as the kernel charges it.
    if let Some((maps, bytes)) = comm.attachment().map(|a| a.map_memory().expect("map memory")) {
        kernel.push(format!("k_maps={maps} k_map_bytes={bytes}"));
    }
    println!(
        "report rank={} size={} datapath={} reductions={} quantized={} retransmits={} duplicates={} contributions_sent={} folded={} results_sent={} results_received={} results_from_kernel={} sent={} received={} dropped_foreign={} dropped_malformed={} ingress_bad_token={} ingress_not_member={} {}",
        comm.rank(),
        comm.size(),
        comm.datapath().name(),
        u.reductions,
        u.reduce_quantized,
        u.retransmits,
        u.duplicates,
        u.reduce_contributions_sent,
        u.reduce_folded,
        u.reduce_results_sent,
        u.reduce_results_received,
        u.reduce_results_from_kernel,
        u.packets_sent,
        u.packets_received,
        u.dropped_foreign,
        u.dropped_malformed,
        // The first program a datagram meets drops it: XDP ingress on
        // the XDP hooks, TC ingress on the TC hooks.
        ingress(&stats.kernel, "drop_bad_token"),
        ingress(&stats.kernel, "drop_not_member"),
        kernel.join(" "),
    );
}

/// Counter `stat` of the host's ingress programs: XDP ingress and TC
/// ingress (whichever of them is first on this host's hooks drops).
fn ingress(kernel: &aggbox_core::stats::KernelStats, stat: &str) -> u64 {
    use aggbox_core::maps::Prog;
    kernel.get(Prog::XdpIngress, stat) + kernel.get(Prog::TcIngress, stat)
}
