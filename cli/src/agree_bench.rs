//! `aggbox bench agree`: approximate agreement on N hosts, from inputs
//! spread over [0, 1e6] to ε = 1e-6 (41 phases), kernel vs user datapath,
//! without and with 10% of the frames dropped: the slowest rank's time per
//! agreement, and each rank's wake-ups per phase. Every agreement's values
//! are checked against the inputs (validity) and against each other (ε).
//! The hosts are on a plain bridge: the kernel datapath on the TC hooks.

use crate::bench::{median, splitmix};
use aggbox_core::{
    agree::{phases, AgreeConfig},
    cluster::{self, Cluster},
    fault::FaultSpec,
    Comm,
};

/// The inputs' bounds and ε the benchmark agrees with.
const LO: f64 = 0.0;
const HI: f64 = 1e6;
const EPSILON: f64 = 1e-6;

/// Rank `rank`'s input of round `round` of `n` ranks: rank 0 has LO and the
/// last rank HI (the whole spread), the others a seeded draw between.
fn input(round: usize, rank: usize, n: usize) -> f64 {
    if rank == 0 {
        LO
    } else if rank + 1 == n {
        HI
    } else {
        let bits = splitmix((round * 1000 + rank) as u64) >> 11;
        LO + (bits as f64 / (1u64 << 53) as f64) * (HI - LO)
    }
}

/// One rank of `bench agree` (the hidden `rank-agree` command): a barrier,
/// then `rounds + 1` agreements (the first untimed), one line each.
pub fn rank_agree(rounds: usize) -> Result<(), String> {
    let err = |e: aggbox_core::Error| e.to_string();
    let mut comm = Comm::from_env().map_err(err)?;
    let (me, n) = (comm.rank(), comm.size());
    let dir = std::env::temp_dir().join(format!("aggbox-bench-agree-{}", std::process::id()));
    std::fs::create_dir_all(&dir).map_err(|e| e.to_string())?;
    let f = (n - 1) / 2;
    for round in 0..=rounds {
        let config = AgreeConfig { epsilon: EPSILON, f, lo: LO, hi: HI, store: dir.join(format!("round{round}")), ..AgreeConfig::default() };
        comm.barrier().map_err(err)?;
        let before = comm.stats().map_err(err)?.user;
        let woken = crate::bench::wakeups();
        let start = std::time::Instant::now();
        let value = comm.agree(&config, input(round, me, n)).map_err(err)?;
        let us = start.elapsed().as_secs_f64() * 1e6;
        let woken = crate::bench::wakeups() - woken;
        let after = comm.stats().map_err(err)?.user;
        println!(
            "agree round={round} us={us:.0} value={value:.17e} wakeups={woken} waits={} phases={} jumps={} from_kernel={} on_socket={} retransmits={}",
            after.socket_waits - before.socket_waits,
            after.agree_phases - before.agree_phases,
            after.agree_jumps - before.agree_jumps,
            after.agree_quorums_from_kernel - before.agree_quorums_from_kernel,
            after.agree_values_received - before.agree_values_received,
            after.retransmits - before.retransmits,
        );
    }
    let _ = std::fs::remove_dir_all(&dir);
    Ok(())
}

fn field(line: &str, key: &str) -> Result<f64, String> {
    line.split_whitespace()
        .find_map(|w| w.strip_prefix(key)?.strip_prefix('='))
        .and_then(|v| v.parse().ok())
        .ok_or_else(|| format!("no {key} in {line:?}"))
}

/// What one datapath measured.
struct AgreeRun {
    /// The slowest rank's time per timed agreement, µs.
    slowest: Vec<f64>,
    /// Voluntary context switches per phase (the socket's wake-ups and the
    /// store's fsyncs), averaged over ranks and agreements.
    wakeups_per_phase: f64,
    /// Sleeps on the socket per phase: the wake-ups by datagrams and timers.
    waits_per_phase: f64,
    /// Quorums announced by the kernel (TC ingress) per phase, averaged likewise.
    from_kernel_per_phase: f64,
    /// Values of the running phase that reached sockets, per phase and rank.
    on_socket_per_phase: f64,
}

fn agree_run(cluster: &Cluster, datapath: &str, rounds: usize, port: u16) -> Result<AgreeRun, String> {
    let n = cluster.hosts().len();
    let children = crate::bench::spawn_ranks(cluster, datapath, "rank-agree", rounds, &[], port)?;
    let outputs = crate::bench::rank_outputs(children, &format!("the {datapath} datapath"))?;
    let lines: Vec<Vec<&str>> = outputs.iter().map(|o| o.lines().filter(|l| l.starts_with("agree ")).collect()).collect();
    if lines.iter().any(|l| l.len() != rounds + 1) {
        return Err(format!("{datapath}: a rank did not report every agreement"));
    }
    let last = f64::from(phases(LO, HI, EPSILON));
    let mut run = AgreeRun { slowest: Vec::new(), wakeups_per_phase: 0.0, waits_per_phase: 0.0, from_kernel_per_phase: 0.0, on_socket_per_phase: 0.0 };
    for round in 0..=rounds {
        let values: Vec<f64> = lines.iter().map(|l| field(l[round], "value")).collect::<Result<_, _>>()?;
        let inputs: Vec<f64> = (0..n).map(|r| input(round, r, n)).collect();
        let (lo, hi) = inputs.iter().fold((f64::INFINITY, f64::NEG_INFINITY), |(a, b), &x| (a.min(x), b.max(x)));
        let (vlo, vhi) = values.iter().fold((f64::INFINITY, f64::NEG_INFINITY), |(a, b), &x| (a.min(x), b.max(x)));
        if vlo < lo || vhi > hi || vhi - vlo > EPSILON {
            return Err(format!("{datapath}: agreement {round} returned {values:?} for inputs {inputs:?}"));
        }
        if round == 0 {
            continue;
        }
        let mut slowest = 0.0f64;
        for l in &lines {
            slowest = slowest.max(field(l[round], "us")?);
            run.wakeups_per_phase += field(l[round], "wakeups")? / last;
            run.waits_per_phase += field(l[round], "waits")? / last;
            run.from_kernel_per_phase += field(l[round], "from_kernel")? / last;
            run.on_socket_per_phase += field(l[round], "on_socket")? / last;
        }
        run.slowest.push(slowest);
    }
    let samples = (rounds * n) as f64;
    run.wakeups_per_phase /= samples;
    run.waits_per_phase /= samples;
    run.from_kernel_per_phase /= samples;
    run.on_socket_per_phase /= samples;
    Ok(run)
}

/// `aggbox bench agree`.
pub fn agree(hosts: usize, rounds: usize) -> Result<(), String> {
    if hosts < 3 || rounds == 0 {
        return Err("bench agree needs at least 3 hosts and 1 round".into());
    }
    // A plain bridge, the network users have: the kernel datapath on the TC hooks.
    let mut cluster = Cluster::temporary_plain(hosts, cluster::DEFAULT_MTU).map_err(|e| e.to_string())?;
    println!(
        "approximate agreement on {hosts} hosts (f = {}), inputs spread over [{LO}, {HI}] to epsilon {EPSILON} ({} phases), MTU 1500; \
         the slowest rank's time per agreement, median of {rounds}; every agreement's values checked",
        (hosts - 1) / 2,
        phases(LO, HI, EPSILON)
    );
    let mut medians = Vec::new();
    for (k, (loss, datapath)) in [(0.0, "user"), (0.0, "kernel"), (10.0, "user"), (10.0, "kernel")].into_iter().enumerate() {
        if loss > 0.0 {
            cluster.inject_faults(FaultSpec::percent(loss, 0.0)).map_err(|e| e.to_string())?;
        }
        let run = agree_run(&cluster, datapath, rounds, 29_560 + k as u16)?;
        let t = median(&mut run.slowest.clone());
        medians.push(t);
        println!(
            "{datapath:<6} loss {loss:>2}%  {:>9.0} µs  per phase and rank: {:.2} wake-ups by the socket, {:.2} voluntary context switches (with the store's fsyncs), {:.2} quorum notices from the kernel, {:.2} values on the socket",
            t, run.waits_per_phase, run.wakeups_per_phase, run.from_kernel_per_phase, run.on_socket_per_phase
        );
    }
    println!(
        "kernel / user time: {:.2} without loss, {:.2} with 10% loss",
        medians[1] / medians[0],
        medians[3] / medians[2]
    );
    Ok(())
}
