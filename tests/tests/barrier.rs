//! Barriers across processes in an 8-host virtual cluster (a plain bridge,
//! and a bridge whose ports run XDP), on each datapath, mixed, and with
//! injected faults. Every rank checks the barrier's meaning
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

/// What the run looked like: which hooks kernel ranks attach, and whether
/// frames were lost (then retransmits may reach rank 0's socket).
#[derive(Clone, Copy)]
struct Expect {
    hooks: &'static str,
    faults: bool,
}

const PLAIN: Expect = Expect { hooks: "tc", faults: false };
const XDP_BRIDGE: Expect = Expect { hooks: "xdp-driver", faults: false };

fn assert_reports(
    reports: &[std::collections::HashMap<String, String>],
    barriers: u64,
    expect: Expect,
    datapath_of: impl Fn(usize) -> &'static str,
) {
    let members = HOSTS as u64 - 1;
    for (i, r) in reports.iter().enumerate() {
        assert_eq!(number(r, "rank"), i as u64);
        assert_eq!(number(r, "barriers"), barriers, "rank {i}");
        assert_eq!(r["datapath"], datapath_of(i), "rank {i}: {r:?}");
        let received = number(r, "received");
        if datapath_of(i) == "kernel" {
            assert_eq!(r["hooks"], expect.hooks, "rank {i}: {r:?}");
            // Every datagram the socket got came through the first program.
            assert!(number(r, "ingress_accepted") >= received, "rank {i}: {r:?}");
        } else {
            assert_eq!(number(r, "xdp_accepted"), 0);
        }
        if i == 0 && datapath_of(0) == "kernel" {
            // TC ingress counted the arrivals: every member's arrival at
            // each barrier but the one that completed it was folded there
            // and dropped, and the process was woken about once per
            // barrier (a notice), not once per member.
            let folded = number(r, "k_barrier_folded");
            let released = number(r, "k_barrier_released");
            assert!(released > 0 && released <= barriers, "rank 0: {r:?}");
            assert!(folded + released >= barriers * (members - 1), "rank 0: {r:?}");
            if !expect.faults {
                assert!(received <= barriers + 2 * HOSTS as u64, "rank 0 received {received}: {r:?}");
            }
        } else {
            // Rank 0 hears an arrival from each other rank per barrier; the
            // others hear one release per barrier.
            let least = if i == 0 { barriers * members } else { barriers };
            assert!(received >= least, "rank {i} received {received} < {least}");
        }
    }
}

#[test]
fn kernel_user_and_mixed_datapaths() {
    let cluster = Cluster::temporary_plain(HOSTS, 1500).unwrap();
    let kernel = |_| "kernel";
    let user = |_| "user";
    let mixed = |i: usize| if i.is_multiple_of(2) { "kernel" } else { "user" };
    let user_root = |i: usize| if i == 0 { "user" } else { "kernel" };
    assert_reports(&run(&cluster, 300, kernel), 300, PLAIN, kernel);
    assert_reports(&run(&cluster, 300, user), 300, PLAIN, user);
    assert_reports(&run(&cluster, 300, mixed), 300, PLAIN, mixed);
    assert_reports(&run(&cluster, 300, user_root), 300, PLAIN, user_root);
    drop(cluster);
    // The XDP hooks (a bridge whose ports run XDP): TC ingress, behind XDP,
    // counts the arrivals the same way.
    let cluster = Cluster::temporary(HOSTS).unwrap();
    assert_reports(&run(&cluster, 300, kernel), 300, XDP_BRIDGE, kernel);
    drop(cluster);
    assert!(aggbox_pins().iter().all(|p| !p.to_string_lossy().contains("abt")), "no pins left");
}

#[test]
fn faults_are_survived_on_both_datapaths() {
    let mut cluster = Cluster::temporary_plain(HOSTS, 1500).unwrap();
    cluster.inject_faults(FaultSpec::percent(10.0, 2.0)).unwrap();
    for datapath in ["kernel", "user"] {
        let before: u64 = cluster.fault_stats().unwrap().iter().map(|s| s.dropped).sum();
        let reports = run(&cluster, 200, |_| datapath);
        assert_reports(&reports, 200, Expect { faults: true, ..PLAIN }, |_| datapath);
        let dropped: u64 = cluster.fault_stats().unwrap().iter().map(|s| s.dropped).sum::<u64>() - before;
        let retransmits: u64 = reports.iter().map(|r| number(r, "retransmits")).sum();
        assert!(dropped > 0, "the fault program dropped frames");
        assert!(retransmits > 0, "{datapath}: the loss was seen and repaired (retransmits)");
        if datapath == "kernel" {
            // A lost release is asked for again, and TC answers it.
            assert!(number(&reports[0], "k_barrier_answered") > 0, "{:?}", reports[0]);
        }
    }
}
