//! `examples/cpp/train.cpp` (data-parallel softmax regression, gradients
//! averaged by one f32 AVG allreduce per step through the C++ wrapper) on a
//! 4-host virtual cluster, kernel and user datapaths, 100 K parameters, 20
//! steps: every rank ends with the same weights, bit for bit (every rank
//! gets the same bits of a quantized sum, on either datapath), and those
//! weights are within a bound, computed below from docs/ALLREDUCE.md's
//! error of edge quantization, of the weights `--single` gets training over
//! the same four shards in one process with plain float sums. The weight
//! vectors themselves are compared (the program writes them), not only
//! their hashes.
//!
//! # The bound
//!
//! Both runs take 20 steps `w <- w - lr G` from w = 0 on the same batches;
//! they differ only in G, the mean of the four shards' f32 gradients.
//! Write `T(w) = w - lr grad f(w)` for the exact step on a batch's mean
//! loss f. f is convex and its gradient 1/2-Lipschitz (every sample has
//! |x| = 1, and the softmax's Jacobian has norm <= 1/2:
//! examples/cpp/train_model.hpp), so for lr <= 4, T never moves two weight
//! vectors apart: |T(u) - T(v)| <= |u - v| (2-norm; Baillon-Haddad). Each
//! run's step is T(w) - lr e + r, with e = G - grad f(w) the error of its
//! gradient and r the rounding of the double update, so after every step
//!
//!   |w_dist - w_single| <= sum over steps of lr (|e_dist| + |e_single|) + |r_dist| + |r_single|,
//!
//! and a vector of P elements, each at most b, has |.| <= sqrt(P) b. Per
//! element, with 2^E the scale of the step (the least power of two >= the
//! largest |f32 gradient| any rank sent, which the ranks print as gmax; B
//! = 22 fractional bits, `quant::F32_BITS`):
//!
//! - distributed, AggBox's AVG (docs/ALLREDUCE.md, "Quantized sums"): each
//!   rank's q is off by <= 1/2, so the mean is off by <= 2^(E-B-1); the
//!   f64 divide by N adds <= 2^(E-52), the rounding to f32 <= 2^(E-24);
//! - single: the double sum of the four f32 gradients and its divide by N
//!   add <= (N+1) 2^(E-53), its rounding to f32 <= 2^(E-24);
//! - both: each shard's gradient rounded to f32 is off by <= 2^(E-24);
//!   f32 rounding near zero adds <= 2^-149; the double computation of the
//!   gradient is off by less than (32 W + 3 + 0.18 batch) 2^-53 (first
//!   order: 32-term scores with |x_j| = 1/sqrt(32), softmax, batch sums of
//!   (p - y) x_j / batch) for weights below W, and W = lr sum 2^(E+1)
//!   bounds every weight (|G| < 2^(E+1));
//! - the update's two double roundings: <= 2^-53 (lr 2^(E+1) + W).
//!
//! The tests run one at a time (they share two cores): each holds
//! `serial()`.

use std::{
    os::unix::fs::MetadataExt,
    path::{Path, PathBuf},
    process::Command,
    time::{Duration, Instant},
};

use aggbox_core::{
    cluster::{self, Cluster, ClusterSpec},
    quant::{scale_exponent, F32_BITS},
};
use aggbox_tests::{cpp_example, fields, serial, RankProcess};

const HOSTS: usize = 4;
const PARAMS: usize = 100_000;
const STEPS: usize = 20;
const BATCH: usize = 64;
const LR: f64 = 2.0;
const MASTER_PORT: u16 = 29_661;
/// Cluster prefixes of this test: `trt<pid>`.
const PREFIX: &str = "trt";

/// What this test made, removed when it ends, also when it fails: the
/// program and the weight files, AggBox's pins of the cluster's hosts (left
/// if a rank was killed), then the cluster.
struct Scratch {
    dir: PathBuf,
    program: PathBuf,
    /// Inodes of the hosts' network namespaces, which name their pins.
    netns: Vec<u64>,
    cluster: Cluster,
}

impl Scratch {
    fn new() -> Scratch {
        sweep_dead_clusters();
        let cluster = Cluster::up(ClusterSpec::new(format!("{PREFIX}{}", std::process::id()), HOSTS).with_plain(true)).unwrap();
        let netns = cluster
            .hosts()
            .iter()
            .map(|h| std::fs::metadata(format!("/run/netns/{}", h.netns)).map(|m| m.ino()).unwrap_or(0))
            .collect();
        let dir = std::env::temp_dir().join(format!("aggbox-train-test-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        Scratch { dir, program: cpp_example("train"), netns, cluster }
    }

    fn weights_file(&self, what: &str) -> PathBuf {
        self.dir.join(format!("{what}.f64"))
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.dir);
        let _ = std::fs::remove_file(&self.program);
        for pin in aggbox_tests::aggbox_pins() {
            let name = pin.file_name().map(|n| n.to_string_lossy().to_string()).unwrap_or_default();
            if self.netns.iter().any(|ino| *ino != 0 && name.starts_with(&format!("{ino}-"))) {
                let _ = std::fs::remove_dir_all(&pin);
            }
        }
        // Then `cluster` drops, which removes the namespaces.
    }
}

/// Removes the clusters of this test whose process is gone (killed before
/// it could clean up).
fn sweep_dead_clusters() {
    let Ok(entries) = std::fs::read_dir("/run/netns") else { return };
    for entry in entries.flatten() {
        let name = entry.file_name().to_string_lossy().to_string();
        let Some((prefix, _)) = name.split_once('-') else { continue };
        let Some(pid) = prefix.strip_prefix(PREFIX).and_then(|p| p.parse::<i32>().ok()) else { continue };
        if !Path::new(&format!("/proc/{pid}")).exists() {
            let _ = cluster::down(prefix);
        }
    }
}

/// The arguments of every run.
fn args(weights: &Path) -> Vec<String> {
    let mut args: Vec<String> = ["--params", &PARAMS.to_string(), "--steps", &STEPS.to_string()]
        .iter()
        .map(|s| s.to_string())
        .collect();
    args.extend(["--batch".into(), BATCH.to_string(), "--lr".into(), LR.to_string(), "--seed".into(), "7".into()]);
    args.extend(["--weights".into(), weights.display().to_string()]);
    args
}

/// One run's report: gmax per step, the loss of the first and last step,
/// the printed hash.
struct Report {
    gmax: Vec<f64>,
    losses: Vec<f64>,
    hash: String,
}

fn report(lines: &[String], what: &str) -> Report {
    let steps: Vec<_> = lines.iter().filter(|l| l.starts_with("step=")).map(|l| fields(l)).collect();
    assert_eq!(steps.len(), STEPS, "{what}: one line per step: {lines:?}");
    for (t, s) in steps.iter().enumerate() {
        assert_eq!(s["step"], t.to_string(), "{what}");
    }
    // gmax is printed with 9 significant digits: the f32 exactly.
    let gmax = steps.iter().map(|s| s["gmax"].parse::<f32>().unwrap() as f64).collect();
    let losses = steps.iter().map(|s| s["loss"].parse::<f64>().unwrap()).collect();
    let done = lines.iter().find(|l| l.starts_with("done ")).unwrap_or_else(|| panic!("{what}: {lines:?}"));
    Report { gmax, losses, hash: fields(done)["weights_fnv1a"].clone() }
}

fn read_weights(path: &Path) -> Vec<f64> {
    let bytes = std::fs::read(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    assert_eq!(bytes.len(), PARAMS * 8, "{}", path.display());
    bytes.chunks_exact(8).map(|b| f64::from_ne_bytes(b.try_into().unwrap())).collect()
}

fn fnv1a(bytes: &[u8]) -> String {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for b in bytes {
        h = (h ^ u64::from(*b)).wrapping_mul(0x100_0000_01b3);
    }
    format!("0x{h:016x}")
}

/// The bound of the module's docs on |w_dist - w_single| (2-norm), from the
/// largest |f32 gradient| of each step: any rank's (`dist`) and any
/// shard's in the single run.
fn bound(dist: &[f64], single: &[f64]) -> f64 {
    let p2 = |e: i32| 2f64.powi(e);
    let n = HOSTS as f64;
    let scales: Vec<(i32, i32)> = dist.iter().zip(single).map(|(d, s)| (scale_exponent(*d), scale_exponent(*s))).collect();
    let w_max: f64 = scales.iter().map(|(d, s)| LR * p2(*d.max(s) + 1)).sum();
    assert!(w_max <= 100.0, "the double-evaluation term assumes weights below 100, not {w_max}");
    let eval = (32.0 * w_max + 3.0 + 0.18 * BATCH as f64) * p2(-53);
    let tiny = 2.0 * p2(-149);
    let mut total = 0.0;
    for &(ed, es) in &scales {
        let b = F32_BITS;
        let shard_f32 = p2(-24);
        let dist_err = p2(ed) * (p2(-b - 1) + p2(-52) + p2(-24) + shard_f32) + tiny + eval;
        let single_err = p2(es) * ((n + 1.0) * p2(-53) + p2(-24) + shard_f32) + tiny + eval;
        let update = 2.0 * p2(-53) * (LR * p2(ed.max(es) + 1) + w_max);
        total += (PARAMS as f64).sqrt() * (LR * (dist_err + single_err) + update);
    }
    total
}

fn norm(v: impl Iterator<Item = f64>) -> f64 {
    v.map(|x| x * x).sum::<f64>().sqrt()
}

#[test]
fn every_rank_trains_the_single_process_weights_within_the_quantization_bound() {
    let _serial = serial();
    // The step never moves two weight vectors apart only below 2/L, L = 1/2 (1 + 2^-50).
    assert!(LR <= 4.0 / (1.0 + 2f64.powi(-50)));
    let started = Instant::now();
    let scratch = Scratch::new();

    let single_file = scratch.weights_file("single");
    let out = Command::new(&scratch.program)
        .args(args(&single_file))
        .args(["--single", "--ranks", &HOSTS.to_string()])
        .output()
        .unwrap();
    let single_lines: Vec<String> = String::from_utf8_lossy(&out.stdout).lines().map(String::from).collect();
    assert!(out.status.success(), "--single: {}", String::from_utf8_lossy(&out.stderr));
    let single = report(&single_lines, "--single");
    let w_single = read_weights(&single_file);
    assert_eq!(fnv1a(&std::fs::read(&single_file).unwrap()), single.hash, "--single's hash is of what it wrote");
    assert!(
        single.losses[STEPS - 1] < single.losses[0] - 0.05,
        "the model learns: loss {} -> {}",
        single.losses[0],
        single.losses[STEPS - 1]
    );

    let mut bits: Vec<(String, Vec<u8>)> = Vec::new();
    for (k, datapath) in ["kernel", "user"].into_iter().enumerate() {
        let files: Vec<PathBuf> = (0..HOSTS).map(|r| scratch.weights_file(&format!("{datapath}-{r}"))).collect();
        let ranks: Vec<RankProcess> = (0..HOSTS)
            .map(|r| {
                let args = args(&files[r]);
                let args: Vec<&str> = args.iter().map(String::as_str).collect();
                RankProcess::spawn(&scratch.cluster, r, 0, MASTER_PORT + k as u16, r, HOSTS, datapath, &scratch.program, &args, &[])
            })
            .collect();
        let outcomes: Vec<(i32, Vec<String>)> = ranks.into_iter().map(|r| r.finish(Duration::from_secs(60))).collect();
        let mut gmax = vec![0.0f64; STEPS];
        for (r, (code, lines)) in outcomes.iter().enumerate() {
            let what = format!("{datapath} datapath, rank {r}");
            assert_eq!(*code, 0, "{what}: {lines:?}");
            let header = fields(lines.first().unwrap_or_else(|| panic!("{what}: no output")));
            assert_eq!(header["datapath"], datapath, "{what}");
            assert_eq!(header["params"], PARAMS.to_string(), "{what}");
            let rep = report(lines, &what);
            for (g, mine) in gmax.iter_mut().zip(&rep.gmax) {
                *g = g.max(*mine);
            }
            let bytes = std::fs::read(&files[r]).unwrap();
            assert_eq!(fnv1a(&bytes), rep.hash, "{what}: its hash is of what it wrote");
            bits.push((what, bytes));
        }
        let limit = bound(&gmax, &single.gmax);
        for (r, file) in files.iter().enumerate() {
            let w = read_weights(file);
            let diff = norm(w.iter().zip(&w_single).map(|(a, b)| a - b));
            let largest = w.iter().zip(&w_single).map(|(a, b)| (a - b).abs()).fold(0.0, f64::max);
            assert!(
                diff <= limit,
                "{datapath} datapath, rank {r}: |w - w_single| = {diff:e} (largest element {largest:e}) is beyond the bound {limit:e}"
            );
            if r == 0 {
                eprintln!(
                    "train: {datapath}: |w - w_single| = {diff:.3e} (largest element {largest:.3e}), bound {limit:.3e}, |w_single| = {:.3}",
                    norm(w_single.iter().copied())
                );
            }
        }
        // The bound means something: far below the weights themselves.
        assert!(limit < 1e-3 * norm(w_single.iter().copied()), "bound {limit:e}");
    }
    // Every rank of both datapaths holds the same bits: the same integer
    // sums, turned back the same way.
    for (what, b) in &bits[1..] {
        assert!(b == &bits[0].1, "{what}'s weights differ from {}'s", bits[0].0);
    }
    eprintln!("train: done in {:?}", started.elapsed());
}
