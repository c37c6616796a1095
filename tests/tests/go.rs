//! The Go examples (examples/go, built with `go build` against a staged
//! install of this build's libaggbox and its aggbox.pc) in a 4-host virtual
//! cluster on both datapaths: paramavg's parameters against the same
//! training in a plain loop here, wordcount's counts against a count of
//! the same files here. (The binding's own tests are `go test` runs in
//! scripts/test-go.sh.)
//!
//! The tests run one at a time (they share two cores): each holds `serial()`.

use std::{
    collections::HashMap,
    path::{Path, PathBuf},
    process::Command,
    sync::OnceLock,
    time::Duration,
};

use aggbox_core::cluster::Cluster;
use aggbox_tests::{fields, kernel, license_texts, serial, target_dir, user, workspace, RankProcess};

const HOSTS: usize = 4;
const MASTER_PORT: u16 = 29_540;

/// The staged prefix and the examples built against it, once.
fn built() -> &'static (PathBuf, PathBuf) {
    static BUILT: OnceLock<(PathBuf, PathBuf)> = OnceLock::new();
    BUILT.get_or_init(|| {
        let tmp = Path::new(env!("CARGO_TARGET_TMPDIR")).join("aggbox-go");
        let prefix = tmp.join("prefix");
        let bin = tmp.join("bin");
        let status = Command::new("bash")
            .arg(workspace().join("scripts/install.sh"))
            .env("PREFIX", &prefix)
            .env("NO_BUILD", "1")
            .env("FROM", target_dir())
            .env("LDCONFIG", "true")
            .stdout(std::process::Stdio::null())
            .status()
            .expect("scripts/install.sh");
        assert!(status.success(), "staging the library failed");
        let path = format!("{}:/usr/local/go/bin", std::env::var("PATH").unwrap_or_default());
        let output = Command::new("go")
            .args(["build", "-o"])
            .arg(format!("{}/", bin.display()))
            .arg("./...")
            .current_dir(workspace().join("examples/go"))
            .env("PATH", path)
            .env("PKG_CONFIG_PATH", prefix.join("lib/pkgconfig"))
            .env("GOFLAGS", "-buildvcs=false")
            .output()
            .expect("go (Go 1.24 or later) is required: scripts/setup.sh");
        assert!(output.status.success(), "go build failed: {}", String::from_utf8_lossy(&output.stderr));
        (prefix.join("lib"), bin)
    })
}

/// Runs example `name` with `args` on every host, each rank's datapath from
/// `datapath_of`; returns each rank's exit code and lines.
fn run_all(cluster: &Cluster, name: &str, port: u16, datapath_of: fn(usize) -> &'static str, args: &[&str]) -> Vec<(i32, Vec<String>)> {
    let (lib, bin) = built();
    let lib = lib.display().to_string();
    let ranks: Vec<RankProcess> = (0..HOSTS)
        .map(|i| RankProcess::spawn(cluster, i, 0, port, i, HOSTS, datapath_of(i), &bin.join(name), args, &[("LD_LIBRARY_PATH", &lib)]))
        .collect();
    ranks.into_iter().map(|r| r.finish(Duration::from_secs(180))).collect()
}

/// paramavg's training as a plain loop over every rank's copy, in f64.
fn paramavg_reference(n: usize, params: usize, steps: usize, sync: usize, lr: f64) -> Vec<f64> {
    let grad = |r: usize, t: usize, i: usize| (((r + 1) * (i % 7 + 1) * (t + 1)) % 13) as f64 - 6.0;
    let mut p: Vec<Vec<f64>> = vec![(0..params).map(|i| (i % 100) as f64 / 4.0).collect(); n];
    for t in 0..steps {
        for (r, copy) in p.iter_mut().enumerate() {
            for (i, x) in copy.iter_mut().enumerate() {
                *x -= lr * grad(r, t, i);
            }
        }
        if (t + 1) % sync == 0 || t == steps - 1 {
            for i in 0..params {
                let avg = p.iter().map(|c| c[i]).sum::<f64>() / n as f64;
                for copy in p.iter_mut() {
                    copy[i] = avg;
                }
            }
        }
    }
    p.swap_remove(0)
}

#[test]
fn the_go_parameter_averaging_worker_matches_a_loop_on_both_datapaths() {
    let _serial = serial();
    let cluster = Cluster::temporary(HOSTS).unwrap();
    let (params, steps, sync) = (50_001, 12, 4);
    let want = paramavg_reference(HOSTS, params, steps, sync, 0.125);
    let sum: f64 = want.iter().sum();
    for (k, datapath_of) in [user as fn(usize) -> &'static str, kernel].into_iter().enumerate() {
        let args = ["-params", "50001", "-steps", "12", "-sync", "4"];
        let outcomes = run_all(&cluster, "paramavg", MASTER_PORT + k as u16, datapath_of, &args);
        let mut first: Option<HashMap<String, String>> = None;
        for (i, (code, lines)) in outcomes.iter().enumerate() {
            let what = format!("{} datapath, rank {i}", datapath_of(i));
            assert_eq!(*code, 0, "{what}: {lines:?}");
            let line = lines.iter().find(|l| l.starts_with("rank=")).unwrap_or_else(|| panic!("{what}: {lines:?}"));
            let f = fields(line);
            assert_eq!(f["rank"], i.to_string(), "{what}");
            assert_eq!(f["datapath"], datapath_of(i), "{what}");
            assert_eq!(f["syncs"], "3", "{what}");
            let got = |key: &str| f[key].parse::<f64>().unwrap();
            // f32 parameters, quantized averages: close to the f64 loop.
            assert!((got("sum") - sum).abs() <= 1e-4 * sum.abs().max(1.0), "{what}: sum {} vs {sum}", got("sum"));
            assert!((got("p0") - want[0]).abs() <= 1e-3, "{what}: p0 {} vs {}", got("p0"), want[0]);
            assert!((got("plast") - want[params - 1]).abs() <= 1e-3, "{what}: plast {} vs {}", got("plast"), want[params - 1]);
            // Every rank has the same parameters, bit for bit.
            let first = first.get_or_insert_with(|| f.clone());
            for key in ["sum", "p0", "plast"] {
                assert_eq!(f[key], first[key], "{what}: {key}");
            }
        }
    }
}

#[test]
fn the_go_word_count_matches_a_count_here() {
    let _serial = serial();
    let cluster = Cluster::temporary(HOSTS).unwrap();
    let files = license_texts();
    assert!(!files.is_empty(), "no text files to count");
    let files: Vec<String> = files.iter().take(40).map(|p| p.display().to_string()).collect();
    let mut want: HashMap<String, i64> = HashMap::new();
    for file in &files {
        let text = std::fs::read(file).unwrap();
        for word in text.split(|b| !b.is_ascii_alphanumeric()).filter(|w| !w.is_empty() && w.len() <= 64) {
            *want.entry(String::from_utf8(word.to_ascii_lowercase()).unwrap()).or_default() += 1;
        }
    }
    let mut args = vec!["-all"];
    args.extend(files.iter().map(String::as_str));
    for (k, datapath_of) in [kernel as fn(usize) -> &'static str, user].into_iter().enumerate() {
        let outcomes = run_all(&cluster, "wordcount", MASTER_PORT + 2 + k as u16, datapath_of, &args);
        let mut got: HashMap<String, i64> = HashMap::new();
        for (i, (code, lines)) in outcomes.iter().enumerate() {
            assert_eq!(*code, 0, "rank {i}: {lines:?}");
            for line in lines.iter().filter(|l| l.starts_with("pair ")) {
                let mut parts = line.split(' ').skip(1);
                let (word, count) = (parts.next().unwrap(), parts.next().unwrap().parse().unwrap());
                assert!(got.insert(word.to_string(), count).is_none(), "{word} owned twice");
            }
        }
        assert_eq!(got.len(), want.len(), "{} datapath: distinct words", datapath_of(0));
        for (word, count) in &want {
            assert_eq!(got.get(word), Some(count), "{} datapath: {word}", datapath_of(0));
        }
    }
}
