//! The reduction collectives through the C ABI, in an 8-host virtual
//! cluster: `examples/c/allreduce.c` (built against include/aggbox.h and
//! libaggbox.so only) runs allreduce (f32 SUM, i64 MAX, f64 AVG), reduce,
//! reduce-scatter, allgather and iallreduce on 1, 1000 and 1048579 elements
//! on the user datapath and on a mixed group (even ranks kernel, odd ranks
//! user), checking every element against a plain loop over all the ranks'
//! inputs; the same program with mismatched counts fails on every rank, at
//! once; `examples/cpp/allreduce.cpp` does the same through the C++
//! wrapper. (The argument checks of the C ABI are unit tests in
//! ffi/src/comm/reduce.rs.)
//!
//! The tests run one at a time (they share two cores): each holds `serial()`.

use std::{
    collections::HashMap,
    process::{Command, Stdio},
    time::{Duration, Instant},
};

use aggbox_core::cluster::Cluster;
use aggbox_tests::{c_example, cpp_example, fields, mixed, number, serial, user, RankProcess};

const HOSTS: usize = 8;
const MASTER_PORT: u16 = 29_520;
/// Element counts: one, less than a chunk, and a large odd one (not a
/// multiple of the chunk, of the ranks or of a block).
const COUNTS: [&str; 3] = ["1", "1000", "1048579"];

/// Runs `program args` as every rank of the cluster, each host's datapath
/// from `datapath_of`, and returns each rank's exit code and lines.
fn run_all(
    cluster: &Cluster,
    program: &std::path::Path,
    port: u16,
    datapath_of: fn(usize) -> &'static str,
    args: &[&str],
) -> Vec<(i32, Vec<String>)> {
    let ranks: Vec<RankProcess> = (0..HOSTS)
        .map(|i| RankProcess::spawn(cluster, i, 0, port, i, HOSTS, datapath_of(i), program, args, &[]))
        .collect();
    ranks
        .into_iter()
        .map(|rank| rank.finish(Duration::from_secs(240)))
        .collect()
}

/// The `rank=` lines of a rank's output, parsed.
fn results(lines: &[String]) -> Vec<HashMap<String, String>> {
    lines
        .iter()
        .filter(|l| l.starts_with("rank="))
        .map(|l| fields(l))
        .collect()
}

#[test]
fn the_c_example_reduces_on_user_and_mixed_datapaths() {
    let _serial = serial();
    let cluster = Cluster::temporary_plain(HOSTS, 1500).unwrap();
    let program = c_example("allreduce");
    for (k, datapath_of) in [user as fn(usize) -> &'static str, mixed].into_iter().enumerate() {
        let start = Instant::now();
        let outcomes = run_all(&cluster, &program, MASTER_PORT + k as u16, datapath_of, &COUNTS);
        for (i, (code, lines)) in outcomes.iter().enumerate() {
            let what = format!("{} group, rank {i}", ["user", "mixed"][k]);
            assert_eq!(*code, 0, "{what}: {lines:?}");
            let results = results(lines);
            assert_eq!(results.len(), COUNTS.len(), "{what}: one line per size: {lines:?}");
            for (r, count) in results.iter().zip(COUNTS) {
                assert_eq!(number(r, "rank"), i as u64, "{what}");
                assert_eq!(number(r, "size"), HOSTS as u64, "{what}");
                assert_eq!(r["datapath"], datapath_of(i), "{what}");
                assert_eq!(r["count"], count, "{what}");
                assert_eq!(number(r, "checks"), 7, "{what}");
                assert_eq!(number(r, "errors"), 0, "{what}: {lines:?}");
                assert!(number(r, "iterations") >= 2, "{what}: {r:?}");
                assert!(r["us_per_allreduce"].parse::<f64>().unwrap() > 0.0, "{what}: {r:?}");
                number(r, "retransmits");
            }
        }
        eprintln!(
            "c_allreduce: {} group done in {:?}",
            ["user", "mixed"][k],
            start.elapsed()
        );
    }
}

/// Rank 0 reduces 1000 elements, the others 1001: every rank fails with
/// "mismatched collective calls" (AGGBOX_ERR_INVALID_ARGUMENT), long before
/// the timeout, and exits with 1.
#[test]
fn the_c_example_fails_every_rank_on_mismatched_counts() {
    let _serial = serial();
    let cluster = Cluster::temporary_plain(HOSTS, 1500).unwrap();
    let program = c_example("allreduce");
    let start = Instant::now();
    let children: Vec<_> = (0..HOSTS)
        .map(|i| {
            cluster
                .command(i, &program)
                .arg(if i == 0 { "1000" } else { "1001" })
                .env("RANK", i.to_string())
                .env("WORLD_SIZE", HOSTS.to_string())
                .env("MASTER_ADDR", cluster.host(0).ipv4.to_string())
                .env("MASTER_PORT", (MASTER_PORT + 2).to_string())
                .env("AGGBOX_DATAPATH", "user")
                .env("AGGBOX_TIMEOUT_MS", "10000")
                .stdout(Stdio::piped())
                .stderr(Stdio::piped())
                .spawn()
                .expect("spawn a rank")
        })
        .collect();
    for (i, child) in children.into_iter().enumerate() {
        let output = child.wait_with_output().unwrap();
        let stderr = String::from_utf8_lossy(&output.stderr);
        assert_eq!(output.status.code(), Some(1), "rank {i}: {stderr}");
        assert!(
            stderr.contains("allreduce: error (invalid argument): aggbox_allreduce: "),
            "rank {i}: {stderr}"
        );
        assert!(stderr.contains("mismatched collective calls"), "rank {i}: {stderr}");
        assert!(output.stdout.is_empty(), "rank {i}: no size completed");
    }
    assert!(
        start.elapsed() < Duration::from_secs(8),
        "every rank failed at once, not by timeout"
    );
}

/// The C example refuses a size that is not a number, before joining.
#[test]
fn the_c_example_rejects_a_bad_size() {
    let output = Command::new(c_example("allreduce")).arg("12x").output().unwrap();
    assert_eq!(output.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&output.stderr).contains("12x is not a size"));
}

#[test]
fn the_cpp_example_reduces_through_the_wrapper() {
    let _serial = serial();
    let cluster = Cluster::temporary_plain(HOSTS, 1500).unwrap();
    let program = cpp_example("allreduce");
    let counts = ["0", "1000", "100003"];
    let outcomes = run_all(&cluster, &program, MASTER_PORT + 3, user, &counts);
    for (i, (code, lines)) in outcomes.iter().enumerate() {
        assert_eq!(*code, 0, "rank {i}: {lines:?}");
        let results = results(lines);
        assert_eq!(results.len(), counts.len(), "rank {i}: {lines:?}");
        for (r, count) in results.iter().zip(counts) {
            assert_eq!(number(r, "rank"), i as u64);
            assert_eq!(number(r, "size"), HOSTS as u64);
            assert_eq!(r["count"], count);
            assert_eq!(number(r, "checks"), 6);
            assert_eq!(number(r, "errors"), 0, "rank {i}: {lines:?}");
        }
    }
    let _ = std::fs::remove_file(program);
}
