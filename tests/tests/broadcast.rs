//! Broadcast across processes in an 8-host virtual cluster (MTU 1500, so
//! chunks of P = 1432 bytes): every size that matters (0, 1, P-1, P, P+1,
//! 1 MiB + 7, 64 MiB) from every root (64 MiB from two), on the user and
//! kernel datapaths and mixed; the same under injected loss and
//! duplication; a receiver killed in the middle of a 64 MiB broadcast;
//! mismatched calls; and the C example. Every receiver regenerates the
//! root's buffer from the seed and compares byte for byte.
//!
//! The tests run one at a time (they share two cores): each holds `serial()`.

use std::{
    collections::HashMap,
    path::PathBuf,
    time::{Duration, Instant},
};

use aggbox_core::{cluster::Cluster, fault::FaultSpec, wire};
use aggbox_tests::{auto, c_example, fields, kernel, mixed, number, serial, survivors_blame, user, RankProcess};

const HOSTS: usize = 8;
const MASTER_PORT: u16 = 29_500;
/// The chunk size at MTU 1500.
const P: usize = 1432;
const MIB: usize = 1 << 20;
/// The seed of every run's buffers.
const SEED: &str = "20261202";

fn rank_binary() -> PathBuf {
    env!("CARGO_BIN_EXE_aggbox-bcast-rank").into()
}

/// The `--case` arguments of the full size matrix: every small size and
/// 1 MiB + 7 from every root, 64 MiB from roots 0 and 5.
fn full_matrix() -> Vec<String> {
    let mut cases: Vec<String> = [0, 1, P - 1, P, P + 1, MIB + 7].iter().map(|s| format!("{s}:all")).collect();
    cases.push(format!("{}:0,5", 64 * MIB));
    cases
}

/// How many broadcasts `cases` makes.
fn broadcasts_in(cases: &[String]) -> usize {
    cases.iter().map(|c| c.split_once(':').unwrap().1).map(|r| if r == "all" { HOSTS } else { r.split(',').count() }).sum()
}

/// Starts one rank per host running the rank program with `args`.
fn spawn(cluster: &Cluster, datapath_of: &dyn Fn(usize) -> &'static str, args: &[String], env: &[(&str, &str)]) -> Vec<RankProcess> {
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    (0..HOSTS)
        .map(|i| RankProcess::spawn(cluster, i, 0, MASTER_PORT, i, HOSTS, datapath_of(i), &rank_binary(), &args, env))
        .collect()
}

/// The rank program's arguments for `cases`.
fn case_args(cases: &[String]) -> Vec<String> {
    let mut args = vec!["--seed".to_string(), SEED.into()];
    for case in cases {
        args.push("--case".into());
        args.push(case.clone());
    }
    args
}

/// Runs `cases` on every host with `datapath_of`; checks that every rank
/// matched every broadcast and returns each rank's report.
fn run_cases(cluster: &Cluster, datapath_of: &dyn Fn(usize) -> &'static str, cases: &[String]) -> Vec<HashMap<String, String>> {
    run_cases_env(cluster, datapath_of, cases, &|_| Vec::new())
}

/// The environment variables of one host's rank.
type EnvOf<'a> = &'a dyn Fn(usize) -> Vec<(&'static str, &'static str)>;

/// [`run_cases`] with host `i`'s rank given the variables `env_of(i)`.
fn run_cases_env(cluster: &Cluster, datapath_of: &dyn Fn(usize) -> &'static str, cases: &[String], env_of: EnvOf) -> Vec<HashMap<String, String>> {
    let start = Instant::now();
    let args = case_args(cases);
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let ranks: Vec<RankProcess> = (0..HOSTS)
        .map(|i| RankProcess::spawn(cluster, i, 0, MASTER_PORT, i, HOSTS, datapath_of(i), &rank_binary(), &args, &env_of(i)))
        .collect();
    let expected = broadcasts_in(cases);
    let reports: Vec<_> = ranks
        .into_iter()
        .enumerate()
        .map(|(i, rank)| {
            let (code, lines) = rank.finish(Duration::from_secs(150));
            assert_eq!(code, 0, "rank {i} ({}) failed: {lines:?}", datapath_of(i));
            let matched = lines.iter().filter(|l| l.starts_with("bcast ") && l.contains(" match=1 ")).count();
            assert_eq!(matched, expected, "rank {i}: {lines:?}");
            let report = fields(lines.iter().find(|l| l.starts_with("report ")).expect("report line"));
            let chosen = if runs_kernel(datapath_of(i)) { "kernel" } else { "user" };
            assert_eq!(report["datapath"], chosen, "rank {i} asked for {}: {report:?}", datapath_of(i));
            assert_eq!(number(&report, "broadcasts"), expected as u64);
            if runs_kernel(datapath_of(i)) {
                // The first program counts skbs; the socket, datagrams, of
                // which a super-packet left to user space holds several.
                let skbs = number(&report, "received") - number(&report, "gro_segments") + number(&report, "gro_receives");
                assert!(number(&report, "ingress_accepted") >= skbs, "rank {i}: every datagram passed the first program: {report:?}");
            }
            if i == 0 {
                print_timings(&lines);
            }
            report
        })
        .collect();
    eprintln!("{} broadcasts on {HOSTS} ranks in {:?}", expected, start.elapsed());
    // One chunk size for the group (the callers' counts say which).
    let chunks: Vec<u64> = reports.iter().map(|r| number(r, "chunk")).collect();
    assert!(chunks.iter().all(|&c| c == chunks[0]), "the ranks' chunk sizes differ: {chunks:?}");
    reports
}

/// Prints rank 0's time for each size (the slowest root's), for the log.
fn print_timings(lines: &[String]) {
    let mut by_size: Vec<(u64, u64)> = Vec::new();
    for line in lines.iter().filter(|l| l.starts_with("bcast ")) {
        let f = fields(line);
        let (size, us) = (number(&f, "size"), number(&f, "us"));
        match by_size.iter_mut().find(|(s, _)| *s == size) {
            Some(entry) => entry.1 = entry.1.max(us),
            None => by_size.push((size, us)),
        }
    }
    let text: Vec<String> = by_size.iter().map(|(s, us)| format!("{s}B:{us}us")).collect();
    eprintln!("rank 0, slowest root per size: {}", text.join(" "));
}

/// Whether a rank that asked for `requested` runs the kernel datapath:
/// `auto` does here (the tests run as root on hosts that attach).
fn runs_kernel(requested: &str) -> bool {
    requested != "user"
}

/// The roots of a case ("all" or a list).
fn roots_of(roots: &str) -> Vec<usize> {
    if roots == "all" { (0..HOSTS).collect() } else { roots.split(',').map(|r| r.parse().unwrap()).collect() }
}

/// First transmissions: a user root sends each chunk once to each receiver;
/// a kernel root sends it once, and TC egress makes the other copies.
fn expected_chunks(cases: &[String], datapath_of: &fn(usize) -> &'static str) -> u64 {
    expected_chunks_of(cases, datapath_of, P)
}

/// [`expected_chunks`] for a group whose chunk is `chunk` bytes.
fn expected_chunks_of(cases: &[String], datapath_of: &fn(usize) -> &'static str, chunk: usize) -> u64 {
    cases
        .iter()
        .map(|c| {
            let (size, roots) = c.split_once(':').unwrap();
            let chunks = aggbox_core::broadcast::chunk_count(size.parse().unwrap(), chunk);
            roots_of(roots)
                .into_iter()
                .map(|root| if runs_kernel(datapath_of(root)) { chunks } else { chunks * (HOSTS - 1) } as u64)
                .sum::<u64>()
        })
        .sum()
}

/// Copies the kernel's fan-out makes: size - 1 per chunk of a kernel root.
fn expected_fanout_copies(cases: &[String], datapath_of: &fn(usize) -> &'static str, chunk: usize) -> u64 {
    cases
        .iter()
        .map(|c| {
            let (size, roots) = c.split_once(':').unwrap();
            let chunks = aggbox_core::broadcast::chunk_count(size.parse().unwrap(), chunk);
            roots_of(roots).into_iter().filter(|&r| runs_kernel(datapath_of(r))).count() as u64 * (chunks * (HOSTS - 1)) as u64
        })
        .sum()
}

/// Copies delivered: every chunk to every receiver.
fn deliveries(cases: &[String], chunk: usize) -> u64 {
    cases
        .iter()
        .map(|c| {
            let (size, roots) = c.split_once(':').unwrap();
            let chunks = aggbox_core::broadcast::chunk_count(size.parse().unwrap(), chunk);
            (roots_of(roots).len() * chunks * (HOSTS - 1)) as u64
        })
        .sum()
}

/// What the kernel did, from the hosts' counters (each run's processes
/// attach anew, so the counters are this run's): the fan-out made every
/// copy of a kernel root's chunks; every delivery was acknowledged, folded
/// by a kernel root's XDP or seen by a user root; and, where receivers run
/// the kernel datapath, their programs placed chunks and answered them.
fn assert_kernel_work(reports: &[HashMap<String, String>], cases: &[String], datapath_of: &fn(usize) -> &'static str) {
    assert_kernel_work_of(reports, cases, datapath_of, P)
}

/// [`assert_kernel_work`] for a group whose chunk is `chunk` bytes.
fn assert_kernel_work_of(reports: &[HashMap<String, String>], cases: &[String], datapath_of: &fn(usize) -> &'static str, chunk: usize) {
    let deliveries = |cases: &[String]| deliveries(cases, chunk);
    // Every copy made: sent, or refused by the device under load (the root
    // then resends that chunk to that receiver).
    let (sent, refused) = (total(reports, "k_cloned"), total(reports, "k_clones_refused"));
    assert_eq!(sent + refused, expected_fanout_copies(cases, datapath_of, chunk), "fan-out copies ({refused} refused)");
    assert!(
        total(reports, "k_acks_folded") + total(reports, "acks_received") >= deliveries(cases),
        "every delivery acknowledged"
    );
    let kernel_hosts = (0..HOSTS).filter(|&h| runs_kernel(datapath_of(h))).count();
    if kernel_hosts > 0 {
        let placed = total(reports, "k_placed");
        assert!(placed > 0 && total(reports, "k_acks_sent") > 0, "receivers' XDP placed and answered chunks");
        eprintln!(
            "kernel work: {placed} chunks placed by the kernel, {} ACKs sent from it, {} ACKs folded, {} group-ACKs, {} left to user space",
            total(reports, "k_acks_sent"),
            total(reports, "k_acks_folded"),
            total(reports, "k_group_acks"),
            total(reports, "k_to_user"),
        );
        let from_socket = total(reports, "placed_from_socket");
        eprintln!(
            "receivers placed {from_socket} chunks from their sockets ({:.3}% of all deliveries); {} reached the sockets in all",
            100.0 * from_socket as f64 / deliveries(cases) as f64,
            total(reports, "chunks_received")
        );
        if kernel_hosts == HOSTS {
            // Every delivery placed: by XDP into the window, or by the
            // process when XDP left it to user space. Both only when a
            // retransmitted copy reached XDP after the process had taken
            // the chunk from its socket (XDP places it; the process ignores
            // it).
            let both = (placed + from_socket).checked_sub(deliveries(cases)).expect("a delivery was never placed");
            assert!(both <= total(reports, "retransmits"), "{both} chunks placed twice, more than were sent again");
            // XDP leaves a chunk to user space only when the process lags
            // (docs/BROADCAST.md); that is the exception.
            assert!(from_socket * 20 < deliveries(cases), "most chunks were placed by XDP, not from sockets");
        }
    }
}

fn total(reports: &[HashMap<String, String>], key: &str) -> u64 {
    reports.iter().map(|r| number(r, key)).sum()
}

#[test]
fn every_size_from_every_root_on_each_datapath() {
    let _serial = serial();
    assert_eq!(wire::chunk_size(1500), P);
    let cluster = Cluster::temporary(HOSTS).unwrap();
    let cases = full_matrix();
    for datapath_of in [user as fn(usize) -> &'static str, kernel, mixed] {
        let reports = run_cases(&cluster, &datapath_of, &cases);
        assert_eq!(total(&reports, "chunks_sent"), expected_chunks(&cases, &datapath_of));
        assert_kernel_work(&reports, &cases, &datapath_of);
    }
}

/// The same on a plain bridge, the network users have: the hosts are on
/// the TC hooks, the roots send super-chunks, and the receivers' TC ingress
/// places them whole.
#[test]
fn every_size_from_every_root_on_a_plain_bridge() {
    let _serial = serial();
    let cluster = Cluster::temporary_plain(HOSTS, 1500).unwrap();
    let cases = full_matrix();
    for datapath_of in [kernel as fn(usize) -> &'static str, auto, mixed] {
        let reports = run_cases(&cluster, &datapath_of, &cases);
        assert_eq!(total(&reports, "chunks_sent"), expected_chunks(&cases, &datapath_of));
        assert_kernel_work(&reports, &cases, &datapath_of);
        for (i, r) in reports.iter().enumerate() {
            if runs_kernel(datapath_of(i)) {
                assert_eq!(r["hooks"], "tc", "rank {i}: a veth on a plain bridge");
            }
        }
        assert!(total(&reports, "gso_sends") > 0, "roots sent super-chunks");
        assert!(total(&reports, "k_superchunks") > 0, "super-chunks reached TC ingress whole");
        eprintln!(
            "plain bridge: {} super-packets of {} datagrams sent; {} super-chunks placed whole",
            total(&reports, "gso_sends"),
            total(&reports, "gso_segments"),
            total(&reports, "k_superchunks")
        );
    }
}

/// With a barrier before each broadcast, every receiver has armed its
/// window for it (ahead: when the broadcast before it started, or when the
/// communicator started), whether or not it has made the call yet when the
/// root starts; and a broadcast of at most one window never outruns the
/// credit. So the kernel places every chunk and the root's kernel folds
/// every ACK: no data packet reaches any receiver's socket, the first
/// broadcast's included (on a plain bridge: TC hooks, super-chunks).
/// Besides the sizes, many one-chunk broadcasts in a row: each starts with
/// the receivers leaving the barrier and making their calls while the
/// root's chunks arrive: the moment when a receiving process
/// that took the window's claim for its call sent the chunks that came
/// meanwhile to its socket (a few times in 320 broadcasts under CPU load,
/// 28 chunks once in CI; the process now only reads the claim,
/// docs/BROADCAST.md).
#[test]
fn no_data_packet_reaches_a_kernel_receivers_socket() {
    let _serial = serial();
    let cluster = Cluster::temporary_plain(HOSTS, 1500).unwrap();
    let window = aggbox_core::maps::RX_WINDOW as usize;
    let mut cases: Vec<String> = [0, 1, P - 1, P, P + 1, 64 << 10, window * P].iter().map(|s| format!("{s}:all")).collect();
    cases.extend(std::iter::repeat_n("1:all".to_string(), 8));
    let mut args = case_args(&cases);
    args.push("--barrier".into());
    let ranks = spawn(&cluster, &kernel, &args, &[]);
    let reports: Vec<_> = ranks
        .into_iter()
        .enumerate()
        .map(|(i, rank)| {
            let (code, lines) = rank.finish(Duration::from_secs(120));
            assert_eq!(code, 0, "rank {i}: {lines:?}");
            assert_eq!(lines.iter().filter(|l| l.contains(" match=1 ")).count(), broadcasts_in(&cases), "rank {i}");
            fields(lines.iter().find(|l| l.starts_with("report ")).expect("report line"))
        })
        .collect();
    for (i, report) in reports.iter().enumerate() {
        assert_eq!(number(report, "chunks_received"), 0, "rank {i}: data packets on its socket: {report:?}");
        assert_eq!(number(report, "placed_from_socket"), 0, "rank {i}: {report:?}");
    }
    // Every delivery placed by the kernel, each exactly once (a
    // retransmitted copy of a chunk it holds is answered, not placed again).
    let deliveries = deliveries(&cases, P);
    assert_eq!(total(&reports, "k_placed"), deliveries, "the kernel placed every delivery once");
    let kernel = kernel as fn(usize) -> &'static str;
    assert_eq!(total(&reports, "chunks_sent"), expected_chunks(&cases, &kernel), "each root sent each chunk once");
    let (sent, refused) = (total(&reports, "k_cloned"), total(&reports, "k_clones_refused"));
    assert_eq!(sent + refused, expected_fanout_copies(&cases, &kernel, P), "fan-out copies ({refused} refused)");
    assert!(total(&reports, "k_acks_folded") >= deliveries, "every delivery's ACK folded by a root's kernel");
    assert!(total(&reports, "k_superchunks") > 0, "super-chunks placed whole");
    eprintln!(
        "the kernel placed all {deliveries} deliveries of {} broadcasts; none reached a socket ({} retransmissions)",
        broadcasts_in(&cases),
        total(&reports, "retransmits")
    );
}

/// The largest size: 256 MiB, from a root in the middle, on the
/// kernel datapath and in a mixed group.
#[test]
fn a_256_mib_broadcast_on_the_kernel_and_mixed_datapaths() {
    let _serial = serial();
    let cluster = Cluster::temporary_plain(HOSTS, 1500).unwrap();
    let cases = vec![format!("{}:3", 256 * MIB)];
    for datapath_of in [kernel as fn(usize) -> &'static str, mixed] {
        let reports = run_cases(&cluster, &datapath_of, &cases);
        assert_eq!(total(&reports, "chunks_sent"), expected_chunks(&cases, &datapath_of));
        assert_kernel_work(&reports, &cases, &datapath_of);
    }
}

/// A group on a plain bridge where every other host sends without GSO
/// (`AGGBOX_GSO=0`: one datagram per chunk, as from a kernel or route that
/// refuses it): their chunks reach TC ingress one by one, the others' as
/// super-chunks, and every receiver gets every byte of both.
#[test]
fn a_group_where_some_hosts_send_without_gso() {
    let _serial = serial();
    let cluster = Cluster::temporary_plain(HOSTS, 1500).unwrap();
    let cases: Vec<String> =
        [format!("{}:all", P + 1), format!("{}:all", MIB + 7), format!("{}:0,3", 16 * MIB)].into_iter().collect();
    let gso_off = |i: usize| i % 2 == 1;
    let env_of = move |i: usize| if gso_off(i) { vec![("AGGBOX_GSO", "0")] } else { Vec::new() };
    for datapath_of in [kernel as fn(usize) -> &'static str, mixed] {
        let reports = run_cases_env(&cluster, &datapath_of, &cases, &env_of);
        assert_eq!(total(&reports, "chunks_sent"), expected_chunks(&cases, &datapath_of));
        assert_kernel_work(&reports, &cases, &datapath_of);
        for (i, r) in reports.iter().enumerate() {
            if gso_off(i) {
                assert_eq!(number(r, "gso_sends"), 0, "rank {i} has GSO off: {r:?}");
            } else {
                assert!(number(r, "gso_sends") > 0, "rank {i} sent super-chunks as a root: {r:?}");
            }
        }
        assert!(total(&reports, "k_superchunks") > 0, "the GSO roots' super-chunks were placed whole");
    }
}

/// A group on a plain bridge where every other host's eth0 has a smaller
/// MTU: the ranks agree at rendezvous on the chunk of the smallest, so the
/// super-chunks of every root have segments that fit every member, and
/// every receiver gets every byte.
#[test]
fn a_group_of_mixed_mtus_uses_the_smallest_chunk() {
    const SMALL_MTU: u32 = 1280;
    let _serial = serial();
    let cluster = Cluster::temporary_plain(HOSTS, 1500).unwrap();
    let small = |i: usize| i % 2 == 1;
    for i in (0..HOSTS).filter(|&i| small(i)) {
        let mut ip = cluster.command(i, "ip");
        ip.args(["link", "set", "dev", "eth0", "mtu", &SMALL_MTU.to_string()]);
        assert!(ip.status().unwrap().success(), "setting host {i}'s MTU");
    }
    let chunk = wire::chunk_size(SMALL_MTU);
    assert!(chunk < P);
    let cases: Vec<String> = vec![format!("{}:all", chunk + 1), format!("{}:all", MIB + 7), format!("{}:0,3", 16 * MIB)];
    for datapath_of in [kernel as fn(usize) -> &'static str, mixed] {
        let reports = run_cases(&cluster, &datapath_of, &cases);
        for (i, r) in reports.iter().enumerate() {
            assert_eq!(number(r, "chunk"), chunk as u64, "rank {i}: {r:?}");
        }
        assert_eq!(total(&reports, "chunks_sent"), expected_chunks_of(&cases, &datapath_of, chunk));
        assert_kernel_work_of(&reports, &cases, &datapath_of, chunk);
        assert!(total(&reports, "gso_sends") > 0, "the roots sent super-chunks");
        assert!(total(&reports, "k_superchunks") > 0, "super-chunks were placed whole");
    }
}

#[test]
fn loss_duplication_and_reordering_are_repaired() {
    let _serial = serial();
    repair_on(Cluster::temporary(HOSTS).unwrap(), &|_| Vec::new());
}

/// On a plain bridge a fault drops, repeats or delays a whole super-chunk.
#[test]
fn loss_of_whole_super_chunks_is_repaired_on_a_plain_bridge() {
    let _serial = serial();
    repair_on(Cluster::temporary_plain(HOSTS, 1500).unwrap(), &|_| Vec::new());
}

/// Where a hop segments (here: XDP on every bridge port turns GSO off on
/// the hosts' eth0, so each super-chunk leaves the sender as single
/// datagrams) the hosts still on the TC hooks get single segments, and a
/// fault drops, repeats or delays one segment of a super-chunk, not all.
#[test]
fn loss_of_single_segments_is_repaired_where_a_hop_segments() {
    let _serial = serial();
    let reports = repair_on(Cluster::temporary(HOSTS).unwrap(), &|_| vec![("AGGBOX_HOOKS", "tc")]);
    for (i, r) in reports.iter().enumerate() {
        assert_eq!(r["hooks"], "tc", "rank {i}: {r:?}");
    }
    assert!(total(&reports, "gso_sends") > 0, "the roots sent super-chunks");
    assert_eq!(total(&reports, "k_superchunks"), 0, "none reached a receiver whole: the sender's eth0 segmented them");
}

/// Runs the loss matrix under 10% loss, 2% duplication and 5% reordering on
/// `cluster`'s ports; returns the kernel datapath's reports.
fn repair_on(mut cluster: Cluster, env_of: EnvOf) -> Vec<HashMap<String, String>> {
    cluster.inject_faults(FaultSpec::percent(10.0, 2.0).reorder(5.0)).unwrap();
    let mut cases: Vec<String> = [0, 1, P - 1, P, P + 1, MIB + 7].iter().map(|s| format!("{s}:all")).collect();
    cases.push(format!("{}:5", 64 * MIB));
    let mut kernel_reports = Vec::new();
    for (k, datapath_of) in [user as fn(usize) -> &'static str, kernel, mixed].into_iter().enumerate() {
        let before = cluster.fault_stats().unwrap();
        let reports = run_cases_env(&cluster, &datapath_of, &cases, env_of);
        let after = cluster.fault_stats().unwrap();
        let dropped: u64 = after.iter().zip(&before).map(|(a, b)| a.dropped - b.dropped).sum();
        let duplicated: u64 = after.iter().zip(&before).map(|(a, b)| a.duplicated - b.duplicated).sum();
        let delayed: u64 = after.iter().zip(&before).map(|(a, b)| a.delayed - b.delayed).sum();
        assert!(
            dropped > 0 && duplicated > 0 && delayed > 0,
            "the fault program dropped {dropped}, duplicated {duplicated} and delayed (reordered) {delayed}"
        );
        assert!(total(&reports, "retransmits") > 0, "the loss was repaired by retransmissions: {reports:?}");
        assert!(total(&reports, "duplicates") > 0, "duplicates were seen and not placed twice");
        assert_eq!(total(&reports, "chunks_sent"), expected_chunks(&cases, &datapath_of), "first transmissions");
        assert_kernel_work(&reports, &cases, &datapath_of);
        if k == 1 {
            kernel_reports = reports; // the kernel datapath's
        }
    }
    kernel_reports
}

#[test]
fn a_receiver_killed_mid_broadcast_fails_every_survivor() {
    let _serial = serial();
    let cluster = Cluster::temporary_plain(HOSTS, 1500).unwrap();
    let timeout = Duration::from_millis(5000);
    let mut args = case_args(&[format!("{}:0", 64 * MIB)]);
    args.push("--forever".into());
    let mut ranks = spawn(&cluster, &mixed, &args, &[("AGGBOX_TIMEOUT_MS", "5000")]);
    let victim = 3;
    // After the first broadcast, kill it while the next is under way.
    ranks[victim].wait_for("bcast ");
    std::thread::sleep(Duration::from_millis(100));
    ranks[victim].child.kill().unwrap();
    let killed = Instant::now();
    // The timeout, and what a survivor took to tell the others and close.
    for (i, error) in survivors_blame(ranks, victim, killed, timeout * 3, timeout + Duration::from_secs(3)) {
        eprintln!("rank {i}: {}", error.split_once("message=").map_or("", |(_, m)| m));
    }
}

#[test]
fn mismatched_counts_and_roots_fail_every_rank() {
    let _serial = serial();
    let cluster = Cluster::temporary_plain(HOSTS, 1500).unwrap();
    for mismatch in ["count", "root"] {
        let mut args = case_args(&[format!("{}:0", MIB + 7)]);
        args.extend(["--mismatch".into(), mismatch.into(), "--at".into(), "5".into()]);
        let start = Instant::now();
        let ranks = spawn(&cluster, &mixed, &args, &[]);
        for (i, rank) in ranks.into_iter().enumerate() {
            let (code, lines) = rank.finish(Duration::from_secs(60));
            assert_eq!(code, 1, "{mismatch}: rank {i}: {lines:?}");
            let error = fields(lines.iter().find(|l| l.starts_with("error ")).expect("an error line"));
            assert_eq!(error["status"], "InvalidArgument", "{mismatch}: rank {i}: {lines:?}");
            assert!(lines.iter().any(|l| l.contains("mismatched collective calls")), "{mismatch}: rank {i}: {lines:?}");
        }
        assert!(start.elapsed() < Duration::from_secs(10), "{mismatch}: every rank failed at once, not by timeout");
    }
}

#[test]
fn the_c_example_broadcasts_and_times() {
    let _serial = serial();
    let cluster = Cluster::temporary_plain(HOSTS, 1500).unwrap();
    let program = c_example("broadcast");
    for (k, datapath_of) in [user as fn(usize) -> &'static str, mixed].into_iter().enumerate() {
        let ranks: Vec<RankProcess> = (0..HOSTS)
            .map(|i| {
                RankProcess::spawn(&cluster, i, 0, MASTER_PORT + k as u16, i, HOSTS, datapath_of(i), &program, &["1024", "1048576"], &[])
            })
            .collect();
        for (i, rank) in ranks.into_iter().enumerate() {
            let (code, lines) = rank.finish(Duration::from_secs(60));
            assert_eq!(code, 0, "rank {i}: {lines:?}");
            let results: Vec<_> = lines.iter().filter(|l| l.starts_with("rank=")).map(|l| fields(l)).collect();
            assert_eq!(results.len(), 2, "one line per size: {lines:?}");
            for (r, bytes) in results.iter().zip([1024, 1_048_576]) {
                assert_eq!(number(r, "rank"), i as u64);
                assert_eq!(number(r, "size"), HOSTS as u64);
                assert_eq!(r["datapath"], datapath_of(i));
                assert_eq!(number(r, "bytes"), bytes);
                assert_eq!(number(r, "errors"), 0, "{lines:?}");
                assert!(number(r, "iterations") > 0);
            }
        }
    }
}
