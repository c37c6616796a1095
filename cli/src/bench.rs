//! `aggbox bench`: measurements that print ratios taken in one run.

use std::{
    process::Stdio,
    thread,
    time::Duration,
};

use aggbox_core::{
    cluster::Cluster,
    fault::FaultSpec,
    loader::Attachment,
    netif,
    rendezvous::{GroupInfo, PeerInfo},
    Datapath,
};
use clap::Subcommand;

/// What to measure.
#[derive(Subcommand)]
pub enum Bench {
    /// TCP throughput between two hosts with and without the AggBox programs
    /// attached (iperf3), alternating runs.
    Tcp {
        /// Seconds per iperf3 run.
        #[arg(long, default_value_t = 3)]
        seconds: u32,
        /// Runs of each kind.
        #[arg(long, default_value_t = 3)]
        rounds: u32,
    },
    /// Broadcast latency, throughput and wake-ups on N hosts: kernel vs user
    /// datapath vs Open MPI (when installed), plus the UDP floor.
    Broadcast {
        /// Number of hosts (one rank each).
        #[arg(long, default_value_t = 8)]
        hosts: usize,
        /// MTU of the cluster's links (3500 is about the most native XDP
        /// takes on veth).
        #[arg(long, default_value_t = 1500)]
        mtu: u32,
        /// Rounds per small size.
        #[arg(long, default_value_t = 200)]
        rounds: usize,
        /// Skip Open MPI.
        #[arg(long)]
        no_mpi: bool,
    },
    /// Barrier latency on N hosts, kernel vs user datapath.
    Barrier {
        /// Number of hosts (one rank each).
        #[arg(long, default_value_t = 8)]
        hosts: usize,
        /// Barriers per run.
        #[arg(long, default_value_t = 1000)]
        barriers: usize,
        /// Faults on every host's link: "DROP%,DUP%" or "DROP%,DUP%,REORDER%".
        #[arg(long)]
        faults: Option<String>,
    },
}

pub fn run(bench: Bench) -> Result<(), String> {
    match bench {
        Bench::Tcp { seconds, rounds } => tcp(seconds, rounds),
        Bench::Broadcast { hosts, mtu, rounds, no_mpi } => broadcast(hosts, mtu, rounds, !no_mpi),
        Bench::Barrier { hosts, barriers, faults } => {
            let faults = faults.map(|f| crate::parse_faults(&f)).transpose()?;
            barrier(hosts, barriers, faults)
        }
    }
}

fn median(values: &mut [f64]) -> f64 {
    values.sort_by(|a, b| a.total_cmp(b));
    values[values.len() / 2]
}

/// One iperf3 run from host 0 to host 1: received bits per second.
fn iperf(cluster: &Cluster, seconds: u32) -> Result<f64, String> {
    let mut server = cluster
        .command(1, "iperf3")
        .args(["-s", "-1", "-B", &cluster.host(1).ipv4.to_string()])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .map_err(|e| format!("starting iperf3 (apt-get install iperf3): {e}"))?;
    let server_addr = cluster.host(1).ipv4.to_string();
    let mut output = None;
    for _ in 0..50 {
        let out = cluster
            .command(0, "iperf3")
            .args(["-c", &server_addr, "-t", &seconds.to_string(), "-J"])
            .output()
            .map_err(|e| format!("running iperf3: {e}"))?;
        // Until the server listens, the client fails (sometimes with exit
        // status 0 and an "error" in its JSON).
        if out.status.success() && String::from_utf8_lossy(&out.stdout).contains("\"sum_received\"") {
            output = Some(out);
            break;
        }
        thread::sleep(Duration::from_millis(100)); // the server is not listening yet
    }
    let _ = server.kill();
    let _ = server.wait();
    let out = output.ok_or("iperf3 client never connected")?;
    let json = String::from_utf8_lossy(&out.stdout);
    // "sum_received": { ... "bits_per_second": N ... }
    let tail = json.split("\"sum_received\"").nth(1).ok_or_else(|| format!("no sum_received in iperf3 output: {json}"))?;
    let value = tail.split("\"bits_per_second\":").nth(1).ok_or("no bits_per_second")?;
    let number: String = value.trim_start().chars().take_while(|c| c.is_ascii_digit() || *c == '.' || *c == 'e' || *c == '+').collect();
    number.parse().map_err(|_| format!("bad bits_per_second {number:?}"))
}

/// Attaches the AggBox programs to eth0 of hosts 0 and 1, for a group of
/// those two hosts (so the programs run their full checks).
fn attach_both(cluster: &Cluster) -> Result<Vec<Attachment>, String> {
    let peers: Vec<PeerInfo> = (0..2)
        .map(|i| PeerInfo {
            rank: i,
            ipv4: cluster.host(i).ipv4,
            mac: cluster.host(i).mac,
            port: aggbox_core::config::DEFAULT_PORT_BASE,
            datapath: Datapath::Kernel,
            mtu: cluster.mtu(),
        })
        .collect();
    let group = GroupInfo { group: 0xbe4c, token: 0x5eed, peers };
    (0..2)
        .map(|i| {
            let group = group.clone();
            cluster
                .run_in(i, move || -> Result<Attachment, String> {
                    let iface = netif::choose(Some("eth0"), std::net::Ipv4Addr::UNSPECIFIED).map_err(|e| e.to_string())?;
                    let mut attachment = Attachment::acquire(&iface, group.peers[i].port).map_err(|e| e.to_string())?;
                    attachment.register_group(&group).map_err(|e| e.to_string())?;
                    Ok(attachment)
                })
                .map_err(|e| e.to_string())?
        })
        .collect()
}

fn tcp(seconds: u32, rounds: u32) -> Result<(), String> {
    let cluster = Cluster::temporary(2).map_err(|e| e.to_string())?;
    let mut without = Vec::new();
    let mut with = Vec::new();
    for round in 0..rounds {
        let bare = iperf(&cluster, seconds)?;
        let attachments = attach_both(&cluster)?;
        let mode = attachments[0].xdp_mode().name();
        let attached = iperf(&cluster, seconds)?;
        drop(attachments);
        println!(
            "round {round}: without programs {:.2} Gbit/s, with programs (xdp {mode}, tc ingress+egress) {:.2} Gbit/s",
            bare / 1e9,
            attached / 1e9
        );
        without.push(bare);
        with.push(attached);
    }
    let (a, b) = (median(&mut without), median(&mut with));
    println!("tcp throughput (iperf3, {rounds}x{seconds}s each, median): without {:.2} Gbit/s, with {:.2} Gbit/s, ratio with/without = {:.3}", a / 1e9, b / 1e9, b / a);
    Ok(())
}

/// Runs `barriers` barriers on every host of `cluster` with `datapath`;
/// returns each rank's report line.
fn barrier_run(cluster: &Cluster, datapath: &str, barriers: usize, master_port: u16) -> Result<Vec<String>, String> {
    let exe = std::env::current_exe().map_err(|e| e.to_string())?;
    let n = cluster.hosts().len();
    let children: Vec<_> = (0..n)
        .map(|i| {
            cluster
                .command(i, &exe)
                .args(["rank", &barriers.to_string()])
                .env("RANK", i.to_string())
                .env("WORLD_SIZE", n.to_string())
                .env("MASTER_ADDR", cluster.host(0).ipv4.to_string())
                .env("MASTER_PORT", master_port.to_string())
                .env("AGGBOX_DATAPATH", datapath)
                .stdout(Stdio::piped())
                .spawn()
                .map_err(|e| e.to_string())
        })
        .collect::<Result<_, _>>()?;
    let mut lines = Vec::new();
    for child in children {
        let out = child.wait_with_output().map_err(|e| e.to_string())?;
        if !out.status.success() {
            return Err(format!("a rank failed ({datapath} datapath)"));
        }
        lines.push(String::from_utf8_lossy(&out.stdout).trim().to_string());
    }
    Ok(lines)
}

fn field(line: &str, key: &str) -> f64 {
    line.split_whitespace()
        .find_map(|kv| kv.strip_prefix(key).and_then(|v| v.strip_prefix('=')))
        .and_then(|v| v.parse().ok())
        .unwrap_or(f64::NAN)
}

fn barrier(hosts: usize, barriers: usize, faults: Option<FaultSpec>) -> Result<(), String> {
    let mut cluster = Cluster::temporary(hosts).map_err(|e| e.to_string())?;
    if let Some(faults) = faults {
        cluster.inject_faults(faults).map_err(|e| e.to_string())?;
    }
    let mut per_barrier = Vec::new();
    for (k, datapath) in ["kernel", "user"].into_iter().enumerate() {
        let lines = barrier_run(&cluster, datapath, barriers, 29_500 + k as u16)?;
        // The slowest rank's time is the barrier's time.
        let total_us = lines.iter().map(|l| field(l, "total_us")).fold(0.0, f64::max);
        let p50 = lines.iter().map(|l| field(l, "p50_us")).fold(0.0, f64::max);
        let retransmits: f64 = lines.iter().map(|l| field(l, "retransmits")).sum();
        println!(
            "{datapath:>6}: {hosts} ranks, {barriers} barriers in {:.1} ms: {:.1} us per barrier, slowest rank's p50 {p50:.1} us, {retransmits} retransmits",
            total_us / 1000.0,
            total_us / barriers as f64
        );
        per_barrier.push(total_us / barriers as f64);
    }
    if let Some(stats) = faults.and(cluster.fault_stats().ok()) {
        let dropped: u64 = stats.iter().map(|s| s.dropped).sum();
        let duplicated: u64 = stats.iter().map(|s| s.duplicated).sum();
        println!("faults: {dropped} frames dropped, {duplicated} duplicated");
    }
    println!(
        "barrier: kernel/user time per barrier = {:.3} (the kernel datapath does not fold barriers yet: both run the same user-space protocol; the kernel one also passes every datagram through the XDP/TC checks)",
        per_barrier[0] / per_barrier[1]
    );
    Ok(())
}

// ---- broadcast ------------------------------------------------------------

/// Rounds for a broadcast of `size` bytes: fewer as it grows.
fn rounds_for(size: usize, rounds: usize) -> usize {
    match size {
        0..=65_536 => rounds,
        65_537..=1_048_576 => (rounds / 10).max(5),
        _ => 3,
    }
}

/// The root's data of a broadcast of `len` bytes, round `round`.
fn pattern(len: usize, round: usize) -> impl Iterator<Item = u8> {
    (0..len).map(move |i| (i.wrapping_mul(131) ^ round.wrapping_mul(7)) as u8)
}

/// This process's voluntary context switches so far: how often it slept
/// and was woken.
fn wakeups() -> u64 {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| s.lines().find_map(|l| l.strip_prefix("voluntary_ctxt_switches:").map(|v| v.trim().parse().ok())))
        .flatten()
        .unwrap_or(0)
}

/// CLOCK_MONOTONIC in ns: one clock for every namespace of a virtual
/// cluster, so a root's start and the receivers' ends can be compared.
fn monotonic_ns() -> u64 {
    let mut ts = libc::timespec { tv_sec: 0, tv_nsec: 0 };
    // SAFETY: clock_gettime writes one timespec we own.
    unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut ts) };
    ts.tv_sec as u64 * 1_000_000_000 + ts.tv_nsec as u64
}

fn join<T: std::fmt::Display>(values: &[T]) -> String {
    values.iter().map(|v| v.to_string()).collect::<Vec<_>>().join(",")
}

/// One rank of `bench broadcast` (the hidden `rank-bcast` command). Per
/// size it prints each round's own elapsed time (µs) and the CLOCK_MONOTONIC
/// instants (ns) at which its call started and returned.
pub fn rank_bcast(rounds: usize, sizes: &[usize]) -> Result<(), String> {
    use aggbox_core::{dtype::Dtype, Comm};
    let mut comm = Comm::from_env().map_err(|e| e.to_string())?;
    let root = 0;
    for &size in sizes {
        let mut buf = vec![0u8; size];
        let (mut elapsed, mut starts, mut ends) = (Vec::new(), Vec::new(), Vec::new());
        for round in 0..rounds_for(size, rounds) {
            if comm.rank() == root {
                buf.iter_mut().zip(pattern(size, round)).for_each(|(b, v)| *b = v);
            }
            comm.barrier().map_err(|e| e.to_string())?;
            let start = monotonic_ns();
            comm.broadcast(&mut buf, Dtype::U8, root).map_err(|e| e.to_string())?;
            let end = monotonic_ns();
            elapsed.push(format!("{:.1}", (end - start) as f64 / 1e3));
            starts.push(start);
            ends.push(end);
            if comm.rank() != root && !buf.iter().copied().eq(pattern(size, round)) {
                return Err(format!("rank {}: broadcast of {size} bytes, round {round}: wrong data", comm.rank()));
            }
        }
        println!(
            "bcast rank={} size={size} elapsed={} starts={} ends={}",
            comm.rank(),
            join(&elapsed),
            join(&starts),
            join(&ends)
        );
    }
    // Wake-ups and system calls per broadcast of 1 KiB, back to back (no
    // barriers between).
    let mut buf = vec![0u8; 1024];
    comm.barrier().map_err(|e| e.to_string())?;
    let ops = 200;
    let before = wakeups();
    let syscalls_before = comm.stats().map_err(|e| e.to_string())?.user.syscalls;
    for _ in 0..ops {
        comm.broadcast(&mut buf, Dtype::U8, root).map_err(|e| e.to_string())?;
    }
    let per_op = (wakeups() - before) as f64 / ops as f64;
    let stats = comm.stats().map_err(|e| e.to_string())?;
    println!(
        "wakeups rank={} size=1024 per_op={per_op:.2} syscalls_per_op={:.2} datapath={} group_acks={} landed={}",
        comm.rank(),
        (stats.user.syscalls - syscalls_before) as f64 / ops as f64,
        comm.datapath().name(),
        stats.user.bcast_group_acks,
        stats.user.bcast_landed
    );
    Ok(())
}

fn percentile(sorted: &[f64], p: f64) -> f64 {
    if sorted.is_empty() {
        return f64::NAN;
    }
    sorted[((sorted.len() - 1) as f64 * p).round() as usize]
}

/// p50 and p99 of `values`.
fn p50_p99(mut values: Vec<f64>) -> (f64, f64) {
    values.sort_by(|a, b| a.total_cmp(b));
    (percentile(&values, 0.5), percentile(&values, 0.99))
}

/// The latencies of one size on one datapath, each a (p50, p99) in µs.
struct Latency {
    size: usize,
    /// The root's call: until it holds every receiver's acknowledgment.
    root: (f64, f64),
    /// From the root's start to the last receiver's return, on one clock.
    span: (f64, f64),
    /// The slowest rank's own elapsed time from leaving the barrier (how
    /// bench/mpi measures Open MPI by default).
    slowest: (f64, f64),
}

/// What one datapath's run measured.
struct BcastRun {
    latencies: Vec<Latency>,
    /// Worst receiver's wake-ups per 1 KiB broadcast.
    wakeups: f64,
    /// System calls per 1 KiB broadcast: the root's, the worst receiver's.
    syscalls: (f64, f64),
}

fn bcast_run(cluster: &Cluster, datapath: &str, sizes: &[usize], rounds: usize, port: u16) -> Result<BcastRun, String> {
    let exe = std::env::current_exe().map_err(|e| e.to_string())?;
    let n = cluster.hosts().len();
    let size_args: Vec<String> = sizes.iter().map(|s| s.to_string()).collect();
    let children: Vec<_> = (0..n)
        .map(|i| {
            cluster
                .command(i, &exe)
                .arg("rank-bcast")
                .args(["--rounds", &rounds.to_string()])
                .args(&size_args)
                .env("RANK", i.to_string())
                .env("WORLD_SIZE", n.to_string())
                .env("MASTER_ADDR", cluster.host(0).ipv4.to_string())
                .env("MASTER_PORT", port.to_string())
                .env("AGGBOX_DATAPATH", datapath)
                .stdout(Stdio::piped())
                .spawn()
                .map_err(|e| e.to_string())
        })
        .collect::<Result<_, _>>()?;
    let mut outputs = Vec::new();
    for child in children {
        let out = child.wait_with_output().map_err(|e| e.to_string())?;
        if !out.status.success() {
            return Err(format!("a rank failed on the {datapath} datapath"));
        }
        outputs.push(String::from_utf8_lossy(&out.stdout).to_string());
    }
    let series = |rank: usize, size: usize, key: &str| -> Vec<f64> {
        outputs[rank]
            .lines()
            .find(|l| l.starts_with("bcast ") && l.contains(&format!(" size={size} ")))
            .and_then(|l| l.split_whitespace().find_map(|w| w.strip_prefix(key)?.strip_prefix('=')))
            .map(|s| s.split(',').filter_map(|v| v.parse().ok()).collect())
            .unwrap_or_default()
    };
    let mut latencies = Vec::new();
    for &size in sizes {
        let root = series(0, size, "elapsed");
        let starts = series(0, size, "starts");
        let elapsed: Vec<Vec<f64>> = (0..n).map(|r| series(r, size, "elapsed")).collect();
        let ends: Vec<Vec<f64>> = (1..n).map(|r| series(r, size, "ends")).collect();
        let rounds = root.len();
        let span = (0..rounds)
            .map(|i| (ends.iter().map(|e| e.get(i).copied().unwrap_or(f64::NAN)).fold(0.0, f64::max) - starts[i]) / 1e3)
            .collect();
        let slowest = (0..rounds).map(|i| elapsed.iter().map(|e| e.get(i).copied().unwrap_or(f64::NAN)).fold(0.0, f64::max)).collect();
        latencies.push(Latency { size, root: p50_p99(root), span: p50_p99(span), slowest: p50_p99(slowest) });
    }
    let last_lines: Vec<&str> = outputs.iter().filter_map(|o| o.lines().find(|l| l.starts_with("wakeups "))).collect();
    let worst = |key: &str, lines: &[&str]| lines.iter().map(|l| field(l, key)).fold(0.0, f64::max);
    let receivers = last_lines.get(1..).unwrap_or_default();
    Ok(BcastRun {
        latencies,
        wakeups: worst("per_op", receivers),
        syscalls: (last_lines.first().map_or(f64::NAN, |l| field(l, "syscalls_per_op")), worst("syscalls_per_op", receivers)),
    })
}

/// p50 round trip of a UDP ping-pong between hosts 0 and 1, blocking
/// receives (so it includes the wake-ups), in µs.
fn udp_floor(cluster: &Cluster) -> Result<f64, String> {
    use aggbox_core::transport::Transport;
    use std::time::{Duration, Instant};
    let a = cluster.run_in(0, || Transport::bind(cluster.host(0).ipv4, 47_900)).map_err(|e| e.to_string())?.map_err(|e| e.to_string())?;
    let b = cluster.run_in(1, || Transport::bind(cluster.host(1).ipv4, 47_900)).map_err(|e| e.to_string())?.map_err(|e| e.to_string())?;
    let (a_addr, b_addr) = (a.local_addr(), b.local_addr());
    let rounds = 2000;
    let echo = thread::spawn(move || {
        let mut buf = [0u8; 64];
        for _ in 0..rounds {
            if let Ok(Some((len, from))) = b.recv(&mut buf, Instant::now() + Duration::from_secs(5)) {
                let _ = b.send(&buf[..len], from);
            }
        }
    });
    let mut samples = Vec::with_capacity(rounds);
    let mut buf = [0u8; 64];
    for _ in 0..rounds {
        let t = Instant::now();
        a.send(&[1u8; 32], b_addr).map_err(|e| e.to_string())?;
        if a.recv(&mut buf, Instant::now() + Duration::from_secs(5)).map_err(|e| e.to_string())?.is_none() {
            return Err("UDP ping-pong lost a datagram".into());
        }
        samples.push(t.elapsed().as_secs_f64() * 1e6);
    }
    let _ = echo.join();
    let _ = a_addr;
    samples.sort_by(|x, y| x.total_cmp(y));
    Ok(percentile(&samples, 0.5))
}

/// Open MPI's MPI_Bcast on the same cluster (bench/mpi/run.sh with `-s`),
/// when mpirun is installed: per size, (bytes, slowest rank's p50, p99, span
/// p50, p99).
fn mpi_bcast(cluster: &Cluster, sizes: &[usize]) -> Option<Vec<(usize, (f64, f64), (f64, f64))>> {
    let script = concat!(env!("CARGO_MANIFEST_DIR"), "/../bench/mpi/run.sh");
    if !std::path::Path::new(script).exists() || std::process::Command::new("sh").args(["-c", "command -v mpirun"]).output().ok()?.stdout.is_empty() {
        return None;
    }
    let mut cmd = std::process::Command::new("bash");
    cmd.arg(script).arg(cluster.prefix()).arg(cluster.hosts().len().to_string()).args(["--", "-s"]);
    cmd.args(sizes.iter().map(|s| s.to_string()));
    let out = cmd.output().ok()?;
    let text = String::from_utf8_lossy(&out.stdout);
    let rows: Vec<_> = text
        .lines()
        .filter(|l| l.starts_with("mpi op=bcast"))
        .map(|l| {
            (field(l, "bytes") as usize, (field(l, "p50_us"), field(l, "p99_us")), (field(l, "span_p50_us"), field(l, "span_p99_us")))
        })
        .collect();
    (!rows.is_empty()).then_some(rows)
}

fn human(size: usize) -> String {
    match size {
        s if s >= 1 << 20 && s % (1 << 20) == 0 => format!("{} MiB", s >> 20),
        s if s >= 1 << 10 && s % (1 << 10) == 0 => format!("{} KiB", s >> 10),
        s => format!("{s} B"),
    }
}

/// `aggbox bench broadcast`.
pub fn broadcast(hosts: usize, mtu: u32, rounds: usize, with_mpi: bool) -> Result<(), String> {
    let sizes = [64, 1024, 64 << 10, 1 << 20, 64 << 20];
    let cluster = Cluster::temporary_with_mtu(hosts, mtu).map_err(|e| e.to_string())?;
    println!(
        "broadcast on {hosts} hosts, MTU {mtu} (chunk {} B), root 0, p50 in µs. root: the root's call (until every receiver holds the data); \
         span: from the root's start to the last receiver's return (one clock); slowest: the slowest rank's own time after the barrier (bench/mpi's default)",
        aggbox_core::wire::chunk_size(mtu)
    );
    let kernel = bcast_run(&cluster, "kernel", &sizes, rounds, 29_500)?;
    let user = bcast_run(&cluster, "user", &sizes, rounds, 29_501)?;
    let mpi = if with_mpi { mpi_bcast(&cluster, &sizes) } else { None };
    let floor = udp_floor(&cluster)?;
    println!(
        "{:>8} | {:>26} | {:>26} | {:>18} | {:>11} {:>11} {:>11}",
        "size", "kernel root/span/slowest", "user root/span/slowest", "Open MPI span/slow", "kernel/user", "kernel/MPI", "k/MPI slow"
    );
    let mpi_row = |size: usize| mpi.as_ref().and_then(|rows| rows.iter().find(|r| r.0 == size));
    for (k, u) in kernel.latencies.iter().zip(&user.latencies) {
        let m = mpi_row(k.size);
        println!(
            "{:>8} | {:>8.1} {:>8.1} {:>8.1} | {:>8.1} {:>8.1} {:>8.1} | {:>18} | {:>11.3} {:>11} {:>11}",
            human(k.size),
            k.root.0,
            k.span.0,
            k.slowest.0,
            u.root.0,
            u.span.0,
            u.slowest.0,
            m.map_or("-".into(), |m| format!("{:.1} {:.1}", m.2 .0, m.1 .0)),
            k.span.0 / u.span.0,
            m.map_or("-".into(), |m| format!("{:.3}", k.span.0 / m.2 .0)),
            m.map_or("-".into(), |m| format!("{:.3}", k.slowest.0 / m.1 .0)),
        );
    }
    println!("ratios: kernel/user and kernel/MPI compare spans; k/MPI slow compares the slowest rank's own times");
    for (label, run) in [("kernel", &kernel), ("user", &user)] {
        let p99: Vec<String> = run.latencies.iter().map(|r| format!("{} {:.1}/{:.1}", human(r.size), r.root.1, r.span.1)).collect();
        println!("{label} p99 root/span: {}", p99.join(", "));
    }
    if let Some(rows) = &mpi {
        let p99: Vec<String> = rows.iter().map(|r| format!("{} {:.1}/{:.1}", human(r.0), r.2 .1, r.1 .1)).collect();
        println!("Open MPI p99 span/slowest: {}", p99.join(", "));
    } else if with_mpi {
        println!("Open MPI: not measured (run scripts/mpi-setup.sh to install it)");
    }
    let big = *sizes.last().unwrap();
    let throughput = |us: f64| big as f64 / us; // bytes per µs = MB/s
    println!(
        "64 MiB throughput (span): kernel {:.0} MB/s, user {:.0} MB/s{}",
        throughput(kernel.latencies.last().unwrap().span.0),
        throughput(user.latencies.last().unwrap().span.0),
        mpi_row(big).map_or(String::new(), |m| format!(", Open MPI {:.0} MB/s", throughput(m.2 .0)))
    );
    println!("UDP ping-pong between two hosts (blocking receives): p50 {floor:.1} µs round trip");
    println!(
        "per 1 KiB broadcast, back to back: wake-ups of the worst receiver: kernel {:.2}, user {:.2}; socket syscalls root/worst receiver: kernel {:.1}/{:.1}, user {:.1}/{:.1}",
        kernel.wakeups, user.wakeups, kernel.syscalls.0, kernel.syscalls.1, user.syscalls.0, user.syscalls.1
    );
    Ok(())
}
