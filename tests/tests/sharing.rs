//! One attachment per interface, shared: by two processes on a host, by two
//! communicators in one process; the last one out detaches; a SIGKILLed
//! process leaves nothing that breaks the next start. On a plain bridge,
//! as users have it: the hooks are TC's.

use std::{net::Ipv4Addr, path::PathBuf, thread, time::Duration};

use aggbox_core::{
    cluster::Cluster,
    loader::{self, list_attachments},
    netif, Comm, Config, Datapath,
};
use aggbox_tests::{attached_programs, fields, number, RankProcess};

fn rank_binary() -> PathBuf {
    env!("CARGO_BIN_EXE_aggbox-rank").into()
}

/// A plain 2-host cluster: TC hooks on every eth0.
fn plain_cluster() -> Cluster {
    Cluster::temporary_plain(2, 1500).unwrap()
}

/// The pin directory of host `host`'s eth0 attachment (TC hooks).
fn pin_dir_of(cluster: &Cluster, host: usize) -> PathBuf {
    cluster
        .run_in(host, || loader::pin_dir(&netif::choose(Some("eth0"), Ipv4Addr::UNSPECIFIED).unwrap(), true).unwrap())
        .unwrap()
}

/// (live, dead) users of the attachment in `dir`.
fn users_of(dir: &PathBuf) -> (usize, usize) {
    let all = list_attachments().unwrap();
    let Some(a) = all.iter().find(|a| &a.dir == dir) else { return (0, 0) };
    let live = a.users.iter().filter(|u| u.alive).count();
    (live, a.users.len() - live)
}

/// Starts a 2-rank group on hosts 0 and 1 with `--hold`; waits until both hold.
fn holding_group(cluster: &Cluster, master_port: u16, barriers: &str) -> Vec<RankProcess> {
    let mut ranks: Vec<RankProcess> = (0..2)
        .map(|i| RankProcess::spawn(cluster, i, 0, master_port, i, 2, "kernel", &rank_binary(), &[barriers, "--hold"], &[]))
        .collect();
    for rank in &mut ranks {
        rank.wait_for("holding");
    }
    ranks
}

fn first_report(rank: &RankProcess) -> std::collections::HashMap<String, String> {
    fields(rank.lines.iter().find(|l| l.starts_with("phase=first")).expect("first report"))
}

fn release(ranks: Vec<RankProcess>) -> Vec<std::collections::HashMap<String, String>> {
    let mut ranks = ranks;
    for rank in &mut ranks {
        rank.say("go");
    }
    ranks
        .into_iter()
        .map(|rank| {
            let (code, lines) = rank.finish(Duration::from_secs(60));
            assert_eq!(code, 0, "{lines:?}");
            fields(lines.iter().find(|l| l.starts_with("phase=second")).expect("second report"))
        })
        .collect()
}

#[test]
fn two_processes_share_one_attachment_and_the_last_detaches() {
    let cluster = plain_cluster();
    let dirs = [pin_dir_of(&cluster, 0), pin_dir_of(&cluster, 1)];

    let group_a = holding_group(&cluster, 29_500, "50");
    for rank in &group_a {
        assert_eq!(first_report(rank)["shared_with"], "0", "the first process attaches");
    }
    let group_b = holding_group(&cluster, 29_501, "50");
    for rank in &group_b {
        let report = first_report(rank);
        assert_eq!(report["shared_with"], "1", "the second process shares: {report:?}");
        assert_eq!(report["datapath"], "kernel");
    }
    for dir in &dirs {
        assert_eq!(users_of(dir), (2, 0));
    }

    // A leaves: the programs stay for B.
    let a_done = release(group_a);
    assert!(a_done.iter().all(|r| number(r, "barriers") == 100));
    for (host, dir) in dirs.iter().enumerate() {
        assert!(dir.exists(), "B still uses the attachment on host {host}");
        assert_eq!(users_of(dir), (1, 0));
        assert_eq!(attached_programs(&cluster, host), "tc ");
    }
    let b_done = release(group_b);
    for report in &b_done {
        assert_eq!(number(report, "barriers"), 100);
        assert!(number(report, "ingress_accepted") >= number(report, "received"));
    }
    // B was last: nothing is left attached or pinned.
    for (host, dir) in dirs.iter().enumerate() {
        assert!(!dir.exists(), "pins of host {host} removed");
        assert_eq!(attached_programs(&cluster, host), "", "nothing attached on host {host}");
    }
}

fn config(rank: usize, master: Ipv4Addr, master_port: u16) -> Config {
    Config {
        rank,
        world_size: 2,
        master_addr: master,
        master_port,
        datapath: Datapath::Kernel,
        timeout: Duration::from_secs(20),
        ..Config::default()
    }
}

#[test]
fn two_communicators_in_one_process_share_one_attachment() {
    let cluster = plain_cluster();
    let master = cluster.host(0).ipv4;
    let dirs = [pin_dir_of(&cluster, 0), pin_dir_of(&cluster, 1)];
    // Group A first, then group B, all four communicators in this process.
    let make_group = |port: u16| -> Vec<Comm> {
        thread::scope(|s| {
            let handles: Vec<_> = (0..2)
                .map(|i| {
                    let cluster = &cluster;
                    s.spawn(move || cluster.run_in(i, || Comm::new(config(i, master, port))).unwrap().unwrap())
                })
                .collect();
            handles.into_iter().map(|h| h.join().unwrap()).collect()
        })
    };
    let barriers = |comms: &mut Vec<Comm>, n: usize| {
        thread::scope(|s| {
            for comm in comms.iter_mut() {
                s.spawn(move || (0..n).for_each(|_| comm.barrier().unwrap()));
            }
        })
    };
    let mut a = make_group(29_600);
    let mut b = make_group(29_601);
    for comm in &a {
        assert_eq!(comm.attachment().unwrap().shared_with(), 0);
    }
    for comm in &b {
        assert_eq!(comm.attachment().unwrap().shared_with(), 1);
        assert_eq!(comm.attachment().unwrap().pin_dir(), a[comm.rank()].attachment().unwrap().pin_dir());
    }
    barriers(&mut a, 50);
    barriers(&mut b, 50);
    thread::scope(|s| {
        for comm in a.drain(..) {
            s.spawn(move || drop(comm));
        }
    });
    for dir in &dirs {
        assert_eq!(users_of(dir), (1, 0), "group B still holds the attachment");
    }
    barriers(&mut b, 50);
    let accepted = b[0].stats().unwrap().kernel.get(aggbox_core::maps::Prog::TcIngress, "accepted");
    assert!(accepted >= 50, "B's datagrams still pass through TC ingress: {accepted}");
    thread::scope(|s| {
        for comm in b.drain(..) {
            s.spawn(move || drop(comm));
        }
    });
    for dir in &dirs {
        assert!(!dir.exists());
    }
}

#[test]
fn a_sigkilled_process_leaves_nothing_that_breaks_the_next_start() {
    let cluster = plain_cluster();
    let dirs = [pin_dir_of(&cluster, 0), pin_dir_of(&cluster, 1)];

    // Two groups share the hosts; group A is killed with SIGKILL.
    let group_a = holding_group(&cluster, 29_500, "20");
    let group_b = holding_group(&cluster, 29_501, "20");
    for mut rank in group_a {
        rank.child.kill().unwrap(); // SIGKILL
        rank.child.wait().unwrap();
    }
    for dir in &dirs {
        assert_eq!(users_of(dir), (1, 1), "A's entries are stale until the next start");
    }
    // A new group starts: it reclaims A's entries and shares with B.
    let group_c = holding_group(&cluster, 29_502, "20");
    for rank in &group_c {
        assert_eq!(first_report(rank)["shared_with"], "1");
    }
    for dir in &dirs {
        assert_eq!(users_of(dir), (2, 0), "stale users reclaimed");
    }
    // Kill everyone: only stale pins are left ...
    for mut rank in group_b.into_iter().chain(group_c) {
        rank.child.kill().unwrap();
        rank.child.wait().unwrap();
    }
    for dir in &dirs {
        assert!(dir.exists());
        assert_eq!(users_of(dir), (0, 2));
    }
    // ... and the next start tears them down and attaches anew.
    let fresh: Vec<RankProcess> = (0..2)
        .map(|i| RankProcess::spawn(&cluster, i, 0, 29_503, i, 2, "kernel", &rank_binary(), &["20"], &[]))
        .collect();
    for rank in fresh {
        let (code, lines) = rank.finish(Duration::from_secs(60));
        assert_eq!(code, 0, "{lines:?}");
        let report = fields(&lines[0]);
        assert_eq!(report["shared_with"], "0", "nothing live to share with: {report:?}");
        assert_eq!(number(&report, "barriers"), 20);
    }
    for (host, dir) in dirs.iter().enumerate() {
        assert!(!dir.exists());
        assert_eq!(attached_programs(&cluster, host), "");
    }
}

#[test]
fn a_cluster_removed_after_its_ranks_were_killed_leaves_no_pins() {
    let cluster = plain_cluster();
    let dirs = [pin_dir_of(&cluster, 0), pin_dir_of(&cluster, 1)];
    let group = holding_group(&cluster, 29_500, "5");
    for mut rank in group {
        rank.child.kill().unwrap();
        rank.child.wait().unwrap();
    }
    assert!(dirs.iter().all(|d| d.exists()), "killed ranks cannot unpin");
    drop(cluster);
    for dir in &dirs {
        assert!(!dir.exists(), "{} removed with its namespace", dir.display());
    }
}
