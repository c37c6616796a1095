//! Reductions across processes in an 8-host virtual cluster (MTU 1500):
//! allreduce, reduce, reduce-scatter and allgather of every dtype × op on
//! 2, 3, 5 and 8 ranks, on the user and kernel datapaths and mixed; large
//! vectors (1 Mi + 3 and 16 Mi elements); NaN and ±Inf inputs; injected
//! loss, duplication and reordering; a rank killed mid-operation; a crafted
//! contribution from a host that is not a member; mismatched counts. Every
//! rank checks every element against a plain loop over all ranks' inputs
//! (`aggbox-reduce-rank`).
//!
//! The hosts are on a plain bridge, the network users have, so AggBox is on
//! the TC hooks: on the kernel datapath the owners' TC ingress folds the
//! contributions (UDP GSO super-chunks, segment by segment) and the results
//! are fanned out and placed in the kernel; the kernel runs check that
//! results came from the kernel windows (see docs/ALLREDUCE.md, "The TC
//! hooks").
//!
//! The tests run one at a time (they share two cores): each holds `serial()`.

use std::{
    collections::HashMap,
    net::{SocketAddrV4, UdpSocket},
    path::PathBuf,
    time::{Duration, Instant},
};

use aggbox_core::{
    cluster::Cluster,
    fault::FaultSpec,
    wire::{Header, Kind, HDR_LEN},
};
use aggbox_tests::{fields, kernel, mixed, number, serial, survivors_blame, user, RankProcess};

const HOSTS: usize = 8;
const MASTER_PORT: u16 = 29_700;
/// Every rank's UDP port (fixed, so the crafted datagrams can reach them).
const RANK_PORT: u16 = 47_300;
const SEED: &str = "20261202";
const INT_TYPES: [&str; 4] = ["i32", "i64", "u32", "u64"];
const FLOAT_TYPES: [&str; 2] = ["f32", "f64"];

fn rank_binary() -> PathBuf {
    env!("CARGO_BIN_EXE_aggbox-reduce-rank").into()
}

type DatapathOf = fn(usize) -> &'static str;

/// Every dtype × op of the four collectives at `count` elements.
fn matrix(count: usize) -> Vec<String> {
    let mut cases = Vec::new();
    for dtype in INT_TYPES.iter().chain(&FLOAT_TYPES) {
        let ops: &[&str] = if FLOAT_TYPES.contains(dtype) { &["sum", "min", "max", "avg"] } else { &["sum", "min", "max"] };
        for op in ops {
            cases.push(format!("allreduce:{dtype}:{op}:{count}"));
        }
        cases.push(format!("reduce:{dtype}:sum:{count}:1"));
        cases.push(format!("reduce_scatter:{dtype}:max:{count}"));
        cases.push(format!("allgather:{dtype}:-:{count}"));
    }
    cases
}

/// Starts `n` ranks on hosts 0..n running the rank program with `args`.
fn spawn(cluster: &Cluster, n: usize, datapath_of: DatapathOf, args: &[String], port: u16) -> Vec<RankProcess> {
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let rank_port = RANK_PORT.to_string();
    (0..n)
        .map(|i| {
            RankProcess::spawn(
                cluster,
                i,
                0,
                port,
                i,
                n,
                datapath_of(i),
                &rank_binary(),
                &args,
                &[("AGGBOX_PORT", rank_port.as_str())],
            )
        })
        .collect()
}

fn case_args(cases: &[String], extra: &[&str]) -> Vec<String> {
    let mut args = vec!["--seed".to_string(), SEED.into()];
    for case in cases {
        args.push("--case".into());
        args.push(case.clone());
    }
    args.extend(extra.iter().map(|s| s.to_string()));
    args
}

/// Runs `cases` on `n` ranks; checks that every rank matched every case and
/// returns each rank's report.
fn run(cluster: &Cluster, n: usize, datapath_of: DatapathOf, cases: &[String], extra: &[&str]) -> Vec<HashMap<String, String>> {
    let start = Instant::now();
    let ranks = spawn(cluster, n, datapath_of, &case_args(cases, extra), MASTER_PORT + n as u16);
    let reports: Vec<_> = ranks
        .into_iter()
        .enumerate()
        .map(|(i, rank)| {
            let (code, lines) = rank.finish(Duration::from_secs(240));
            assert_eq!(code, 0, "rank {i} of {n} ({}) failed: {lines:?}", datapath_of(i));
            let matched = lines.iter().filter(|l| l.starts_with("red ") && l.contains(" match=1 ")).count();
            assert_eq!(matched, cases.len(), "rank {i}: {lines:?}");
            let report = fields(lines.iter().find(|l| l.starts_with("report ")).expect("report line"));
            assert_eq!(report["datapath"], datapath_of(i), "rank {i}");
            report
        })
        .collect();
    eprintln!(
        "{} cases on {n} ranks ({}) in {:?}: {} retransmits, {} duplicates",
        cases.len(),
        datapath_of(1 % n),
        start.elapsed(),
        total(&reports, "retransmits"),
        total(&reports, "duplicates")
    );
    reports
}

fn total(reports: &[HashMap<String, String>], key: &str) -> u64 {
    reports.iter().map(|r| number(r, key)).sum()
}

/// Contributions `cases` make on `n` ranks, each folded exactly once by
/// some owner: every chunk of a reduction gets one from each rank but its
/// owner; a float SUM or AVG first agrees on its scale (a 1-element MAX
/// allreduce); allgather is broadcasts.
fn contributions(cases: &[String], n: usize) -> u64 {
    cases
        .iter()
        .map(|case| {
            let parts: Vec<&str> = case.split(':').collect();
            let size = if parts[1].ends_with("64") { 8 } else { 4 };
            let per_chunk = 1432 / size;
            let count: usize = parts[3].parse().unwrap();
            let chunks = match parts[0] {
                "allgather" => 0,
                "reduce_scatter" => count.div_ceil(per_chunk) * n,
                _ => count.div_ceil(per_chunk),
            };
            let scale = usize::from(parts[1].starts_with('f') && matches!(parts[2], "sum" | "avg") && count > 0 && parts[0] != "allgather");
            ((chunks + scale) * (n - 1)) as u64
        })
        .sum()
}

/// On the kernel datapath, each contribution was folded exactly once, by a
/// host's XDP or (when it reached the socket) by the owner's process, and
/// XDP did most of it.
fn assert_kernel_folding(reports: &[HashMap<String, String>], cases: &[String], n: usize) {
    let (kernel, user) = (total(reports, "k_red_folded"), total(reports, "folded"));
    assert_eq!(kernel + user, contributions(cases, n), "every contribution folded once ({kernel} by XDP, {user} in user space)");
    assert_eq!(total(reports, "k_red_errors"), 0, "no tail call failed");
    let completed = total(reports, "k_red_sums") + total(reports, "k_red_fanned_out");
    assert!(kernel > 0 && completed > 0, "XDP folded and completed chunks");
    // Results (and DONEs) in the kernel: the ranks took them from their
    // result windows, hardly ever from their sockets (a race of two copies).
    let (from_kernel, from_socket) = (total(reports, "results_from_kernel"), total(reports, "results_received"));
    assert!(from_kernel > 0 && from_socket * 100 <= from_kernel, "{from_kernel} results from the kernel, {from_socket} from sockets");
    eprintln!(
        "{n} ranks: {kernel} contributions folded by XDP, {user} by owners' processes, {} RED_SUM notices, {} results fanned out by TC, {} placed by XDP, {} results from sockets",
        total(reports, "k_red_sums"),
        total(reports, "k_red_fanned_out"),
        total(reports, "k_red_placed"),
        total(reports, "results_received"),
    );
}

#[test]
fn every_dtype_and_op_on_2_3_5_and_8_ranks_and_each_datapath() {
    let _serial = serial();
    let cluster = Cluster::temporary_plain(HOSTS, 1500).unwrap();
    let mut cases = Vec::new();
    for count in [0, 1, 1000] {
        cases.extend(matrix(count));
    }
    for n in [2, 3, 5, 8] {
        for datapath_of in [user as DatapathOf, kernel, mixed] {
            let reports = run(&cluster, n, datapath_of, &cases, &[]);
            assert!(total(&reports, "folded") + total(&reports, "k_red_folded") > 0, "owners folded contributions");
            if datapath_of(0) == "kernel" && datapath_of(1) == "kernel" {
                assert_kernel_folding(&reports, &cases, n);
            }
            // Float allreduce SUM and AVG and reduce SUM, of 1 and 1000
            // elements (not 0), two float types: quantized.
            let quantized_calls = 3 * 2 * 2;
            for (i, report) in reports.iter().enumerate() {
                assert_eq!(number(report, "quantized"), quantized_calls, "rank {i} of {n}");
            }
        }
    }
}

#[test]
fn large_vectors_and_ieee_specials() {
    let _serial = serial();
    let cluster = Cluster::temporary_plain(HOSTS, 1500).unwrap();
    let big = (1 << 20) + 3;
    let cases: Vec<String> = [
        format!("allreduce:f32:sum:{big}"),
        format!("allreduce:i64:max:{big}"),
        format!("allreduce:f64:avg:{big}"),
        format!("reduce:u32:min:{big}:7"),
        format!("reduce_scatter:i32:sum:{}", big / 8),
        format!("allgather:u64:-:{}", big / 8),
        format!("allreduce:f32:sum:{}", 16 << 20),
    ]
    .to_vec();
    for datapath_of in [user as DatapathOf, kernel] {
        let reports = run(&cluster, HOSTS, datapath_of, &cases, &[]);
        if datapath_of(1) == "kernel" {
            assert_kernel_folding(&reports, &cases, HOSTS);
        }
    }
    // NaN and ±Inf give the IEEE result in every float op.
    let specials: Vec<String> =
        FLOAT_TYPES.iter().flat_map(|d| ["sum", "min", "max", "avg"].map(|op| format!("allreduce:{d}:{op}:1000"))).collect();
    let reports = run(&cluster, 5, mixed, &specials, &["--special"]);
    // NaN or Inf in the inputs: summed as floats, not quantized.
    assert_eq!(total(&reports, "quantized"), 0);
}

#[test]
fn loss_duplication_and_reordering_are_repaired() {
    let _serial = serial();
    let mut cluster = Cluster::temporary_plain(HOSTS, 1500).unwrap();
    cluster.inject_faults(FaultSpec::percent(10.0, 2.0).reorder(5.0)).unwrap();
    let mut cases = matrix(1000);
    cases.push(format!("allreduce:f32:sum:{}", (1 << 20) + 3));
    cases.push(format!("reduce_scatter:u64:sum:{}", 100_000));
    // Big enough that owners reuse their kernel slots (559 owned chunks of
    // a block, 256 slots) while repeats of completed chunks still arrive.
    cases.push(format!("reduce_scatter:i64:sum:{}", 200_000));
    for datapath_of in [user as DatapathOf, kernel, mixed] {
        let before = cluster.fault_stats().unwrap();
        let reports = run(&cluster, HOSTS, datapath_of, &cases, &[]);
        let after = cluster.fault_stats().unwrap();
        let delta = |f: fn(&aggbox_core::fault::FaultStats) -> u64| -> u64 {
            after.iter().zip(&before).map(|(a, b)| f(a) - f(b)).sum()
        };
        let (dropped, duplicated, delayed) = (delta(|s| s.dropped), delta(|s| s.duplicated), delta(|s| s.delayed));
        assert!(dropped > 0 && duplicated > 0 && delayed > 0, "faults: dropped {dropped}, duplicated {duplicated}, delayed {delayed}");
        assert!(total(&reports, "retransmits") > 0, "the loss was repaired by retransmissions");
        assert!(total(&reports, "duplicates") > 0, "duplicates were seen and not folded twice");
    }
}

#[test]
fn a_rank_killed_mid_allreduce_is_named_by_every_survivor() {
    let _serial = serial();
    let cluster = Cluster::temporary_plain(HOSTS, 1500).unwrap();
    let timeout = Duration::from_millis(6000);
    let args = case_args(&[format!("allreduce:f32:sum:{}", 1 << 20)], &["--forever"]);
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let mut ranks: Vec<RankProcess> = (0..HOSTS)
        .map(|i| {
            RankProcess::spawn(
                &cluster,
                i,
                0,
                MASTER_PORT + 20,
                i,
                HOSTS,
                mixed(i),
                &rank_binary(),
                &args,
                &[("AGGBOX_TIMEOUT_MS", "6000")],
            )
        })
        .collect();
    let victim = 5;
    ranks[victim].wait_for("red ");
    std::thread::sleep(Duration::from_millis(50));
    ranks[victim].child.kill().unwrap();
    let killed = Instant::now();
    survivors_blame(ranks, victim, killed, timeout * 4, timeout + Duration::from_secs(4));
}

#[test]
fn mismatched_counts_fail_every_rank() {
    let _serial = serial();
    let cluster = Cluster::temporary_plain(HOSTS, 1500).unwrap();
    let args = case_args(&["allreduce:i32:sum:5000".into()], &["--mismatch", "count", "--at", "3"]);
    let start = Instant::now();
    for (i, rank) in spawn(&cluster, HOSTS, mixed, &args, MASTER_PORT + 30).into_iter().enumerate() {
        let (code, lines) = rank.finish(Duration::from_secs(60));
        assert_eq!(code, 1, "rank {i}: {lines:?}");
        let error = lines.iter().find(|l| l.starts_with("error ")).expect("an error line");
        assert_eq!(fields(error)["status"], "InvalidArgument", "rank {i}: {error}");
        assert!(error.contains("mismatched collective calls"), "rank {i}: {error}");
    }
    assert!(start.elapsed() < Duration::from_secs(15), "every rank failed at once, not by timeout");
}

/// A host that is not a member sends well-formed contributions to every
/// rank during 200 allreduces: with the group's id and a wrong token, and
/// with the right token claiming to be another rank from the wrong address.
/// The results stay exact, and the ranks (or, on the kernel datapath,
/// their XDP programs) count the crafted datagrams as dropped.
#[test]
fn a_crafted_contribution_from_a_non_member_changes_nothing() {
    let _serial = serial();
    let cluster = Cluster::temporary_plain(HOSTS + 1, 1500).unwrap();
    let intruder = HOSTS;
    let count = 20_000usize;
    let cases: Vec<String> = (0..200).map(|_| format!("allreduce:i64:sum:{count}")).collect();
    for (k, datapath_of) in [user as DatapathOf, kernel].into_iter().enumerate() {
        let mut ranks = spawn(&cluster, HOSTS, datapath_of, &case_args(&cases, &["--print-group"]), MASTER_PORT + 40 + k as u16);
        let group = fields(&ranks[0].wait_for("group "));
        let (id, token): (u32, u64) = (group["id"].parse().unwrap(), group["token"].parse().unwrap());
        let targets: Vec<SocketAddrV4> = (0..HOSTS).map(|h| SocketAddrV4::new(cluster.host(h).ipv4, RANK_PORT)).collect();
        let nchunks = count.div_ceil(1432 / 8) as u32;
        let sent = cluster
            .run_in(intruder, move || -> std::io::Result<u64> {
                let socket = UdpSocket::bind("0.0.0.0:0")?;
                let mut sent = 0;
                let end = Instant::now() + Duration::from_millis(500);
                let mut seq = 1;
                while Instant::now() < end {
                    for (rank, target) in targets.iter().enumerate() {
                        for wrong_token in [true, false] {
                            let claimed = ((rank + 1) % HOSTS) as u16;
                            let token = if wrong_token { token ^ 0x5a5a } else { token };
                            let mut header = Header::new(Kind::RedData, id, token, claimed, seq);
                            header.dtype = aggbox_core::Dtype::I64.code();
                            header.op = 0x10; // allreduce, sum
                            header.count = count as u32;
                            header.nchunks = nchunks;
                            header.chunk = rank as u32; // a chunk this rank owns
                            let mut datagram = vec![0u8; HDR_LEN + 1432];
                            header.write_to(&mut datagram);
                            datagram[HDR_LEN..].fill(0x7f);
                            socket.send_to(&datagram, target)?;
                            sent += 1;
                        }
                    }
                    seq = seq % 200 + 1;
                    std::thread::sleep(Duration::from_micros(300));
                }
                Ok(sent)
            })
            .unwrap()
            .unwrap();
        // Still running: every crafted datagram reached an open port.
        let all_running = ranks.iter_mut().all(|r| r.child.try_wait().unwrap().is_none());
        let mut reports = Vec::new();
        for (i, rank) in ranks.into_iter().enumerate() {
            let (code, lines) = rank.finish(Duration::from_secs(120));
            assert_eq!(code, 0, "rank {i}: {lines:?}");
            assert_eq!(lines.iter().filter(|l| l.contains(" match=1 ")).count(), cases.len(), "rank {i}");
            reports.push(fields(lines.iter().find(|l| l.starts_with("report ")).unwrap()));
        }
        let dropped = if datapath_of(0) == "kernel" {
            total(&reports, "ingress_bad_token") + total(&reports, "ingress_not_member")
        } else {
            total(&reports, "dropped_foreign")
        };
        // Every crafted datagram was dropped (none is lost on this clean
        // network; a rank that had exited early would have closed its port).
        if all_running {
            assert_eq!(dropped, sent, "crafted datagrams counted as dropped: {reports:?}");
        } else {
            assert!(dropped > 0 && dropped <= sent, "{dropped} of {sent} crafted datagrams counted as dropped: {reports:?}");
        }
        eprintln!("{}: {sent} crafted datagrams sent, {dropped} counted as dropped", datapath_of(0));
    }
}

/// A training loop's repeated calls on the kernel datapath: after the first
/// call (which nothing armed ahead), every contribution is folded by
/// the owners' XDP, none by their processes, whose sockets get only the
/// completion notices and results.
#[test]
fn repeated_calls_are_folded_in_the_kernel() {
    let _serial = serial();
    let cluster = Cluster::temporary_plain(HOSTS, 1500).unwrap();
    let calls = 40;
    let cases: Vec<String> = (0..calls).map(|_| "allreduce:i64:sum:10000".to_string()).collect();
    let reports = run(&cluster, HOSTS, kernel, &cases, &[]);
    assert_kernel_folding(&reports, &cases, HOSTS);
    let per_call = contributions(&cases[..1], HOSTS);
    let in_user = total(&reports, "folded");
    assert!(in_user <= per_call, "{in_user} contributions folded in user space, more than the first call's {per_call}");
    // Results in the kernel: every rank got every result of the chunks it
    // does not own, by XDP placement or (rarely, a race) from its socket,
    // exactly once; the owners' processes sent none but those their own
    // joining contribution completed, and each rank had about one notice
    // per call.
    let chunks = 10_000usize.div_ceil(1432 / 8);
    for r in &reports {
        let rank: usize = r["rank"].parse().unwrap();
        let not_owned = (0..chunks).filter(|c| c % HOSTS != rank).count() as u64;
        let (kernel, socket) = (number(r, "results_from_kernel"), number(r, "results_received"));
        assert_eq!(kernel + socket, not_owned * calls as u64, "rank {rank}: each result taken once");
        assert!(socket * 100 <= kernel, "rank {rank}: {socket} results from the socket, {kernel} placed by XDP");
        let notices = number(r, "k_red_landed");
        assert!(notices > 0 && notices <= calls as u64 * 11 / 10, "rank {rank}: {notices} notices for {calls} calls");
    }
    assert!(total(&reports, "k_red_fanned_out") > 0, "TC ingress fanned results out");
    // Map memory is bounded: every map pinned for a host's attachment
    // (broadcast and reduction windows, key-value tables, …) within the
    // 64 MiB default the issue sets.
    for r in &reports {
        let (maps, bytes) = (number(r, "k_maps"), number(r, "k_map_bytes"));
        eprintln!("rank {}: {maps} pinned maps, {:.1} MiB", r["rank"], bytes as f64 / (1 << 20) as f64);
        assert!(maps >= 12 && bytes <= 64 << 20, "{maps} maps, {bytes} bytes");
    }
}
