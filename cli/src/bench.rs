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
    /// Barrier latency on N hosts, kernel vs user datapath.
    Barrier {
        /// Number of hosts (one rank each).
        #[arg(long, default_value_t = 8)]
        hosts: usize,
        /// Barriers per run.
        #[arg(long, default_value_t = 1000)]
        barriers: usize,
        /// Faults on every host's link: "DROP%,DUP%".
        #[arg(long)]
        faults: Option<String>,
    },
}

pub fn run(bench: Bench) -> Result<(), String> {
    match bench {
        Bench::Tcp { seconds, rounds } => tcp(seconds, rounds),
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
