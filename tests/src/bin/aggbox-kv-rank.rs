//! A rank process for the key-value reduce tests: joins the group from the
//! environment (RANK, WORLD_SIZE, MASTER_ADDR, AGGBOX_DATAPATH, …), runs one
//! or more key-value reduces and writes the pairs it owns to a file, which
//! the test compares with its own plain count.
//!
//! `aggbox-kv-rank --out PATH [--files LIST | --zipf PAIRS:DISTINCT:SEED]
//!  [--dtype i64|u64|f64] [--op sum|min|max] [--key-max N] [--capacity N]
//!  [--batch N] [--rounds N] [--forever] [--mismatch-at RANK] [--no-combine]`
//! - `--files LIST`: LIST holds one path per line; this rank counts the words
//!   (`aggbox_tests::words`) of the files whose line number mod WORLD_SIZE
//!   is its rank, each with value 1.
//! - `--zipf PAIRS:DISTINCT:SEED`: PAIRS pairs in all, this rank's share
//!   its `aggbox_tests::zipf_pair`s `rank, rank + N, …` below PAIRS.
//! - Pairs are emitted `--batch` at a time (default 4096).
//! - The output has one line per pair the rank owns, `HEXKEY VALUE` (the
//!   value's 64 bits in decimal), written after each round (`--rounds`,
//!   default 1, repeats the same operation; each round's output replaces
//!   the last).
//! - `--forever`: repeats rounds until a call fails.
//! - `--no-combine`: every pair is sent (no combining on the mapper).
//! - `--mismatch-at R`: rank R uses u64 values when the others use i64.
//! - Lines: `kv round=I pairs=P owned=K us=T` per round, then `report
//!   rank=… datapath=… emitted=… local=… batches=… retransmits=…
//!   duplicates=… folded_user=… folded_kernel=… spilled=… unarmed=…
//!   packets_received=…` (summed over the rounds). A failed call prints `error status=STATUS blamed=RANK
//!   message=…` and exits 1.

use std::{io::Write, time::Instant};

use aggbox_core::{
    kv::{KvConfig, KvStats},
    Comm, Dtype, ReduceOp,
};
use aggbox_tests::{fail, words, zipf_key, zipf_pair, Zipf};

struct Args {
    out: String,
    files: Option<String>,
    zipf: Option<(usize, usize, u64)>,
    config: KvConfig,
    batch: usize,
    rounds: usize,
    forever: bool,
    mismatch_at: Option<usize>,
}

fn parse_args() -> Args {
    let argv: Vec<String> = std::env::args().skip(1).collect();
    let mut args = Args {
        out: String::new(),
        files: None,
        zipf: None,
        config: KvConfig::default(),
        batch: 4096,
        rounds: 1,
        forever: false,
        mismatch_at: None,
    };
    let mut i = 0;
    while i < argv.len() {
        if argv[i] == "--forever" || argv[i] == "--no-combine" {
            if argv[i] == "--forever" {
                args.forever = true;
            } else {
                args.config.combine = false;
            }
            i += 1;
            continue;
        }
        let value = argv.get(i + 1).cloned().unwrap_or_else(|| panic!("{} needs a value", argv[i]));
        match argv[i].as_str() {
            "--out" => args.out = value,
            "--files" => args.files = Some(value),
            "--zipf" => {
                let parts: Vec<&str> = value.split(':').collect();
                assert_eq!(parts.len(), 3, "--zipf PAIRS:DISTINCT:SEED");
                args.zipf = Some((parts[0].parse().unwrap(), parts[1].parse().unwrap(), parts[2].parse().unwrap()));
            }
            "--dtype" => {
                args.config.dtype = match value.as_str() {
                    "i64" => Dtype::I64,
                    "u64" => Dtype::U64,
                    "f64" => Dtype::F64,
                    other => panic!("unknown dtype {other}"),
                }
            }
            "--op" => {
                args.config.op = match value.as_str() {
                    "sum" => ReduceOp::Sum,
                    "min" => ReduceOp::Min,
                    "max" => ReduceOp::Max,
                    other => panic!("unknown op {other}"),
                }
            }
            "--key-max" => args.config.key_max = value.parse().unwrap(),
            "--capacity" => args.config.kernel_capacity = value.parse().unwrap(),
            "--batch" => args.batch = value.parse().unwrap(),
            "--rounds" => args.rounds = value.parse().unwrap(),
            "--mismatch-at" => args.mismatch_at = Some(value.parse().unwrap()),
            other => panic!("unknown argument {other}"),
        }
        i += 2;
    }
    assert!(!args.out.is_empty(), "--out PATH");
    args
}

/// This rank's pairs: keys concatenated, their lengths, their values.
struct Pairs {
    keys: Vec<u8>,
    lens: Vec<u32>,
    values: Vec<u64>,
}

fn my_pairs(args: &Args, rank: usize, ranks: usize) -> Pairs {
    let mut pairs = Pairs { keys: Vec::new(), lens: Vec::new(), values: Vec::new() };
    if let Some(list) = &args.files {
        let list = std::fs::read_to_string(list).expect("read the file list");
        for (i, path) in list.lines().enumerate() {
            if i % ranks != rank {
                continue;
            }
            let text = std::fs::read(path).unwrap_or_else(|e| panic!("read {path}: {e}"));
            for word in words(&text, args.config.key_max) {
                pairs.keys.extend_from_slice(&word);
                pairs.lens.push(word.len() as u32);
                pairs.values.push(1);
            }
        }
    }
    if let Some((total, distinct, seed)) = args.zipf {
        let zipf = Zipf::new(distinct);
        let float = args.config.dtype == Dtype::F64;
        for i in (rank..total).step_by(ranks) {
            let (id, value) = zipf_pair(&zipf, seed, rank, i, float);
            let key = zipf_key(id);
            pairs.keys.extend_from_slice(&key);
            pairs.lens.push(key.len() as u32);
            pairs.values.push(value);
        }
    }
    pairs
}

fn add(total: &mut KvStats, s: KvStats) {
    total.pairs_emitted += s.pairs_emitted;
    total.pairs_local += s.pairs_local;
    total.pairs_combined += s.pairs_combined;
    total.batches_sent += s.batches_sent;
    total.retransmits += s.retransmits;
    total.duplicates += s.duplicates;
    total.pairs_folded_user += s.pairs_folded_user;
    total.pairs_folded_kernel += s.pairs_folded_kernel;
    total.spilled += s.spilled;
    total.batches_unarmed += s.batches_unarmed;
}

fn main() {
    let args = parse_args();
    // The input first (a mapper's output is there before the shuffle), so
    // the ranks begin together.
    let env = |name: &str| -> usize { std::env::var(name).ok().and_then(|v| v.parse().ok()).expect(name) };
    let pairs = my_pairs(&args, env("RANK"), env("WORLD_SIZE"));
    let mut comm = Comm::from_env().unwrap_or_else(|e| fail(&e));
    let rank = comm.rank();
    let mut config = args.config;
    if args.mismatch_at == Some(rank) {
        config.dtype = Dtype::U64;
    }
    let mut total = KvStats::default();
    let mut round = 0;
    while round < args.rounds || args.forever {
        let start = Instant::now();
        comm.kv_begin(&config).unwrap_or_else(|e| fail(&e));
        let (mut k, mut v) = (0, 0);
        while v < pairs.lens.len() {
            let end = (v + args.batch).min(pairs.lens.len());
            let bytes: usize = pairs.lens[v..end].iter().map(|&l| l as usize).sum();
            comm.kv_emit(&pairs.keys[k..k + bytes], &pairs.lens[v..end], &pairs.values[v..end]).unwrap_or_else(|e| fail(&e));
            k += bytes;
            v = end;
        }
        let result = comm.kv_finish().unwrap_or_else(|e| fail(&e));
        let us = start.elapsed().as_micros();
        add(&mut total, result.stats());
        let mut out = std::io::BufWriter::new(std::fs::File::create(&args.out).expect("create the output"));
        for (key, value) in result.iter() {
            for b in key {
                write!(out, "{b:02x}").unwrap();
            }
            writeln!(out, " {value}").unwrap();
        }
        out.flush().unwrap();
        println!("kv round={round} pairs={} owned={} us={us}", pairs.lens.len(), result.len());
        round += 1;
    }
    let stats = comm.stats().unwrap_or_else(|e| fail(&e));
    println!(
        "report rank={rank} datapath={} emitted={} local={} combined={} batches={} retransmits={} duplicates={} folded_user={} folded_kernel={} spilled={} unarmed={} packets_received={}",
        comm.datapath().name(),
        total.pairs_emitted,
        total.pairs_local,
        total.pairs_combined,
        total.batches_sent,
        total.retransmits,
        total.duplicates,
        total.pairs_folded_user,
        total.pairs_folded_kernel,
        total.spilled,
        total.batches_unarmed,
        stats.user.packets_received,
    );
}
