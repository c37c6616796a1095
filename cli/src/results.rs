//! What a bench run measured, kept: one JSON file per run of `aggbox bench
//! broadcast|allreduce|barrier|tcp` (every measured row, and on which
//! network each system ran), a PNG plot of it, and `aggbox bench report
//! DIR`, which turns a directory of those files into the generated section of
//! docs/BENCHMARKS.md (and one plot per bench and host count, every MTU on
//! it).
//!
//! A file is `<bench>-<mtu>-<timestamp>.json` (timestamp UTC,
//! `YYYYMMDDTHHMMSSZ`); its plot is the same name with `.png`. Nothing is
//! written that was not measured in that run: a system that was not measured
//! has no rows, and the run's `notes` say why.

use std::{
    collections::BTreeMap,
    fs,
    path::{Path, PathBuf},
    time::{SystemTime, UNIX_EPOCH},
};

use serde::{Deserialize, Serialize};

/// The marker that opens the generated section of docs/BENCHMARKS.md.
pub const BEGIN_MARKER: &str = "<!-- bench:begin -->";
/// The marker that closes it.
pub const END_MARKER: &str = "<!-- bench:end -->";
/// The TTF files the plots draw their text with, first found wins
/// (fonts-dejavu-core, which scripts/setup.sh installs).
const FONT_FILES: [&str; 3] = [
    "/usr/share/fonts/truetype/dejavu/DejaVuSans.ttf",
    "/usr/share/fonts/TTF/DejaVuSans.ttf",
    "/usr/share/fonts/dejavu/DejaVuSans.ttf",
];
/// The font family the plots ask for.
const FONT_FAMILY: &str = "sans-serif";
/// Size of a plot, pixels.
const PLOT_SIZE: (u32, u32) = (1100, 700);
/// The lines' colors, in turn: ColorBrewer's Set1 without its yellow,
/// which is hard to see on white.
const LINE_COLORS: [(u8, u8, u8); 8] =
    [(228, 26, 28), (55, 126, 184), (77, 175, 74), (152, 78, 163), (255, 127, 0), (166, 86, 40), (247, 129, 191), (0, 0, 0)];

/// The network one system ran on.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
pub struct Network {
    /// `aggbox` (AggBox's cluster: a plain bridge with AggBox's programs on
    /// the hosts' TC hooks, or a bare XDP program on every bridge port; the
    /// description says which) or `plain` (no program on any interface).
    pub kind: String,
    /// What it was, for a reader: the programs on it, the MTU, TSO.
    pub description: String,
    /// What `ethtool -k eth0` said of `tcp-segmentation-offload` in host 0.
    pub tso: String,
}

/// One measured row.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
pub struct Row {
    /// `AggBox`, `Open MPI`, `floor` (plain UDP, what AggBox's data moves
    /// at best) or `TCP (iperf3)`.
    pub system: String,
    /// AggBox's datapath (`kernel`, `user`); for TCP, whether AggBox's
    /// programs were attached to the hosts (`with AggBox programs`,
    /// `without programs`).
    pub datapath: Option<String>,
    /// The [`Network::kind`] it ran on.
    pub network: String,
    /// The MTU of every link.
    pub mtu: u32,
    /// Bytes per operation (broadcast: the message; allreduce: the vector;
    /// train: the f32 gradient allreduced each step; barrier and TCP: 0).
    pub bytes: u64,
    /// f32 elements per operation (allreduce; train: the parameters).
    pub count: Option<u64>,
    /// What one sample is: `slowest` (a barrier, then each rank times its
    /// own call; the slowest rank's time), `span` (earliest start to latest
    /// return on one clock), `back-to-back` (one rank's operations without
    /// barriers between), `throughput` (one iperf3 run); train: `slowest`
    /// (the slowest rank's time of a training step), `mean-step` (the whole
    /// run's time per step), `to-loss` (the time to the target loss).
    pub measure: String,
    /// The unit of `p50` and `p99`: `us`, `s` or `Gbit/s`.
    pub unit: String,
    /// Median of the samples.
    pub p50: f64,
    /// 99th percentile of the samples (nearest rank).
    pub p99: f64,
    /// How many samples.
    pub rounds: usize,
}

/// A curve one system drew (train: its loss against time).
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
pub struct Curve {
    /// As [`Row::system`].
    pub system: String,
    /// As [`Row::datapath`].
    pub datapath: Option<String>,
    /// As [`Row::network`].
    pub network: String,
    /// As [`Row::mtu`].
    pub mtu: u32,
    /// (x, y) points, x ascending; train: (seconds since the start, loss).
    pub points: Vec<(f64, f64)>,
}

/// One bench run.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
pub struct RunFile {
    /// `broadcast`, `allreduce`, `barrier` or `tcp`.
    pub bench: String,
    /// When the run ended, UTC, `YYYYMMDDTHHMMSSZ`.
    pub timestamp: String,
    /// Hosts (one rank each).
    pub hosts: usize,
    /// The MTU of both clusters.
    pub mtu: u32,
    /// `git describe --always --dirty` of the source tree the binary was
    /// built from, when it can be read.
    pub source: Option<String>,
    /// CPUs of the machine.
    pub cpus: usize,
    /// The networks the systems ran on.
    pub networks: Vec<Network>,
    /// What a reader must know: what was not measured and why, faults.
    pub notes: Vec<String>,
    /// Every measured row.
    pub rows: Vec<Row>,
    /// Measured curves (train's loss against time); none in the other
    /// benches' files.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub curves: Vec<Curve>,
}

impl RunFile {
    /// A run of `bench` on `hosts` hosts at `mtu`, stamped now, with no rows.
    pub fn new(bench: &str, hosts: usize, mtu: u32) -> RunFile {
        RunFile {
            bench: bench.into(),
            timestamp: timestamp(SystemTime::now()),
            hosts,
            mtu,
            source: source_version(),
            cpus: std::thread::available_parallelism().map_or(1, |n| n.get()),
            networks: Vec::new(),
            notes: Vec::new(),
            rows: Vec::new(),
            curves: Vec::new(),
        }
    }

    /// The file name of this run, without extension.
    fn stem(&self) -> String {
        format!("{}-{}-{}", self.bench, self.mtu, self.timestamp)
    }

    /// Writes `<dir>/<stem>.json` and, for the benches with sizes or hosts to
    /// plot, `<dir>/<stem>.png`; returns the paths written. Also restamps the
    /// run with the time it ended.
    pub fn write(&mut self, dir: &Path) -> Result<Vec<PathBuf>, String> {
        self.timestamp = timestamp(SystemTime::now());
        fs::create_dir_all(dir).map_err(|e| format!("creating {}: {e}", dir.display()))?;
        let json = dir.join(format!("{}.json", self.stem()));
        let text = serde_json::to_string_pretty(self).map_err(|e| format!("encoding {}: {e}", json.display()))?;
        fs::write(&json, text + "\n").map_err(|e| format!("writing {}: {e}", json.display()))?;
        let mut written = vec![json];
        if self.bench != "tcp" {
            let png = dir.join(format!("{}.png", self.stem()));
            let title = format!("{} on {} hosts, MTU {} ({})", self.bench, self.hosts, self.mtu, self.timestamp);
            plot(&png, &title, &self.bench, &[self])?;
            written.push(png);
        }
        Ok(written)
    }
}

/// `t` as `YYYYMMDDTHHMMSSZ` (UTC).
fn timestamp(t: SystemTime) -> String {
    let secs = t.duration_since(UNIX_EPOCH).map_or(0, |d| d.as_secs());
    let (days, rest) = (secs / 86_400, secs % 86_400);
    let (year, month, day) = civil_from_days(days as i64);
    format!("{year:04}{month:02}{day:02}T{:02}{:02}{:02}Z", rest / 3600, rest / 60 % 60, rest % 60)
}

/// The proleptic Gregorian date of `days` since 1970-01-01 (Howard
/// Hinnant's `civil_from_days`).
fn civil_from_days(days: i64) -> (i64, u32, u32) {
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = (doy - (153 * mp + 2) / 5 + 1) as u32;
    let month = if mp < 10 { mp + 3 } else { mp - 9 } as u32;
    let year = yoe + era * 400 + i64::from(month <= 2);
    (year, month, day)
}

/// `git describe --always --dirty` of the tree this binary was built from.
fn source_version() -> Option<String> {
    let out = std::process::Command::new("git")
        .args(["-C", env!("CARGO_MANIFEST_DIR"), "describe", "--always", "--dirty"])
        .output()
        .ok()?;
    let text = String::from_utf8_lossy(&out.stdout).trim().to_string();
    (out.status.success() && !text.is_empty()).then_some(text)
}

/// "64 B", "1 KiB", "64 MiB".
pub fn human_bytes(size: u64) -> String {
    match size {
        s if s >= 1 << 20 && s % (1 << 20) == 0 => format!("{} MiB", s >> 20),
        s if s >= 1 << 10 && s % (1 << 10) == 0 => format!("{} KiB", s >> 10),
        s => format!("{s} B"),
    }
}

/// "1 Ki", "16 Mi".
fn human_count(count: u64) -> String {
    match count {
        c if c >= 1 << 20 && c % (1 << 20) == 0 => format!("{} Mi", c >> 20),
        c if c >= 1 << 10 && c % (1 << 10) == 0 => format!("{} Ki", c >> 10),
        c => c.to_string(),
    }
}

/// A system and datapath as a column or line label: "AggBox kernel",
/// "Open MPI".
fn label(row: &Row) -> String {
    match &row.datapath {
        Some(datapath) => format!("{} {datapath}", row.system),
        None => row.system.clone(),
    }
}

/// The measure a bench's tables and plots compare: the slowest rank's time
/// after a barrier, as bench/mpi takes it; TCP's throughput.
fn compared_measure(bench: &str) -> &'static str {
    if bench == "tcp" {
        "throughput"
    } else {
        "slowest"
    }
}

// ---- plots ----------------------------------------------------------------

/// Registers the first of [`FONT_FILES`] that exists with plotters, once;
/// whether a font is there.
fn font_available() -> bool {
    static FONT: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *FONT.get_or_init(|| {
        for path in FONT_FILES {
            if let Ok(bytes) = fs::read(path) {
                // Plotters keeps fonts for the life of the process.
                let bytes: &'static [u8] = Box::leak(bytes.into_boxed_slice());
                if plotters::style::register_font(FONT_FAMILY, plotters::style::FontStyle::Normal, bytes).is_ok() {
                    return true;
                }
            }
        }
        false
    })
}

/// One line of a plot: its label and its (x, y) points, x ascending.
type Series = (String, Vec<(f64, f64)>);

/// The lines of `runs` of `bench`: one per system, datapath and MTU, time
/// (p50 of the compared measure) against log2 of the bytes (barrier:
/// against hosts).
fn series_of(bench: &str, runs: &[&RunFile]) -> Vec<Series> {
    let mut lines: BTreeMap<String, Vec<(f64, f64)>> = BTreeMap::new();
    for run in runs {
        for row in run.rows.iter().filter(|r| r.measure == compared_measure(bench) && r.p50 > 0.0) {
            // Sizes on a log2 axis (labelled in bytes), hosts on a linear one.
            let x = if bench == "barrier" { run.hosts as f64 } else { (row.bytes as f64).log2() };
            let key = format!("{}, MTU {} ({} network)", label(row), row.mtu, row.network);
            lines.entry(key).or_default().push((x, row.p50));
        }
    }
    lines
        .into_iter()
        .map(|(key, mut points)| {
            points.sort_by(|a, b| a.0.total_cmp(&b.0));
            (key, points)
        })
        .collect()
}

/// Draws `runs` of `bench` into the PNG `path`: log-log, one line per
/// system, datapath and MTU. Without a font (see [`FONT_FILES`]) the plot
/// has lines but no text, and a warning says so.
fn plot(path: &Path, title: &str, bench: &str, runs: &[&RunFile]) -> Result<(), String> {
    use plotters::prelude::*;
    if bench == "train" {
        return plot_curves(path, title, runs);
    }
    let series = series_of(bench, runs);
    let points: Vec<(f64, f64)> = series.iter().flat_map(|(_, p)| p.iter().copied()).collect();
    if points.is_empty() {
        return Ok(());
    }
    let text = font_available();
    if !text {
        eprintln!("aggbox: no font found ({}): {} has no labels (apt-get install fonts-dejavu-core)", FONT_FILES[0], path.display());
    }
    let fail = |e: &dyn std::fmt::Display| format!("plotting {}: {e}", path.display());
    let bounds = |values: &mut dyn Iterator<Item = f64>| {
        values.fold((f64::INFINITY, f64::NEG_INFINITY), |(lo, hi), v| (lo.min(v), hi.max(v)))
    };
    let (x_lo, x_hi) = bounds(&mut points.iter().map(|p| p.0));
    let (x_lo, x_hi) = ((x_lo - 1.0).max(0.0), x_hi + 1.0);
    // Whole decades, so that the log axis has labels.
    let (y_lo, y_hi) = bounds(&mut points.iter().map(|p| p.1));
    let (y_lo, y_hi) = (10f64.powf(y_lo.log10().floor()), 10f64.powf((y_hi * 1.01).log10().ceil()));
    let root = BitMapBackend::new(path, PLOT_SIZE).into_drawing_area();
    root.fill(&WHITE).map_err(|e| fail(&e))?;
    let mut builder = ChartBuilder::on(&root);
    builder.margin(20).x_label_area_size(50).y_label_area_size(80);
    if text {
        builder.caption(title, (FONT_FAMILY, 24));
    }
    let mut chart = builder
        .build_cartesian_2d(x_lo..x_hi, (y_lo..y_hi).log_scale())
        .map_err(|e| fail(&e))?;
    let x_desc = if bench == "barrier" { "hosts" } else { "bytes per operation" };
    let x_label = |x: &f64| {
        if bench == "barrier" {
            format!("{x:.0}")
        } else if (x - x.round()).abs() < 1e-9 {
            human_bytes(2f64.powf(x.round()) as u64)
        } else {
            String::new()
        }
    };
    let y_label = |y: &f64| if *y >= 1e6 { format!("{} s", y / 1e6) } else if *y >= 1e3 { format!("{} ms", y / 1e3) } else { format!("{y} µs") };
    let mut mesh = chart.configure_mesh();
    if text {
        mesh.x_desc(x_desc)
            .y_desc("p50 of the slowest rank's time after a barrier")
            .label_style((FONT_FAMILY, 15))
            .x_label_formatter(&x_label)
            .y_label_formatter(&y_label);
    } else {
        mesh.x_labels(0).y_labels(0);
    }
    mesh.draw().map_err(|e| fail(&e))?;
    for (i, (name, points)) in series.iter().enumerate() {
        let (r, g, b) = LINE_COLORS[i % LINE_COLORS.len()];
        let color = RGBColor(r, g, b).to_rgba();
        let style = ShapeStyle::from(&color).stroke_width(2);
        let drawn = chart.draw_series(LineSeries::new(points.iter().copied(), style)).map_err(|e| fail(&e))?;
        if text {
            drawn.label(name.as_str()).legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 20, y)], style));
        }
        chart
            .draw_series(points.iter().map(|&p| Circle::new(p, 4, color.filled())))
            .map_err(|e| fail(&e))?;
    }
    if text {
        chart
            .configure_series_labels()
            .position(SeriesLabelPosition::UpperLeft)
            .background_style(WHITE.mix(0.85))
            .border_style(BLACK)
            .label_font((FONT_FAMILY, 15))
            .draw()
            .map_err(|e| fail(&e))?;
    }
    root.present().map_err(|e| fail(&e))
}

/// Draws the loss curves of train `runs` into the PNG `path`: loss against
/// seconds since the start, both linear, one line per system, datapath and
/// MTU.
fn plot_curves(path: &Path, title: &str, runs: &[&RunFile]) -> Result<(), String> {
    use plotters::prelude::*;
    let series: Vec<Series> = runs
        .iter()
        .flat_map(|run| run.curves.iter())
        .filter(|c| !c.points.is_empty())
        .map(|c| {
            let system = c.datapath.as_ref().map_or(c.system.clone(), |d| format!("{} {d}", c.system));
            (format!("{system}, MTU {} ({} network)", c.mtu, c.network), c.points.clone())
        })
        .collect();
    let points: Vec<(f64, f64)> = series.iter().flat_map(|(_, p)| p.iter().copied()).collect();
    if points.is_empty() {
        return Ok(());
    }
    let text = font_available();
    if !text {
        eprintln!("aggbox: no font found ({}): {} has no labels (apt-get install fonts-dejavu-core)", FONT_FILES[0], path.display());
    }
    let fail = |e: &dyn std::fmt::Display| format!("plotting {}: {e}", path.display());
    let x_hi = points.iter().map(|p| p.0).fold(0.0, f64::max) * 1.02;
    let (y_lo, y_hi) = points.iter().fold((f64::INFINITY, f64::NEG_INFINITY), |(lo, hi), p| (lo.min(p.1), hi.max(p.1)));
    let pad = ((y_hi - y_lo) * 0.05).max(1e-3);
    let root = BitMapBackend::new(path, PLOT_SIZE).into_drawing_area();
    root.fill(&WHITE).map_err(|e| fail(&e))?;
    let mut builder = ChartBuilder::on(&root);
    builder.margin(20).x_label_area_size(50).y_label_area_size(80);
    if text {
        builder.caption(title, (FONT_FAMILY, 24));
    }
    let mut chart = builder.build_cartesian_2d(0.0..x_hi.max(1e-3), (y_lo - pad)..(y_hi + pad)).map_err(|e| fail(&e))?;
    let mut mesh = chart.configure_mesh();
    if text {
        mesh.x_desc("seconds since the start (the latest rank's end of each step)")
            .y_desc("loss (mean of the ranks' batch losses)")
            .label_style((FONT_FAMILY, 15));
    } else {
        mesh.x_labels(0).y_labels(0);
    }
    mesh.draw().map_err(|e| fail(&e))?;
    for (i, (name, points)) in series.iter().enumerate() {
        let (r, g, b) = LINE_COLORS[i % LINE_COLORS.len()];
        let color = RGBColor(r, g, b).to_rgba();
        let style = ShapeStyle::from(&color).stroke_width(2);
        let drawn = chart.draw_series(LineSeries::new(points.iter().copied(), style)).map_err(|e| fail(&e))?;
        if text {
            drawn.label(name.as_str()).legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 20, y)], style));
        }
    }
    if text {
        chart
            .configure_series_labels()
            .position(SeriesLabelPosition::UpperRight)
            .background_style(WHITE.mix(0.85))
            .border_style(BLACK)
            .label_font((FONT_FAMILY, 15))
            .draw()
            .map_err(|e| fail(&e))?;
    }
    root.present().map_err(|e| fail(&e))
}

// ---- bench report ---------------------------------------------------------

/// Every run file in `dir` (`*.json` that parse as a [`RunFile`]), oldest
/// first; files that do not parse are named on stderr and skipped.
fn read_runs(dir: &Path) -> Result<Vec<RunFile>, String> {
    let entries = fs::read_dir(dir).map_err(|e| format!("reading {}: {e}", dir.display()))?;
    let mut runs = Vec::new();
    for entry in entries {
        let path = entry.map_err(|e| format!("reading {}: {e}", dir.display()))?.path();
        if path.extension().is_none_or(|ext| ext != "json") {
            continue;
        }
        let text = fs::read_to_string(&path).map_err(|e| format!("reading {}: {e}", path.display()))?;
        match serde_json::from_str::<RunFile>(&text) {
            Ok(run) => runs.push(run),
            Err(e) => eprintln!("aggbox: skipping {}: not a bench run file ({e})", path.display()),
        }
    }
    runs.sort_by(|a, b| a.timestamp.cmp(&b.timestamp));
    Ok(runs)
}

/// The order of the benches in the report.
const BENCH_ORDER: [&str; 5] = ["broadcast", "allreduce", "barrier", "train", "tcp"];

/// The latest run of each (bench, hosts, MTU), in report order.
fn latest(runs: &[RunFile]) -> Vec<&RunFile> {
    let mut by_key: BTreeMap<(usize, usize, u32), &RunFile> = BTreeMap::new();
    for run in runs {
        let order = BENCH_ORDER.iter().position(|b| *b == run.bench).unwrap_or(BENCH_ORDER.len());
        // Sorted oldest first: the last one wins.
        by_key.insert((order, run.hosts, run.mtu), run);
    }
    by_key.into_values().collect()
}

/// The measures of a train run's table, in order, and their line labels.
const TRAIN_MEASURES: [(&str, &str); 3] =
    [("slowest", "time per step (slowest rank)"), ("mean-step", "time per step (whole run)"), ("to-loss", "time to the target loss")];

/// "p50 (p99)" of a row, in its unit (one value for train's whole-run measures).
fn cell(row: &Row) -> String {
    let fmt = |v: f64| {
        if row.unit == "us" {
            if v >= 10_000.0 {
                format!("{:.1} ms", v / 1000.0)
            } else {
                format!("{v:.0} µs")
            }
        } else {
            format!("{v:.2}")
        }
    };
    if row.unit == "s" {
        return format!("{:.2} s", row.p50);
    }
    if row.measure == "mean-step" {
        return fmt(row.p50);
    }
    format!("{} ({})", fmt(row.p50), fmt(row.p99))
}

/// The markdown of one run: what ran where, then one table of the compared
/// measure with a column per system and datapath and the ratios to Open MPI
/// (TCP: to the run without programs).
fn render_run(run: &RunFile) -> String {
    let measure = compared_measure(&run.bench);
    let train = run.bench == "train";
    // Train: a line per measure; the others: a line per size.
    let key_of = |r: &Row| if train { TRAIN_MEASURES.iter().position(|(m, _)| *m == r.measure).unwrap_or(usize::MAX) as u64 } else { r.bytes };
    let rows: Vec<&Row> =
        run.rows.iter().filter(|r| if train { key_of(r) != usize::MAX as u64 } else { r.measure == measure }).collect();
    let mut out = format!(
        "### {} on {} hosts, MTU {} (run {}, source {}, {} CPUs)\n\n",
        run.bench,
        run.hosts,
        run.mtu,
        run.timestamp,
        run.source.as_deref().unwrap_or("unknown"),
        run.cpus
    );
    for network in &run.networks {
        let systems: Vec<String> = {
            let mut names: Vec<String> = run.rows.iter().filter(|r| r.network == network.kind).map(|r| r.system.clone()).collect();
            names.dedup();
            names.sort();
            names.dedup();
            names
        };
        out += &format!("- {}: {}\n", if systems.is_empty() { "(nothing measured)".into() } else { systems.join(", ") }, network.description);
    }
    for note in &run.notes {
        out += &format!("- {note}\n");
    }
    let mut columns: Vec<String> = Vec::new();
    for row in &rows {
        let name = label(row);
        if !columns.contains(&name) {
            columns.push(name);
        }
    }
    // Ratios: each AggBox column to each peer measured (TCP: with programs
    // to without).
    let baselines: &[&str] = if run.bench == "tcp" { &["TCP (iperf3) without programs"] } else { &["Open MPI", "Gloo"] };
    let mut ratios: Vec<(&String, &str)> = Vec::new();
    for baseline in baselines.iter().filter(|b| columns.iter().any(|c| c == *b)) {
        for column in columns.iter().filter(|c| !baselines.contains(&c.as_str()) && (c.starts_with("AggBox") || run.bench == "tcp")) {
            ratios.push((column, baseline));
        }
    }
    let (what, unit) = match run.bench.as_str() {
        "tcp" => ("throughput of one iperf3 run between hosts 0 and 1, p50 (p99) of the runs", "Gbit/s"),
        "train" => ("each rank times its own training steps (no barrier between them); the slowest rank's time of a step, p50 (p99) over the steps; \
                     the whole run's time per step; the time to the target loss (see above)", ""),
        _ => ("a barrier, then each rank times its own call; the slowest rank's time, p50 (p99)", ""),
    };
    out += &format!("\n{what}{}:\n\n", if unit.is_empty() { String::new() } else { format!(", {unit}") });
    let first = match run.bench.as_str() {
        "allreduce" => "f32 elements",
        "broadcast" => "size",
        "train" => "measure",
        _ => "operation",
    };
    let mut header = vec![first.to_string()];
    header.extend(columns.iter().cloned());
    header.extend(ratios.iter().map(|(c, baseline)| format!("{c} / {baseline}")));
    out += &format!("| {} |\n", header.join(" | "));
    out += &format!("|{}\n", " --- |".repeat(header.len()));
    let mut keys: Vec<u64> = rows.iter().map(|r| key_of(r)).collect();
    keys.sort_unstable();
    keys.dedup();
    for key in keys {
        let at = |column: &str| rows.iter().find(|r| key_of(r) == key && label(r) == column).copied();
        let any = rows.iter().find(|r| key_of(r) == key).copied();
        let bytes = key;
        let first = match (run.bench.as_str(), any.and_then(|r| r.count)) {
            ("allreduce", Some(count)) => format!("{} ({})", human_count(count), human_bytes(bytes)),
            ("broadcast", _) => human_bytes(bytes),
            ("train", _) => TRAIN_MEASURES[key as usize].1.to_string(),
            (bench, _) => bench.to_string(),
        };
        let mut line = vec![first];
        line.extend(columns.iter().map(|c| at(c).map_or("-".into(), cell)));
        for (column, baseline) in &ratios {
            line.push(match (at(column), at(baseline)) {
                (Some(a), Some(b)) if b.p50 > 0.0 => format!("{:.2}", a.p50 / b.p50),
                _ => "-".into(),
            });
        }
        out += &format!("| {} |\n", line.join(" | "));
    }
    out
}

/// The generated section: every latest run, each bench's plot named.
fn render(runs: &[&RunFile], source: &Path, plots: &[PathBuf]) -> String {
    let mut out = format!(
        "{BEGIN_MARKER}\n<!-- Generated by `aggbox bench report {}` from {} run files; do not edit by hand: \
         rerun the benches and the report. -->\n\n\
         The latest run of each bench, host count and MTU in `{}`. Each system ran on the network it would run on: \
         AggBox on its own cluster (each run says which: a plain bridge with AggBox's programs on the TC hooks, or \
         a bare XDP program on every bridge port, which the reductions' XDP_TX replies need), \
         Open MPI and Gloo on a plain bridge with no program on any interface, same hosts, same MTU, in the same run, \
         one cluster at a time; TCP between two hosts of a plain bridge without and with AggBox's programs on the hosts.\n\n",
        source.display(),
        runs.len(),
        source.display()
    );
    if runs.iter().any(|r| r.rows.iter().any(|row| row.system == "Gloo")) {
        out += "Gloo's small operations take milliseconds on this machine kind, whose idle vCPUs are slow to wake: \
                see bench/gloo/README.md, Pitfalls.\n\n";
    }
    if runs.is_empty() {
        out += "No run files.\n\n";
    }
    for run in runs {
        out += &render_run(run);
        out += "\n";
    }
    if !plots.is_empty() {
        let names: Vec<String> = plots.iter().map(|p| format!("`{}`", p.display())).collect();
        out += &format!(
            "Plots (p50 of the slowest rank's time, log scale, against the size on a log scale; barrier: against the hosts; \
             train: the loss against the time; one line per system and MTU): {}.\n\n",
            names.join(", ")
        );
    }
    out += END_MARKER;
    out
}

/// `doc` with its generated section replaced by `section` (appended at the
/// end, after a heading, when `doc` has no markers).
fn splice(doc: &str, section: &str) -> Result<String, String> {
    match (doc.find(BEGIN_MARKER), doc.find(END_MARKER)) {
        (Some(begin), Some(end)) if begin < end => {
            Ok(format!("{}{section}{}", &doc[..begin], &doc[end + END_MARKER.len()..]))
        }
        (None, None) => Ok(format!(
            "{}\n\n## Measured, generated from the run files (`aggbox bench report`)\n\n{section}\n",
            doc.trim_end()
        )),
        _ => Err(format!("the markers {BEGIN_MARKER} and {END_MARKER} are not one pair in that order")),
    }
}

/// `aggbox bench report DIR`: prints the generated section made from the
/// run files in `dir`, writes one plot per bench and host count into `dir`
/// (`<bench>-<hosts>hosts.png`, every MTU's latest run on it) and, unless
/// `dry_run`, rewrites the section of `doc` between [`BEGIN_MARKER`] and
/// [`END_MARKER`], leaving the rest of the file as it was.
pub fn report(dir: &Path, doc: &Path, dry_run: bool) -> Result<(), String> {
    let runs = read_runs(dir)?;
    let chosen = latest(&runs);
    let mut plots = Vec::new();
    // Barrier: one plot, against hosts; the others one per host count.
    let mut groups: BTreeMap<(String, usize), Vec<&RunFile>> = BTreeMap::new();
    for run in &chosen {
        if run.bench != "tcp" {
            let hosts = if run.bench == "barrier" { 0 } else { run.hosts };
            groups.entry((run.bench.clone(), hosts)).or_default().push(run);
        }
    }
    for ((bench, hosts), group) in &groups {
        let mut mtus: Vec<String> = group.iter().map(|r| r.mtu.to_string()).collect();
        mtus.dedup();
        let (path, title) = if *hosts == 0 {
            (dir.join(format!("{bench}.png")), format!("{bench}, MTU {}", mtus.join(", ")))
        } else {
            (dir.join(format!("{bench}-{hosts}hosts.png")), format!("{bench} on {hosts} hosts, MTU {}", mtus.join(", ")))
        };
        plot(&path, &title, bench, group)?;
        plots.push(path);
    }
    let section = render(&chosen, dir, &plots);
    println!("{section}");
    if dry_run {
        return Ok(());
    }
    let text = fs::read_to_string(doc).map_err(|e| format!("reading {}: {e}", doc.display()))?;
    let spliced = splice(&text, &section).map_err(|e| format!("{}: {e}", doc.display()))?;
    fs::write(doc, spliced).map_err(|e| format!("writing {}: {e}", doc.display()))?;
    eprintln!("aggbox: rewrote the generated section of {} from {} run files", doc.display(), chosen.len());
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn row(system: &str, datapath: Option<&str>, network: &str, bytes: u64, p50: f64) -> Row {
        Row {
            system: system.into(),
            datapath: datapath.map(Into::into),
            network: network.into(),
            mtu: 1500,
            bytes,
            count: None,
            measure: "slowest".into(),
            unit: "us".into(),
            p50,
            p99: p50 * 2.0,
            rounds: 10,
        }
    }

    fn run() -> RunFile {
        let mut run = RunFile::new("broadcast", 4, 1500);
        run.timestamp = "20260101T000000Z".into();
        run.source = Some("abc".into());
        run.networks = vec![
            Network { kind: "aggbox".into(), description: "AggBox net".into(), tso: "off [fixed]".into() },
            Network { kind: "plain".into(), description: "plain net".into(), tso: "on".into() },
        ];
        run.rows = vec![
            row("AggBox", Some("kernel"), "aggbox", 64, 100.0),
            row("AggBox", Some("kernel"), "aggbox", 1024, 300.0),
            row("Open MPI", None, "plain", 64, 50.0),
            row("Open MPI", None, "plain", 1024, 100.0),
        ];
        run
    }

    #[test]
    fn timestamps_are_utc_dates() {
        assert_eq!(timestamp(UNIX_EPOCH), "19700101T000000Z");
        let t = UNIX_EPOCH + std::time::Duration::from_secs(951_827_696); // 2000-02-29 12:34:56
        assert_eq!(timestamp(t), "20000229T123456Z");
        assert_eq!(civil_from_days(-1), (1969, 12, 31));
    }

    #[test]
    fn run_files_round_trip_through_json() {
        let run = run();
        let text = serde_json::to_string(&run).unwrap();
        assert_eq!(serde_json::from_str::<RunFile>(&text).unwrap(), run);
    }

    #[test]
    fn a_run_renders_its_rows_and_ratios_to_open_mpi() {
        let text = render_run(&run());
        assert!(text.contains("| size | AggBox kernel | Open MPI | AggBox kernel / Open MPI |"), "{text}");
        assert!(text.contains("| 64 B | 100 µs (200 µs) | 50 µs (100 µs) | 2.00 |"), "{text}");
        assert!(text.contains("| 1 KiB | 300 µs (600 µs) | 100 µs (200 µs) | 3.00 |"), "{text}");
        assert!(text.contains("- Open MPI: plain net"), "{text}");
        assert!(text.contains("- AggBox: AggBox net"), "{text}");
    }

    #[test]
    fn without_open_mpi_there_is_no_ratio() {
        let mut run = run();
        run.rows.retain(|r| r.system != "Open MPI");
        let text = render_run(&run);
        assert!(text.contains("| size | AggBox kernel |\n"), "{text}");
        assert!(!text.contains("/ Open MPI"), "{text}");
    }

    #[test]
    fn the_latest_run_of_each_bench_and_mtu_is_reported() {
        let (mut old, mut new, mut other) = (run(), run(), run());
        new.timestamp = "20260102T000000Z".into();
        other.mtu = 9000;
        other.timestamp = "20250101T000000Z".into();
        let mut runs = vec![old.clone(), new.clone(), other.clone()];
        runs.sort_by(|a, b| a.timestamp.cmp(&b.timestamp));
        let chosen = latest(&runs);
        assert_eq!(chosen.len(), 2);
        assert_eq!(chosen[0].timestamp, new.timestamp);
        assert_eq!(chosen[1].mtu, 9000);
        old.bench = "tcp".into();
        other.bench = "barrier".into();
        let runs = [old, other, new];
        let order: Vec<&str> = latest(&runs).iter().map(|r| r.bench.as_str()).collect();
        assert_eq!(order, ["broadcast", "barrier", "tcp"]);
    }

    #[test]
    fn splicing_keeps_the_rest_of_the_document() {
        let doc = format!("# Title\n\nintro\n\n{BEGIN_MARKER}\nold\n{END_MARKER}\n\n## Later\ntext\n");
        let out = splice(&doc, &format!("{BEGIN_MARKER}\nnew\n{END_MARKER}")).unwrap();
        assert_eq!(out, format!("# Title\n\nintro\n\n{BEGIN_MARKER}\nnew\n{END_MARKER}\n\n## Later\ntext\n"));
        let appended = splice("# Title\n\nintro\n", &format!("{BEGIN_MARKER}\nnew\n{END_MARKER}")).unwrap();
        assert!(appended.starts_with("# Title\n\nintro\n\n## Measured"), "{appended}");
        assert!(appended.ends_with(&format!("{BEGIN_MARKER}\nnew\n{END_MARKER}\n")), "{appended}");
        assert!(splice(&format!("{END_MARKER}\n{BEGIN_MARKER}\n"), "x").is_err());
        assert!(splice(&format!("{BEGIN_MARKER}\n"), "x").is_err());
    }

    #[test]
    fn a_train_run_renders_a_line_per_measure_and_plots_its_curves() {
        let mut run = run();
        run.bench = "train".into();
        let measured = |system: &str, datapath: Option<&str>, network: &str, measure: &str, unit: &str, p50: f64| Row {
            measure: measure.into(),
            unit: unit.into(),
            p99: p50,
            ..row(system, datapath, network, 4_000_000, p50)
        };
        run.rows = vec![
            measured("AggBox", Some("kernel"), "aggbox", "slowest", "us", 30_000.0),
            measured("AggBox", Some("kernel"), "aggbox", "to-loss", "s", 3.0),
            measured("Open MPI", None, "plain", "slowest", "us", 20_000.0),
            measured("Open MPI", None, "plain", "mean-step", "us", 21_000.0),
            measured("Open MPI", None, "plain", "to-loss", "s", 1.5),
        ];
        let curve = |system: &str, datapath: Option<&str>| Curve {
            system: system.into(),
            datapath: datapath.map(Into::into),
            network: "plain".into(),
            mtu: 1500,
            points: vec![(0.1, 2.3), (0.2, 2.1), (0.3, 2.0)],
        };
        run.curves = vec![curve("AggBox", Some("kernel")), curve("Open MPI", None)];
        let text = render_run(&run);
        assert!(text.contains("| measure | AggBox kernel | Open MPI | AggBox kernel / Open MPI |"), "{text}");
        assert!(text.contains("| time per step (slowest rank) | 30.0 ms (30.0 ms) | 20.0 ms (20.0 ms) | 1.50 |"), "{text}");
        assert!(text.contains("| time per step (whole run) | - | 21.0 ms | - |"), "{text}");
        assert!(text.contains("| time to the target loss | 3.00 s | 1.50 s | 2.00 |"), "{text}");
        let dir = std::env::temp_dir().join(format!("aggbox-results-train-test-{}", std::process::id()));
        let written = run.write(&dir).unwrap();
        assert_eq!(&fs::read(&written[1]).unwrap()[..8], b"\x89PNG\r\n\x1a\n");
        let back: RunFile = serde_json::from_str(&fs::read_to_string(&written[0]).unwrap()).unwrap();
        assert_eq!(back, run);
        fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn a_plot_is_a_png() {
        let dir = std::env::temp_dir().join(format!("aggbox-results-test-{}", std::process::id()));
        let mut run = run();
        let written = run.write(&dir).unwrap();
        assert_eq!(written.len(), 2);
        let png = fs::read(&written[1]).unwrap();
        assert_eq!(&png[..8], b"\x89PNG\r\n\x1a\n");
        let back: RunFile = serde_json::from_str(&fs::read_to_string(&written[0]).unwrap()).unwrap();
        assert_eq!(back, run);
        fs::remove_dir_all(&dir).unwrap();
    }
}
