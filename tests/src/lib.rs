//! Support for the multi-process tests: start ranks inside the hosts of a
//! virtual cluster, collect their report lines, build the C examples against
//! `include/aggbox.h` and `libaggbox.so` only.

use std::{
    collections::HashMap,
    io::{BufRead, BufReader},
    path::{Path, PathBuf},
    process::{Child, ChildStdout, Command, Stdio},
    sync::OnceLock,
    time::{Duration, Instant},
};

use aggbox_core::cluster::Cluster;

/// The target directory this test binary was built in (`target/debug`).
pub fn target_dir() -> PathBuf {
    let exe = std::env::current_exe().expect("current_exe");
    // target/debug/deps/<test> -> target/debug
    exe.parent().and_then(Path::parent).expect("target dir").to_path_buf()
}

/// The workspace root.
pub fn workspace() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).parent().unwrap().to_path_buf()
}

/// A binary of the workspace, which must have been built (`cargo build`).
pub fn workspace_binary(name: &str) -> PathBuf {
    let path = target_dir().join(name);
    assert!(path.exists(), "{} is missing: run `cargo build --workspace` first", path.display());
    path
}

/// Compiles `examples/c/<name>.c` against `include/aggbox.h` and
/// `libaggbox.so` (nothing else of AggBox) once per test process.
pub fn c_example(name: &'static str) -> PathBuf {
    static BUILT: OnceLock<std::sync::Mutex<HashMap<&'static str, PathBuf>>> = OnceLock::new();
    let mut built = BUILT.get_or_init(Default::default).lock().unwrap();
    if let Some(path) = built.get(name) {
        return path.clone();
    }
    let out = compile_example("cc", &["-std=c11"], &[], &format!("examples/c/{name}.c"), &format!("aggbox-{name}"));
    built.insert(name, out.clone());
    out
}

/// Compiles `examples/cpp/<name>.cpp` with the C++ wrapper
/// (`bindings/cpp`) against `include/aggbox.h` and `libaggbox.so`, with
/// `$CXX` (else `c++`).
pub fn cpp_example(name: &str) -> PathBuf {
    let cxx = std::env::var("CXX").unwrap_or_else(|_| "c++".into());
    let bindings = workspace().join("bindings/cpp");
    compile_example(&cxx, &["-std=c++17"], &[&bindings], &format!("examples/cpp/{name}.cpp"), &format!("aggbox-cpp-{name}"))
}

/// Compiles the workspace's `source` with `compiler` and warnings as errors
/// into a temporary `out_name`, against `include/` (and `includes`) and the
/// `libaggbox.so` of this build.
fn compile_example(compiler: &str, flags: &[&str], includes: &[&Path], source: &str, out_name: &str) -> PathBuf {
    let lib_dir = target_dir();
    assert!(lib_dir.join("libaggbox.so").exists(), "libaggbox.so is missing: run `cargo build --workspace` first");
    let out = std::env::temp_dir().join(format!("{out_name}-{}", std::process::id()));
    let status = Command::new(compiler)
        .args(flags)
        .args(["-Wall", "-Wextra", "-Werror", "-O2"])
        .arg(format!("-I{}", workspace().join("include").display()))
        .args(includes.iter().map(|dir| format!("-I{}", dir.display())))
        .arg(workspace().join(source))
        .arg(format!("-L{}", lib_dir.display()))
        .arg(format!("-Wl,-rpath,{}", lib_dir.display()))
        .arg("-laggbox")
        .arg("-o")
        .arg(&out)
        .status()
        .unwrap_or_else(|e| panic!("running {compiler}: {e}"));
    assert!(status.success(), "compiling {source} failed");
    out
}

/// Held by each multi-host test of a test binary for its whole run: they
/// share two cores, so they run one at a time (a test that failed while
/// holding it does not stop the others).
pub fn serial() -> std::sync::MutexGuard<'static, ()> {
    static SERIAL: std::sync::Mutex<()> = std::sync::Mutex::new(());
    SERIAL.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
}

/// Every rank on the user datapath (a `datapath_of` for the tests).
pub fn user(_: usize) -> &'static str {
    "user"
}

/// Every rank on the kernel datapath.
pub fn kernel(_: usize) -> &'static str {
    "kernel"
}

/// Every rank asks for `auto`: the kernel datapath where its programs can
/// attach (as root, here), the user datapath otherwise.
pub fn auto(_: usize) -> &'static str {
    "auto"
}

/// Even ranks on the kernel datapath, odd ranks on the user datapath.
pub fn mixed(rank: usize) -> &'static str {
    if rank.is_multiple_of(2) {
        "kernel"
    } else {
        "user"
    }
}

/// How a rank program reports a failed call and exits (status 1): one line
/// `error status=STATUS blamed=RANK message=…` (`blamed` is `-` unless a
/// peer failed).
pub fn fail(e: &aggbox_core::Error) -> ! {
    let blamed = match e {
        aggbox_core::Error::PeerFailed { rank, .. } => rank.to_string(),
        _ => "-".into(),
    };
    println!("error status={:?} blamed={blamed} message={e}", e.status());
    std::process::exit(1);
}

/// Waits for every rank but `victim`, which was killed at `killed`, each
/// for up to `wait`, and checks that each exited with status 1 after an
/// `error` line of status `PeerFailed` blaming `victim`, within `within` of
/// the kill. Returns each survivor's rank and error line.
pub fn survivors_blame(
    ranks: Vec<RankProcess>,
    victim: usize,
    killed: Instant,
    wait: Duration,
    within: Duration,
) -> Vec<(usize, String)> {
    let mut errors = Vec::new();
    for (i, rank) in ranks.into_iter().enumerate().filter(|(i, _)| *i != victim) {
        let (code, lines) = rank.finish(wait);
        let elapsed = killed.elapsed();
        assert_eq!(code, 1, "rank {i}: {lines:?}");
        let error = lines.iter().find(|l| l.starts_with("error ")).unwrap_or_else(|| panic!("rank {i}: {lines:?}"));
        let parsed = fields(error);
        assert_eq!(parsed["status"], "PeerFailed", "rank {i}: {error}");
        assert_eq!(parsed["blamed"], victim.to_string(), "rank {i} names the killed rank: {error}");
        assert!(elapsed < within, "rank {i} exited {elapsed:?} after the kill");
        errors.push((i, error.clone()));
    }
    errors
}

/// Parses `key=value key=value …` into a map.
pub fn fields(line: &str) -> HashMap<String, String> {
    line.split_whitespace()
        .filter_map(|kv| kv.split_once('='))
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect()
}

/// A field of a report line as a number.
pub fn number(fields: &HashMap<String, String>, key: &str) -> u64 {
    fields.get(key).unwrap_or_else(|| panic!("no {key} in {fields:?}")).parse().unwrap()
}

/// Fills `buf` from a seeded xorshift64 generator: the same `seed` gives the
/// same bytes on every rank, so a receiver can check a broadcast byte for
/// byte without being sent the expected buffer.
pub fn fill_random(buf: &mut [u8], seed: u64) {
    let mut state = seed ^ 0x9E37_79B9_7F4A_7C15;
    if state == 0 {
        state = 1;
    }
    let mut next = move || {
        state ^= state << 13;
        state ^= state >> 7;
        state ^= state << 17;
        state.to_le_bytes()
    };
    let mut words = buf.chunks_exact_mut(8);
    for word in &mut words {
        word.copy_from_slice(&next());
    }
    let rest = words.into_remainder();
    let last = next();
    rest.copy_from_slice(&last[..rest.len()]);
}

/// The seed of the buffer that `root` broadcasts in a case of `size`
/// bytes, derived from the run's `seed`: every (root, size) case sends
/// other bytes, so a chunk left over from another case is caught.
pub fn case_seed(seed: u64, root: usize, size: usize) -> u64 {
    seed.wrapping_mul(0x100_0000_01b3) ^ ((root as u64) << 48) ^ size as u64
}

/// A rank process; killed when dropped, so a failing test leaves none.
pub struct RankProcess {
    /// The child.
    pub child: Child,
    stdout: BufReader<ChildStdout>,
    /// Every line it printed so far.
    pub lines: Vec<String>,
}

impl RankProcess {
    /// Starts `program args` as `rank` of `world` inside host `host`, with
    /// rank 0's store on host `master`.
    #[allow(clippy::too_many_arguments)]
    pub fn spawn(
        cluster: &Cluster,
        host: usize,
        master: usize,
        master_port: u16,
        rank: usize,
        world: usize,
        datapath: &str,
        program: &Path,
        args: &[&str],
        extra_env: &[(&str, &str)],
    ) -> RankProcess {
        let mut command = cluster.command(host, program);
        command
            .args(args)
            .env("RANK", rank.to_string())
            .env("WORLD_SIZE", world.to_string())
            .env("MASTER_ADDR", cluster.host(master).ipv4.to_string())
            .env("MASTER_PORT", master_port.to_string())
            .env("AGGBOX_DATAPATH", datapath)
            .env("AGGBOX_TIMEOUT_MS", "20000")
            .stdin(Stdio::piped())
            .stdout(Stdio::piped());
        for (k, v) in extra_env {
            command.env(k, v);
        }
        let mut child = command.spawn().expect("spawn a rank");
        let stdout = BufReader::new(child.stdout.take().unwrap());
        RankProcess { child, stdout, lines: Vec::new() }
    }

    /// Reads lines until one equals or starts with `prefix`; returns it.
    pub fn wait_for(&mut self, prefix: &str) -> String {
        loop {
            let mut line = String::new();
            let n = self.stdout.read_line(&mut line).expect("read a rank's output");
            assert!(n > 0, "rank exited before printing {prefix:?}; it printed {:?}", self.lines);
            let line = line.trim_end().to_string();
            self.lines.push(line.clone());
            if line.starts_with(prefix) {
                return line;
            }
        }
    }

    /// Writes a line to its stdin.
    pub fn say(&mut self, line: &str) {
        use std::io::Write;
        writeln!(self.child.stdin.as_mut().unwrap(), "{line}").unwrap();
    }

    /// Waits for it to exit (at most `timeout`) and returns its exit code
    /// and every line it printed.
    pub fn finish(mut self, timeout: Duration) -> (i32, Vec<String>) {
        let deadline = Instant::now() + timeout;
        loop {
            if let Some(status) = self.child.try_wait().unwrap() {
                let mut rest = String::new();
                use std::io::Read;
                self.stdout.read_to_string(&mut rest).ok();
                self.lines.extend(rest.lines().map(String::from));
                return (status.code().unwrap_or(-1), std::mem::take(&mut self.lines));
            }
            assert!(Instant::now() < deadline, "rank did not exit within {timeout:?}; printed {:?}", self.lines);
            std::thread::sleep(Duration::from_millis(10));
        }
    }
}

impl Drop for RankProcess {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// The pin directories AggBox has in the host bpffs (for leak checks).
pub fn aggbox_pins() -> Vec<PathBuf> {
    std::fs::read_dir(aggbox_core::loader::PIN_ROOT)
        .map(|d| d.flatten().map(|e| e.path()).collect())
        .unwrap_or_default()
}

/// What is attached to eth0 inside host `host`: "xdp " when an XDP program
/// is, then "tc " when AggBox TCX programs are (empty when nothing is).
pub fn attached_programs(cluster: &Cluster, host: usize) -> String {
    let out = cluster.command(host, "ip").args(["-d", "link", "show", "dev", "eth0"]).output().unwrap();
    let link = String::from_utf8_lossy(&out.stdout).to_string();
    let mut found = String::new();
    if link.contains("prog/xdp") {
        found.push_str("xdp ");
    }
    let tc_names = cluster
        .run_in(host, || {
            use aya::programs::{tc::TcAttachType, SchedClassifier};
            [TcAttachType::Ingress, TcAttachType::Egress]
                .into_iter()
                .flat_map(|t| SchedClassifier::query_tcx("eth0", t).map(|(_, progs)| progs).unwrap_or_default())
                .filter_map(|info| info.name_as_str().map(String::from))
                .collect::<Vec<_>>()
        })
        .unwrap();
    if tc_names.iter().any(|n| n.starts_with("aggbox_tc")) {
        found.push_str("tc ");
    }
    found
}

/// The words of `text` for the word-count tests: maximal runs of ASCII
/// letters and digits, lower-cased, of 1 to `key_max` bytes (longer runs
/// are skipped). Used by the rank program and by nothing else: the tests'
/// reference counts do their own splitting.
pub fn words(text: &[u8], key_max: usize) -> impl Iterator<Item = Vec<u8>> + '_ {
    text.split(|b| !b.is_ascii_alphanumeric())
        .filter(move |w| !w.is_empty() && w.len() <= key_max)
        .map(|w| w.to_ascii_lowercase())
}

/// The text files the word-count test splits across its ranks: what
/// Debian's packages installed under /usr/share/common-licenses and the
/// `copyright` files under /usr/share/doc, in name order.
pub fn license_texts() -> Vec<PathBuf> {
    let mut files: Vec<PathBuf> = std::fs::read_dir("/usr/share/common-licenses")
        .map(|d| d.flatten().map(|e| e.path()).filter(|p| p.is_file()).collect())
        .unwrap_or_default();
    if let Ok(docs) = std::fs::read_dir("/usr/share/doc") {
        files.extend(docs.flatten().map(|e| e.path().join("copyright")).filter(|p| p.is_file()));
    }
    files.sort();
    files
}

/// splitmix64.
pub fn splitmix(mut z: u64) -> u64 {
    z = z.wrapping_add(0x9E37_79B9_7F4A_7C15);
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

/// Zipf-distributed keys (exponent 1) over `distinct` ids, drawn by a
/// seeded generator: the same arguments give the same pairs everywhere.
pub struct Zipf {
    cdf: Vec<f64>,
}

impl Zipf {
    /// The distribution over ids `0..distinct`.
    pub fn new(distinct: usize) -> Zipf {
        let mut cdf = Vec::with_capacity(distinct);
        let mut total = 0.0;
        for k in 1..=distinct {
            total += 1.0 / k as f64;
            cdf.push(total);
        }
        for c in &mut cdf {
            *c /= total;
        }
        Zipf { cdf }
    }

    /// The id whose probability mass holds `u` (in [0, 1)).
    pub fn id(&self, u: f64) -> usize {
        self.cdf.partition_point(|&c| c <= u).min(self.cdf.len() - 1)
    }
}

/// The key of id `id`: `k<id>` and, for one id in four, a tail that makes
/// it 33 to 48 bytes long (longer than a 32-byte kernel key).
pub fn zipf_key(id: usize) -> Vec<u8> {
    let mut key = format!("k{id}").into_bytes();
    let h = splitmix(id as u64);
    if h.is_multiple_of(4) {
        let want = 33 + (h >> 8) as usize % 16;
        while key.len() < want {
            key.push(b'a' + (key.len() % 26) as u8);
        }
    }
    key
}

/// Pair `i` of rank `rank`'s share in a Zipf run with `seed`: its key id and
/// its value (an i64 in ±2^40, as 64 bits; for f64 runs an integer in
/// ±2^20 as a double, so every sum of up to 2^32 of them is exact in any
/// order).
pub fn zipf_pair(zipf: &Zipf, seed: u64, rank: usize, i: usize, float: bool) -> (usize, u64) {
    let h = splitmix(seed ^ ((rank as u64) << 40) ^ i as u64);
    let u = (h >> 11) as f64 / (1u64 << 53) as f64;
    let value = (splitmix(h) % (1 << 41)) as i64 - (1 << 40);
    (zipf.id(u), if float { ((value >> 20) as f64).to_bits() } else { value as u64 })
}
