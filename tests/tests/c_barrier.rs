//! The acceptance run: an 8-host virtual cluster runs
//! `aggbox_barrier` 1000 times from a C program (examples/c/barrier.c, built
//! against include/aggbox.h and libaggbox.so only) on each datapath, and
//! again with 10% of the frames delivered to every host dropped and 2%
//! duplicated.

use std::time::Duration;

use aggbox_core::{cluster::Cluster, fault::FaultSpec};
use aggbox_tests::{c_example, fields, number, RankProcess};

const HOSTS: usize = 8;
const BARRIERS: u64 = 1000;

fn run_c(cluster: &Cluster, datapath: &str, master_port: u16) -> Vec<std::collections::HashMap<String, String>> {
    let program = c_example("barrier");
    let ranks: Vec<RankProcess> = (0..HOSTS)
        .map(|i| {
            RankProcess::spawn(cluster, i, 0, master_port, i, HOSTS, datapath, &program, &[&BARRIERS.to_string()], &[])
        })
        .collect();
    ranks
        .into_iter()
        .enumerate()
        .map(|(i, rank)| {
            let (code, lines) = rank.finish(Duration::from_secs(300));
            assert_eq!(code, 0, "rank {i} ({datapath}) failed: {lines:?}");
            let line = lines.iter().find(|l| l.starts_with("rank=")).expect("result line");
            let report = fields(line);
            assert_eq!(number(&report, "rank"), i as u64);
            assert_eq!(number(&report, "size"), HOSTS as u64);
            assert_eq!(report["datapath"], datapath, "{line}");
            assert_eq!(number(&report, "barriers"), BARRIERS, "{line}");
            report
        })
        .collect()
}

#[test]
fn c_program_runs_1000_barriers_on_each_datapath() {
    let cluster = Cluster::temporary(HOSTS).unwrap();
    for (k, datapath) in ["kernel", "user"].into_iter().enumerate() {
        run_c(&cluster, datapath, 29_500 + k as u16);
    }
}

#[test]
fn c_program_runs_1000_barriers_with_loss_and_duplication() {
    let mut cluster = Cluster::temporary(HOSTS).unwrap();
    cluster.inject_faults(FaultSpec::percent(10.0, 2.0)).unwrap();
    for (k, datapath) in ["kernel", "user"].into_iter().enumerate() {
        let before = cluster.fault_stats().unwrap();
        run_c(&cluster, datapath, 29_500 + k as u16);
        let after = cluster.fault_stats().unwrap();
        let dropped: u64 = after.iter().zip(&before).map(|(a, b)| a.dropped - b.dropped).sum();
        let duplicated: u64 = after.iter().zip(&before).map(|(a, b)| a.duplicated - b.duplicated).sum();
        let seen: u64 = after.iter().zip(&before).map(|(a, b)| a.seen - b.seen).sum();
        // Loosely: about 10% and 2% of what was seen (the exact accounting of
        // the fault program is tested in core's cluster tests).
        assert!(dropped * 100 > seen * 6 && dropped * 100 < seen * 14, "{datapath}: dropped {dropped} of {seen}");
        assert!(duplicated > 0, "{datapath}: duplicated {duplicated} of {seen}");
    }
}
