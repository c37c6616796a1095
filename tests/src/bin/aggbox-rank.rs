//! A rank process for the multi-process tests: joins the group from the
//! environment (RANK, WORLD_SIZE, MASTER_ADDR, …), runs barriers and reports.
//!
//! `aggbox-rank BARRIERS [--hold] [--check FILE]`
//! - runs BARRIERS barriers and prints one `key=value` report line;
//! - `--hold`: then prints `holding`, waits for a line on stdin, runs
//!   BARRIERS more and reports again;
//! - `--check FILE`: FILE holds one u64 per rank, shared by every rank (the
//!   namespaces share the file system). Before barrier i a rank stores i in
//!   its slot; after it, every slot must be at least i, or the barrier let
//!   someone out early: the rank prints `violation` and exits 2.

use std::{
    fs::OpenOptions,
    io::BufRead,
    os::fd::AsRawFd,
    sync::atomic::{AtomicU64, Ordering},
};

use aggbox_core::{maps::Prog, Comm};

fn report(comm: &Comm, phase: &str) {
    let stats = comm.stats().expect("stats");
    let k = &stats.kernel;
    let shared = comm.attachment().map_or(0, |a| a.shared_with());
    let hooks = comm.attachment().map_or("none", |a| a.hooks().name());
    // The first program a datagram meets: XDP ingress, or on the TC hooks TC ingress.
    let first = match comm.attachment().map(|a| a.hooks()) {
        Some(aggbox_core::loader::Hooks::Tc) => Prog::TcIngress,
        _ => Prog::XdpIngress,
    };
    // The kernel's barrier counters (rank 0's TC ingress counts arrivals).
    let barrier: Vec<String> = comm
        .attachment()
        .map(|a| a.broadcast_stats().expect("broadcast stats"))
        .map(|stats| {
            aggbox_core::maps::BSTAT_NAMES
                .iter()
                .zip(stats)
                .filter(|(name, _)| name.starts_with("barrier_"))
                .map(|(name, value)| format!("k_{name}={value}"))
                .collect()
        })
        .unwrap_or_default();
    println!(
        "phase={phase} rank={} size={} datapath={} hooks={hooks} shared_with={shared} barriers={} sent={} received={} retransmits={} duplicates={} xdp_accepted={} xdp_seen={} ingress_accepted={} reason={} {}",
        comm.rank(),
        comm.size(),
        comm.datapath().name(),
        stats.user.barriers,
        stats.user.packets_sent,
        stats.user.packets_received,
        stats.user.retransmits,
        stats.user.duplicates,
        k.get(Prog::XdpIngress, "accepted"),
        k.get(Prog::XdpIngress, "seen"),
        k.get(first, "accepted"),
        comm.datapath_reason().unwrap_or("-").replace(' ', "_"),
        barrier.join(" "),
    );
}

fn fail(e: aggbox_core::Error) -> ! {
    println!("error status={:?} message={e}", e.status());
    std::process::exit(1);
}

/// The shared slots of `--check`, mapped from FILE.
fn map_slots(path: &str, ranks: usize) -> &'static [AtomicU64] {
    let file = OpenOptions::new().read(true).write(true).open(path).expect("open the --check file");
    let len = ranks * std::mem::size_of::<u64>();
    assert!(file.metadata().unwrap().len() as usize >= len, "--check file too small");
    // SAFETY: a shared mapping of a file at least `len` bytes long, kept for
    // the life of the process; AtomicU64 has the layout of u64.
    unsafe {
        let ptr = libc::mmap(std::ptr::null_mut(), len, libc::PROT_READ | libc::PROT_WRITE, libc::MAP_SHARED, file.as_raw_fd(), 0);
        assert_ne!(ptr, libc::MAP_FAILED, "mmap the --check file");
        std::slice::from_raw_parts(ptr as *const AtomicU64, ranks)
    }
}

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let barriers: u64 = args.first().and_then(|a| a.parse().ok()).unwrap_or(10);
    let hold = args.iter().any(|a| a == "--hold");
    let check = args.iter().position(|a| a == "--check").map(|i| args[i + 1].clone());
    let mut comm = Comm::from_env().unwrap_or_else(|e| fail(e));
    let slots = check.map(|path| map_slots(&path, comm.size()));
    let mut round = 0u64;
    let mut run = |comm: &mut Comm| {
        for _ in 0..barriers {
            round += 1;
            if let Some(slots) = slots {
                slots[comm.rank()].store(round, Ordering::SeqCst);
            }
            comm.barrier().unwrap_or_else(|e| fail(e));
            if let Some(slots) = slots {
                if let Some((r, v)) = slots.iter().map(|s| s.load(Ordering::SeqCst)).enumerate().find(|(_, v)| *v < round) {
                    println!("violation: left barrier {round} while rank {r} was at {v}");
                    std::process::exit(2);
                }
            }
        }
    };
    run(&mut comm);
    report(&comm, "first");
    if hold {
        println!("holding");
        let mut line = String::new();
        std::io::stdin().lock().read_line(&mut line).ok();
        run(&mut comm);
        report(&comm, "second");
    }
}
