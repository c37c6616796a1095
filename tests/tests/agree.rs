//! Approximate agreement that survives crashes and restarts, through the C
//! ABI (`examples/c/agree.c`), in a 7-host virtual cluster with 20% of the
//! frames dropped and others duplicated and reordered by injected faults, on
//! a plain bridge (the kernel datapath on the TC hooks).
//!
//! Each seeded run draws the ranks' inputs in [0, 1e6], kills up to f ranks
//! with SIGKILL forever at random moments, and kills other ranks and starts
//! them again (same rank, address and store) one to three times. Every rank
//! that finishes must return a value within the inputs' range and within ε
//! of every other returned value; every rank that is not killed forever must
//! finish. 5 ranks with f = 2 and 7 with f = 3, 50 seeded runs of each on
//! the user and on the kernel datapath (`AGGBOX_AGREE_SEEDS` sets another
//! number), and a few on a mixed group. The rendezvous store is an external
//! [`Store`] run by the test, as a restarted rank needs.
//!
//! Stores that are truncated, corrupted or of another group are refused;
//! configurations outside the bound, ε ≤ 0 and NaN inputs are refused.
//!
//! The tests run one at a time (they share two cores): each holds `serial()`.

use std::{
    io::{BufRead, BufReader},
    net::TcpListener,
    path::{Path, PathBuf},
    process::{Child, Stdio},
    sync::mpsc,
    time::{Duration, Instant},
};

use aggbox_core::{cluster::Cluster, fault::FaultSpec, rendezvous::Store};
use aggbox_tests::{c_example, fields, kernel, mixed, number, serial, splitmix, user};

const HOSTS: usize = 7;
/// Every rank's UDP port: fixed, so a restarted rank comes back at the same
/// address.
const RANK_PORT: u16 = 47_400;
const EPSILON: f64 = 1e-6;
const LO: f64 = 0.0;
const HI: f64 = 1e6;
/// How long a decided rank keeps answering the others (ms).
const LINGER_MS: u64 = 1_000;

type DatapathOf = fn(usize) -> &'static str;

/// A seeded generator (splitmix64 steps).
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(1);
        splitmix(self.0)
    }
    fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }
    fn unit(&mut self) -> f64 {
        (self.next() >> 11) as f64 / (1u64 << 53) as f64
    }
}

/// One incarnation of a rank: its process and the lines it printed.
struct Incarnation {
    child: Child,
    lines: mpsc::Receiver<String>,
    seen: Vec<String>,
}

impl Incarnation {
    fn start(cluster: &Cluster, store: &Store, rank: usize, n: usize, f: usize, datapath: &str, input: f64, path: &Path) -> Incarnation {
        let program = c_example("agree");
        let mut command = cluster.command(rank, &program);
        command
            .args([
                format!("{input:.17e}"),
                path.display().to_string(),
                f.to_string(),
                EPSILON.to_string(),
                LO.to_string(),
                HI.to_string(),
                LINGER_MS.to_string(),
            ])
            .env("RANK", rank.to_string())
            .env("WORLD_SIZE", n.to_string())
            .env("MASTER_ADDR", store.addr().ip().to_string())
            .env("MASTER_PORT", store.addr().port().to_string())
            .env("AGGBOX_STORE", "external")
            .env("AGGBOX_PORT", RANK_PORT.to_string())
            .env("AGGBOX_DATAPATH", datapath)
            .env("AGGBOX_TIMEOUT_MS", "10000")
            .stdin(Stdio::null())
            .stdout(Stdio::piped());
        let mut child = command.spawn().expect("spawn a rank");
        let stdout = BufReader::new(child.stdout.take().unwrap());
        let (tx, lines) = mpsc::channel();
        std::thread::spawn(move || {
            for line in stdout.lines().map_while(Result::ok) {
                if tx.send(line).is_err() {
                    break;
                }
            }
        });
        Incarnation { child, lines, seen: Vec::new() }
    }

    fn drain(&mut self) {
        while let Ok(line) = self.lines.try_recv() {
            self.seen.push(line);
        }
    }

    fn has(&mut self, prefix: &str) -> bool {
        self.drain();
        self.seen.iter().any(|l| l.starts_with(prefix))
    }

    /// Whether it exited (and how).
    fn exited(&mut self) -> Option<i32> {
        self.child.try_wait().unwrap().map(|s| s.code().unwrap_or(-1))
    }

    fn kill(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        self.drain();
    }
}

impl Drop for Incarnation {
    fn drop(&mut self) {
        if self.child.try_wait().ok().flatten().is_none() {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
    }
}

/// What one run saw of each rank.
#[derive(Default)]
struct Outcome {
    /// Values returned (a rank may return, be killed before it exits, and
    /// return again after a restart).
    values: Vec<(usize, f64)>,
    /// Report lines of the ranks that finished.
    reports: Vec<String>,
    /// Kills and restarts done.
    kills: usize,
    restarts: usize,
}

/// A planned kill: rank, when (after the start), and when it comes back
/// (None: never).
struct Kill {
    rank: usize,
    at: Duration,
    back: Option<Duration>,
}

/// Draws the run's kills: up to f ranks forever, one or two others one to
/// three times each.
fn plan(rng: &mut Rng, n: usize, f: usize) -> (Vec<Kill>, Vec<bool>) {
    let mut order: Vec<usize> = (0..n).collect();
    for i in (1..n).rev() {
        order.swap(i, rng.below(i as u64 + 1) as usize);
    }
    let forever_count = rng.below(f as u64 + 1) as usize;
    let mut forever = vec![false; n];
    let mut kills = Vec::new();
    for &rank in &order[..forever_count] {
        forever[rank] = true;
        kills.push(Kill { rank, at: Duration::from_millis(rng.below(150)), back: None });
    }
    // Restarts end within about 600 ms of the start, well inside the
    // survivors' linger (LINGER_MS after they decide), so a restarted rank
    // always finds a rank that answers it.
    let restarted = 1 + rng.below(2) as usize;
    for &rank in &order[forever_count..forever_count + restarted] {
        let mut at = Duration::from_millis(rng.below(100));
        for _ in 0..1 + rng.below(3) {
            let down = Duration::from_millis(10 + rng.below(90));
            kills.push(Kill { rank, at, back: Some(at + down) });
            at += down + Duration::from_millis(20 + rng.below(80));
        }
    }
    (kills, forever)
}

/// One seeded run of `n` ranks tolerating `f`.
fn run(cluster: &Cluster, dir: &Path, n: usize, f: usize, datapath_of: DatapathOf, seed: u64) -> Outcome {
    let mut rng = Rng(seed.wrapping_mul(0x9E37_79B9_7F4A_7C15));
    let inputs: Vec<f64> = (0..n)
        .map(|_| match rng.below(8) {
            0 => LO,
            1 => HI,
            _ => LO + rng.unit() * (HI - LO),
        })
        .collect();
    let (kills, forever) = plan(&mut rng, n, f);
    let run_dir = dir.join(format!("seed{seed}-n{n}"));
    std::fs::create_dir_all(&run_dir).unwrap();
    let paths: Vec<PathBuf> = (0..n).map(|r| run_dir.join(format!("rank{r}.store"))).collect();
    let listener = cluster.run_in(0, || TcpListener::bind((cluster.host(0).ipv4, 0))).unwrap().unwrap();
    let store = Store::serve(listener, n).unwrap();
    let start_rank = |rank: usize| Incarnation::start(cluster, &store, rank, n, f, datapath_of(rank), inputs[rank], &paths[rank]);

    let mut ranks: Vec<Option<Incarnation>> = (0..n).map(|r| Some(start_rank(r))).collect();
    // Kills begin once every rank joined the group.
    let joined_by = Instant::now() + Duration::from_secs(60);
    for (rank, inc) in ranks.iter_mut().enumerate() {
        let inc = inc.as_mut().unwrap();
        while !inc.has("joined") {
            assert!(Instant::now() < joined_by, "seed {seed}: rank {rank} did not join: {:?}", inc.seen);
            if let Some(code) = inc.exited() {
                inc.drain();
                panic!("seed {seed}: rank {rank} exited with {code} before joining: {:?}", inc.seen);
            }
            std::thread::sleep(Duration::from_millis(2));
        }
    }
    let mut outcome = Outcome::default();
    let start = Instant::now();
    let mut events: Vec<(Duration, usize, bool)> = Vec::new(); // (when, rank, start?)
    for kill in &kills {
        events.push((kill.at, kill.rank, false));
        if let Some(back) = kill.back {
            events.push((back, kill.rank, true));
        }
    }
    events.sort_by_key(|e| (e.0, e.2));
    let collect = |inc: &mut Incarnation, rank: usize, outcome: &mut Outcome| {
        inc.drain();
        for line in inc.seen.drain(..) {
            if line.starts_with("rank=") {
                let value: f64 = fields(&line)["value"].parse().unwrap();
                outcome.values.push((rank, value));
                outcome.reports.push(line);
            }
        }
    };
    for (at, rank, starting) in events {
        if let Some(wait) = at.checked_sub(start.elapsed()) {
            std::thread::sleep(wait);
        }
        if starting {
            // Started again only if the kill found it running.
            if ranks[rank].is_none() {
                ranks[rank] = Some(start_rank(rank));
                outcome.restarts += 1;
            }
        } else if let Some(mut inc) = ranks[rank].take() {
            if inc.exited().is_none() {
                inc.kill();
                outcome.kills += 1;
                collect(&mut inc, rank, &mut outcome);
            } else {
                collect(&mut inc, rank, &mut outcome);
                ranks[rank] = Some(inc); // finished before the kill: left alone
            }
        }
    }
    // Every rank not killed forever finishes.
    let deadline = Instant::now() + Duration::from_secs(60);
    for rank in 0..n {
        if forever[rank] {
            continue;
        }
        let inc = ranks[rank].as_mut().unwrap_or_else(|| panic!("seed {seed}: rank {rank} is down at the end"));
        let code = loop {
            if let Some(code) = inc.exited() {
                break code;
            }
            assert!(Instant::now() < deadline, "seed {seed}: rank {rank} did not finish");
            std::thread::sleep(Duration::from_millis(5));
        };
        // The reader thread may still hold the last lines.
        std::thread::sleep(Duration::from_millis(5));
        inc.drain();
        assert_eq!(code, 0, "seed {seed} n {n}: rank {rank} ({}) failed: {:?}", datapath_of(rank), inc.seen);
        let mut inc = ranks[rank].take().unwrap();
        collect(&mut inc, rank, &mut outcome);
        assert!(outcome.values.iter().any(|&(r, _)| r == rank), "seed {seed}: rank {rank} printed no value");
    }
    // Validity and ε-agreement, against the inputs.
    let (min, max) = inputs.iter().fold((f64::INFINITY, f64::NEG_INFINITY), |(a, b), &x| (a.min(x), b.max(x)));
    for &(rank, value) in &outcome.values {
        assert!(value >= min && value <= max, "seed {seed} n {n}: rank {rank} returned {value} outside [{min}, {max}]");
        for &(other, v) in &outcome.values {
            assert!((value - v).abs() <= EPSILON, "seed {seed} n {n}: ranks {rank} and {other} returned {value} and {v}");
        }
    }
    drop(store);
    std::fs::remove_dir_all(&run_dir).unwrap();
    outcome
}

fn seeds() -> u64 {
    std::env::var("AGGBOX_AGREE_SEEDS").ok().and_then(|s| s.parse().ok()).unwrap_or(50)
}

/// A directory of stores, removed when dropped (also when a test fails).
struct TempDir(PathBuf);

impl TempDir {
    fn new(name: &str) -> TempDir {
        let dir = std::env::temp_dir().join(format!("aggbox-agree-{}-{name}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        TempDir(dir)
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// Runs the seeds of both configurations on `datapath_of`; returns the
/// report lines of the finished ranks.
fn runs(datapath_of: DatapathOf, name: &str, count: u64) -> Vec<String> {
    let _serial = serial();
    let mut cluster = Cluster::temporary_plain(HOSTS, 1500).unwrap();
    cluster.inject_faults(FaultSpec::percent(20.0, 5.0).reorder(5.0)).unwrap();
    let dir = TempDir::new(name);
    let mut reports = Vec::new();
    let (mut kills, mut restarts) = (0, 0);
    for seed in 0..count {
        for (n, f) in [(5, 2), (7, 3)] {
            let began = Instant::now();
            let outcome = run(&cluster, &dir.0, n, f, datapath_of, seed);
            println!(
                "{name} seed {seed} n {n} f {f}: {} kills, {} restarts, {} values, {} ms",
                outcome.kills,
                outcome.restarts,
                outcome.values.len(),
                began.elapsed().as_millis()
            );
            kills += outcome.kills;
            restarts += outcome.restarts;
            reports.extend(outcome.reports);
        }
    }
    let faults = cluster.fault_stats().unwrap();
    let dropped: u64 = faults.iter().map(|s| s.dropped).sum();
    assert!(dropped > 0, "the faults dropped frames");
    assert!(restarts > 0 && kills > restarts, "{kills} kills, {restarts} restarts");
    println!("{name}: {} runs, {kills} kills, {restarts} restarts, {dropped} frames dropped", count * 2);
    reports
}

#[test]
fn crashes_restarts_and_loss_on_the_user_datapath() {
    let reports = runs(user, "user", seeds());
    for line in &reports {
        let f = fields(line);
        assert_eq!(f["datapath"], "user");
        assert_eq!(number(&f, "quorums_from_kernel"), 0);
        assert_eq!(number(&f, "fanouts"), 0);
    }
}

#[test]
fn crashes_restarts_and_loss_on_the_kernel_datapath() {
    let reports = runs(kernel, "kernel", seeds());
    let (mut phases, mut from_kernel) = (0, 0);
    for line in &reports {
        let f = fields(line);
        assert_eq!(f["datapath"], "kernel");
        phases += number(&f, "phases");
        from_kernel += number(&f, "quorums_from_kernel");
        // Every phase a rank entered was sent once, for TC egress to clone.
        assert!(number(&f, "fanouts") >= number(&f, "phases") + number(&f, "jumps"), "{line}");
    }
    // TC ingress folded the phases and announced their quorums (the others
    // were completed by values it passed up, or skipped by jumping ahead).
    assert!(from_kernel > 0 && from_kernel <= phases, "{from_kernel} quorum notices from TC for {phases} phases computed");
    println!("kernel: {from_kernel} of {phases} computed phases announced by TC ingress");
}

#[test]
fn crashes_restarts_and_loss_on_a_mixed_group() {
    runs(mixed, "mixed", seeds().div_ceil(10));
}
