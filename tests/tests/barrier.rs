//! Barriers across processes in an 8-host virtual cluster, on each datapath,
//! mixed, and with injected faults. Every rank checks the barrier's meaning
//! against a shared file (nobody leaves barrier i before everyone entered it).

use std::time::Duration;

use aggbox_core::{cluster::Cluster, fault::FaultSpec};
use aggbox_tests::{aggbox_pins, fields, number, RankProcess};

const HOSTS: usize = 8;
const MASTER_PORT: u16 = 29_500;

fn rank_binary() -> std::path::PathBuf {
    env!("CARGO_BIN_EXE_aggbox-rank").into()
}

/// Runs `barriers` checked barriers, rank i on host i with `datapath_of(i)`;
/// returns each rank's report fields.
fn run(cluster: &Cluster, barriers: usize, datapath_of: impl Fn(usize) -> &'static str) -> Vec<std::collections::HashMap<String, String>> {
    let check = tempfile(HOSTS);
    let ranks: Vec<RankProcess> = (0..HOSTS)
        .map(|i| {
            RankProcess::spawn(
                cluster,
                i,
                0,
                MASTER_PORT,
                i,
                HOSTS,
                datapath_of(i),
                &rank_binary(),
                &[&barriers.to_string(), "--check", check.to_str().unwrap()],
                &[],
            )
        })
        .collect();
    let reports = ranks
        .into_iter()
        .enumerate()
        .map(|(i, rank)| {
            let (code, lines) = rank.finish(Duration::from_secs(120));
            assert_eq!(code, 0, "rank {i} failed: {lines:?}");
            let report = lines.iter().find(|l| l.starts_with("phase=first")).expect("report line");
            fields(report)
        })
        .collect();
    std::fs::remove_file(&check).ok();
    reports
}

fn tempfile(ranks: usize) -> std::path::PathBuf {
    static NEXT: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);
    let n = NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let path = std::env::temp_dir().join(format!("aggbox-check-{}-{n}", std::process::id()));
    std::fs::write(&path, vec![0u8; ranks * 8]).unwrap();
    path
}

fn assert_reports(reports: &[std::collections::HashMap<String, String>], barriers: u64, datapath_of: impl Fn(usize) -> &'static str) {
    for (i, r) in reports.iter().enumerate() {
        assert_eq!(number(r, "rank"), i as u64);
        assert_eq!(number(r, "barriers"), barriers, "rank {i}");
        assert_eq!(r["datapath"], datapath_of(i), "rank {i}: {r:?}");
        let received = number(r, "received");
        if datapath_of(i) == "kernel" {
            assert_eq!(r["hooks"], "xdp-driver", "the cluster's ports run XDP: XDP hooks, native on veth");
            // Every datagram the socket got came through the first program.
            assert!(number(r, "ingress_accepted") >= received, "rank {i}: {r:?}");
        } else {
            assert_eq!(number(r, "xdp_accepted"), 0);
        }
        // Rank 0 hears an arrival from each other rank per barrier; the
        // others hear one release per barrier.
        let least = if i == 0 { barriers * (HOSTS as u64 - 1) } else { barriers };
        assert!(received >= least, "rank {i} received {received} < {least}");
    }
}

#[test]
fn kernel_user_and_mixed_datapaths() {
    let cluster = Cluster::temporary(HOSTS).unwrap();
    let kernel = |_| "kernel";
    let user = |_| "user";
    let mixed = |i: usize| if i.is_multiple_of(2) { "kernel" } else { "user" };
    assert_reports(&run(&cluster, 300, kernel), 300, kernel);
    assert_reports(&run(&cluster, 300, user), 300, user);
    assert_reports(&run(&cluster, 300, mixed), 300, mixed);
    drop(cluster);
    assert!(aggbox_pins().iter().all(|p| !p.to_string_lossy().contains("abt")), "no pins left");
}

#[test]
fn faults_are_survived_on_both_datapaths() {
    let mut cluster = Cluster::temporary(HOSTS).unwrap();
    cluster.inject_faults(FaultSpec::percent(10.0, 2.0)).unwrap();
    for datapath in ["kernel", "user"] {
        let before: u64 = cluster.fault_stats().unwrap().iter().map(|s| s.dropped).sum();
        let reports = run(&cluster, 200, |_| datapath);
        assert_reports(&reports, 200, |_| datapath);
        let dropped: u64 = cluster.fault_stats().unwrap().iter().map(|s| s.dropped).sum::<u64>() - before;
        let retransmits: u64 = reports.iter().map(|r| number(r, "retransmits")).sum();
        assert!(dropped > 0, "the fault program dropped frames");
        assert!(retransmits > 0, "{datapath}: the loss was seen and repaired (retransmits)");
    }
}
