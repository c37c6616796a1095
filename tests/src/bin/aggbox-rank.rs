//! A rank process for the multi-process tests: joins the group from the
//! environment (RANK, WORLD_SIZE, MASTER_ADDR, …), runs barriers and reports.
//!
//! `aggbox-rank BARRIERS [--hold]`: runs BARRIERS barriers, prints one
//! `key=value` line, then (with `--hold`) prints `holding` and waits for a
//! line on stdin before the second round of BARRIERS barriers and exit.

use std::io::BufRead;

use aggbox_core::{maps::Prog, Comm};

fn report(comm: &Comm, phase: &str) {
    let stats = comm.stats().expect("stats");
    let k = &stats.kernel;
    let shared = comm.attachment().map_or(0, |a| a.shared_with());
    let mode = comm.attachment().map_or("none", |a| a.xdp_mode().name());
    println!(
        "phase={phase} rank={} size={} datapath={} xdp_mode={mode} shared_with={shared} barriers={} sent={} received={} retransmits={} xdp_accepted={} xdp_dropped_foreign={}",
        comm.rank(),
        comm.size(),
        comm.datapath().name(),
        stats.user.barriers,
        stats.user.packets_sent,
        stats.user.packets_received,
        stats.user.retransmits,
        k.get(Prog::XdpIngress, "accepted"),
        k.get(Prog::XdpIngress, "drop_bad_token") + k.get(Prog::XdpIngress, "drop_not_member"),
    );
}

fn main() {
    let mut args = std::env::args().skip(1);
    let barriers: usize = args.next().and_then(|a| a.parse().ok()).unwrap_or(10);
    let hold = args.any(|a| a == "--hold");
    let mut comm = match Comm::from_env() {
        Ok(comm) => comm,
        Err(e) => {
            println!("error status={:?} message={e}", e.status());
            std::process::exit(1);
        }
    };
    let run = |comm: &mut Comm| {
        for _ in 0..barriers {
            if let Err(e) = comm.barrier() {
                println!("error status={:?} message={e}", e.status());
                std::process::exit(1);
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
