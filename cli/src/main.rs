//! `aggbox`: doctor, virtual cluster, benchmarks and status.

mod agree_bench;
mod bench;
mod results;

use std::{net::Ipv4Addr, process::ExitCode, time::Instant};

use aggbox_core::{
    cluster::{self, Cluster, ClusterSpec},
    doctor,
    fault::FaultSpec,
    loader,
    maps::{Prog, BSTAT_NAMES, STAT_NAMES},
    Comm,
};
use clap::{Parser, Subcommand};

#[derive(Parser)]
#[command(name = "aggbox", version, about = "In-kernel broadcast and aggregation collectives")]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Report what this host supports and which datapath `auto` would choose.
    Doctor {
        /// Interface to examine (default: AGGBOX_IFACE, else the one that
        /// reaches MASTER_ADDR, else the first non-loopback one).
        #[arg(long)]
        iface: Option<String>,
    },
    /// Bring a virtual cluster of network namespaces up or down.
    Cluster {
        #[command(subcommand)]
        action: ClusterAction,
    },
    /// Measure, printing ratios measured in one run.
    Bench {
        #[command(subcommand)]
        what: bench::Bench,
    },
    /// List the AggBox attachments on this host, their users and counters.
    Status,
    /// Run as one rank (used by `bench` and the demo): barriers from the
    /// environment (RANK, WORLD_SIZE, MASTER_ADDR, …), one report line.
    #[command(hide = true)]
    Rank {
        /// How many barriers.
        #[arg(default_value_t = 1000)]
        barriers: usize,
    },
    /// Run as one rank of `bench broadcast`: timed broadcasts of each size
    /// from root 0, one line of samples per size, then wake-ups per
    /// broadcast.
    #[command(hide = true)]
    RankBcast {
        /// Rounds of the small sizes (fewer for big ones).
        #[arg(long, default_value_t = 200)]
        rounds: usize,
        /// Sizes in bytes.
        sizes: Vec<usize>,
    },
    /// Run as one rank of `bench allreduce`: timed f32 sums of each count,
    /// every result checked, one line of samples per count, then wake-ups
    /// and system calls per operation, memory and counters.
    #[command(hide = true)]
    RankAllreduce {
        /// Timed rounds of the small counts (fewer for big ones).
        #[arg(long, default_value_t = 100)]
        rounds: usize,
        /// Element counts.
        counts: Vec<usize>,
    },
    /// Run as one rank of `bench agree`: `rounds` timed agreements after
    /// an untimed one, one line each.
    #[command(hide = true)]
    RankAgree {
        /// Timed agreements.
        #[arg(long, default_value_t = 20)]
        rounds: usize,
    },
    /// Serve a rendezvous store that outlives the ranks (AGGBOX_STORE=external
    /// on the ranks, MASTER_ADDR/MASTER_PORT pointing here): a rank that
    /// crashed and is started again from the same address rejoins its group.
    /// Runs until killed.
    Store {
        /// Ranks in the group.
        #[arg(long)]
        world_size: usize,
        /// Address to listen on.
        #[arg(long, default_value = "0.0.0.0")]
        addr: Ipv4Addr,
        /// Port to listen on.
        #[arg(long, default_value_t = aggbox_core::config::DEFAULT_MASTER_PORT)]
        port: u16,
    },
    /// Run as one rank of `bench kv`: its share of PAIRS Zipf pairs over
    /// DISTINCT keys, one untimed and `rounds` timed key-value reduces.
    #[command(hide = true)]
    RankKv {
        /// Timed operations.
        #[arg(long, default_value_t = 3)]
        rounds: usize,
        /// PAIRS DISTINCT COMBINE CAPACITY.
        args: Vec<usize>,
    },
    /// Run as one rank of the XDP floor of `bench kv`: the same batches,
    /// sent to a trivial XDP program that drops and counts them.
    #[command(hide = true)]
    RankKvFloor {
        /// Timed rounds.
        #[arg(long, default_value_t = 3)]
        rounds: usize,
        /// PAIRS DISTINCT COMBINE PORT.
        args: Vec<usize>,
    },
}

#[derive(Subcommand)]
enum ClusterAction {
    /// Create N hosts `<prefix>-h<i>` (10.77.0.(i+1)) on one bridge.
    Up {
        /// Number of hosts.
        #[arg(long, default_value_t = 4)]
        hosts: usize,
        /// Name prefix of its namespaces.
        #[arg(long, default_value = "aggbox")]
        prefix: String,
        /// MTU of every link.
        #[arg(long, default_value_t = cluster::DEFAULT_MTU)]
        mtu: u32,
        /// Inject faults on the frames delivered to every host: "DROP%,DUP%" or "DROP%,DUP%,REORDER%".
        #[arg(long)]
        faults: Option<String>,
        /// Put a bare XDP program on every bridge port, so that XDP_TX
        /// replies from the hosts are delivered: what the reductions'
        /// kernel half still needs (it turns TSO/GSO off on the hosts'
        /// eth0). Without it the bridge is plain, the network users have,
        /// and AggBox puts its programs on the TC hooks.
        #[arg(long, conflicts_with = "plain")]
        xdp_bridge: bool,
        /// A plain bridge (the default; kept for scripts that pass it).
        #[arg(long, hide = true)]
        plain: bool,
    },
    /// Remove the cluster of that prefix.
    Down {
        /// Name prefix of its namespaces.
        #[arg(long, default_value = "aggbox")]
        prefix: String,
    },
}

fn parse_faults(text: &str) -> Result<FaultSpec, String> {
    text.parse::<FaultSpec>().map_err(|e| format!("--faults {text:?}: {e}"))
}

fn run(cli: Cli) -> Result<ExitCode, String> {
    match cli.command {
        Command::Doctor { iface } => {
            let iface = iface.or_else(|| std::env::var("AGGBOX_IFACE").ok().filter(|s| !s.is_empty()));
            let toward = std::env::var("MASTER_ADDR").ok().and_then(|a| a.parse::<Ipv4Addr>().ok());
            let report = doctor::diagnose(iface.as_deref(), toward).map_err(|e| e.to_string())?;
            print!("{}", report.render());
            Ok(if report.user_ok { ExitCode::SUCCESS } else { ExitCode::FAILURE })
        }
        Command::Cluster { action: ClusterAction::Up { hosts, prefix, mtu, faults, xdp_bridge, plain: _ } } => {
            let plain = !xdp_bridge;
            let mut cluster = Cluster::up(ClusterSpec { hosts, prefix, mtu, plain }).map_err(|e| e.to_string())?;
            if let Some(faults) = faults {
                cluster.inject_faults(parse_faults(&faults)?).map_err(|e| e.to_string())?;
            }
            for host in cluster.hosts() {
                println!("{} {} {}", host.netns, host.ipv4, aggbox_core::netif::format_mac(&host.mac));
            }
            let prefix = cluster.keep().map_err(|e| e.to_string())?;
            let kind = if plain { " (a plain bridge: no program on any interface)" } else { " (a bare XDP program on every bridge port)" };
            println!("cluster {prefix}{kind} is up; run a rank with: ip netns exec {prefix}-h0 <program>; remove it with: aggbox cluster down --prefix {prefix}");
            Ok(ExitCode::SUCCESS)
        }
        Command::Cluster { action: ClusterAction::Down { prefix } } => {
            let removed = cluster::down(&prefix).map_err(|e| e.to_string())?;
            println!("removed {removed} namespaces of {prefix}");
            Ok(ExitCode::SUCCESS)
        }
        Command::Bench { what } => bench::run(what).map(|()| ExitCode::SUCCESS),
        Command::Status => {
            let attachments = loader::list_attachments().map_err(|e| e.to_string())?;
            if attachments.is_empty() {
                println!("no AggBox attachments on this host");
            }
            for a in attachments {
                let hooks = a.hooks.map_or("none", |h| h.name());
                println!("{} (hooks {hooks})", a.dir.display());
                for u in &a.users {
                    println!("  user pid {} port {} group {:#x}{}", u.pid, u.port, u.group, if u.alive { "" } else { " (dead: reclaimed at the next start)" });
                }
                for prog in Prog::ALL {
                    let counters: Vec<String> = STAT_NAMES
                        .iter()
                        .zip(a.stats.counters[prog as usize])
                        .filter(|(_, v)| *v > 0)
                        .map(|(n, v)| format!("{n}={v}"))
                        .collect();
                    println!("  {:<12} {}", prog.name(), if counters.is_empty() { "-".into() } else { counters.join(" ") });
                }
                let broadcast: Vec<String> = BSTAT_NAMES
                    .iter()
                    .zip(a.broadcast)
                    .filter(|(_, v)| *v > 0)
                    .map(|(n, v)| format!("{n}={v}"))
                    .collect();
                println!("  {:<12} {}", "broadcast", if broadcast.is_empty() { "-".into() } else { broadcast.join(" ") });
            }
            Ok(ExitCode::SUCCESS)
        }
        Command::Rank { barriers } => rank(barriers).map(|()| ExitCode::SUCCESS),
        Command::RankBcast { rounds, sizes } => bench::rank_bcast(rounds, &sizes).map(|()| ExitCode::SUCCESS),
        Command::RankAllreduce { rounds, counts } => bench::rank_allreduce(rounds, &counts).map(|()| ExitCode::SUCCESS),
        Command::RankKv { rounds, args } => bench::rank_kv(rounds, &args).map(|()| ExitCode::SUCCESS),
        Command::RankKvFloor { rounds, args } => bench::rank_kv_floor(rounds, &args).map(|()| ExitCode::SUCCESS),
        Command::RankAgree { rounds } => agree_bench::rank_agree(rounds).map(|()| ExitCode::SUCCESS),
        Command::Store { world_size, addr, port } => {
            let listener = std::net::TcpListener::bind((addr, port)).map_err(|e| format!("store: binding {addr}:{port}: {e}"))?;
            let _store = aggbox_core::rendezvous::Store::serve(listener, world_size).map_err(|e| e.to_string())?;
            println!("store for {world_size} ranks on {addr}:{port}");
            loop {
                std::thread::park();
            }
        }
    }
}

/// One rank of a benchmark: `barriers` timed barriers back to back after a
/// warm-up one, then `barriers` samples of one barrier each, taken as
/// bench/mpi takes them (a barrier, then each rank times its own barrier;
/// `sampled_us`, one per sample, for the bench to take the slowest rank's).
fn rank(barriers: usize) -> Result<(), String> {
    let mut comm = Comm::from_env().map_err(|e| e.to_string())?;
    comm.barrier().map_err(|e| e.to_string())?;
    if comm.rank() == 0 {
        eprintln!("progress: {barriers} barriers back to back");
    }
    let mut samples = Vec::with_capacity(barriers);
    let start = Instant::now();
    for _ in 0..barriers {
        let t = Instant::now();
        comm.barrier().map_err(|e| e.to_string())?;
        samples.push(t.elapsed().as_nanos() as u64);
    }
    let total = start.elapsed();
    samples.sort_unstable();
    let p50 = samples.get(samples.len() / 2).copied().unwrap_or(0);
    if comm.rank() == 0 {
        eprintln!("progress: {barriers} sampled barriers (a barrier, then each rank times its own)");
    }
    let mut sampled = Vec::with_capacity(barriers);
    for _ in 0..barriers {
        comm.barrier().map_err(|e| e.to_string())?;
        let t = Instant::now();
        comm.barrier().map_err(|e| e.to_string())?;
        sampled.push(format!("{:.1}", t.elapsed().as_nanos() as f64 / 1000.0));
    }
    let stats = comm.stats().map_err(|e| e.to_string())?;
    println!(
        "rank={} datapath={} barriers={barriers} total_us={} p50_us={:.1} retransmits={} xdp_accepted={} sampled_us={}",
        comm.rank(),
        comm.datapath().name(),
        total.as_micros(),
        p50 as f64 / 1000.0,
        stats.user.retransmits,
        stats.kernel.get(Prog::XdpIngress, "accepted"),
        sampled.join(",")
    );
    Ok(())
}

fn main() -> ExitCode {
    match run(Cli::parse()) {
        Ok(code) => code,
        Err(message) => {
            eprintln!("aggbox: {message}");
            ExitCode::FAILURE
        }
    }
}
