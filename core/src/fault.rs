//! Fault injection for the virtual cluster (this kernel has no netem).
//!
//! [`FaultInjector`] loads `ebpf/fault.bpf.c` with the rates of a
//! [`FaultSpec`] and attaches it at TC egress of one bridge-side veth, so every
//! frame the bridge delivers to that host passes it once: UDP frames whose
//! destination port is in the spec's range are dropped, duplicated or delayed
//! at random, and counted. [`crate::cluster::Cluster::inject_faults`] puts one
//! on every host's port.
//!
//! Delaying (reordering) needs a second, slower path, and this kernel has no
//! netem, fq or etf: when a spec reorders, the injector first puts an HTB
//! qdisc at the root of the interface (with `tc`), whose direct queue sends
//! every frame unshaped, and whose one class, rate-limited to
//! [`SLOW_PATH_RATE_BITS`], holds the delayed frames. The program picks a frame
//! for that class by setting its `skb->priority` to the class id (TC egress
//! runs before the root qdisc). HTB sends its direct queue first, so frames
//! sent later overtake a delayed one whenever the slow class is waiting for
//! its rate: each delayed frame holds the class for at least
//! [`SLOW_PATH_MIN_FRAME`] bytes' worth of that rate (100 µs), and the next
//! delayed frame waits for it. The first delayed frame after a quiet spell
//! may thus leave at once; under traffic they are overtaken. Nothing is lost
//! while at most [`SLOW_PATH_QUEUE`] frames wait. Dropping the injector
//! removes the qdisc (frames still waiting in it are then lost).

use std::{
    fs::File,
    io,
    os::{fd::AsRawFd, unix::process::CommandExt},
    path::Path,
    process::Command,
    str::FromStr,
    sync::OnceLock,
};

use aya::{
    maps::PerCpuArray,
    programs::{
        links::FdLink,
        tc::{self, SchedClassifierLinkId},
        SchedClassifier, TcAttachType,
    },
    Ebpf, EbpfLoader,
};

use crate::{bpf, Error, Result};

/// Rates are given in parts per million of the frames in the port range.
pub const PER_MILLION: u32 = 1_000_000;

/// Parts per million in one percent.
const PPM_PER_PERCENT: f64 = (PER_MILLION / 100) as f64;

/// Name of the counters map in the fault object.
const STATS_MAP: &str = "fault_stats";

/// Indexes of the counters in [`STATS_MAP`] (`enum fault_stat` in the C source).
mod stat {
    pub const SEEN: u32 = 0;
    pub const DROPPED: u32 = 1;
    pub const DUPLICATED: u32 = 2;
    pub const DELAYED: u32 = 3;
}

/// Names of the program's `volatile const` globals.
mod global {
    pub const DROP_PPM: &str = "drop_ppm";
    pub const DUP_PPM: &str = "dup_ppm";
    pub const REORDER_PPM: &str = "reorder_ppm";
    pub const DELAY_PRIORITY: &str = "delay_priority";
    pub const PORT_LO: &str = "port_lo";
    pub const PORT_HI: &str = "port_hi";
}

/// The rate of the slow class that delayed frames wait in, in bits per
/// second.
pub const SLOW_PATH_RATE_BITS: u64 = 100_000_000;
/// A delayed frame smaller than this many bytes is charged this many to the
/// slow class's rate (HTB's `mpu`), so that every delayed frame holds the
/// class for at least 100 µs, however small it is.
pub const SLOW_PATH_MIN_FRAME: u32 = 1250;
/// How many delayed frames may wait in the slow class at once; more are
/// dropped by the qdisc (and not counted as dropped).
pub const SLOW_PATH_QUEUE: u32 = 10_000;

/// The HTB qdisc of the slow path, as `tc` writes them.
mod slow {
    /// Handle of the root HTB qdisc (`ab0f:`).
    pub const QDISC: &str = "ab0f:";
    /// The slow class, under the root (`ab0f:2`).
    pub const CLASS: &str = "ab0f:2";
    /// The same class as the `skb->priority` that picks it: major:minor.
    pub const CLASS_ID: u32 = 0xab0f_0002;
    /// Handle of the class's leaf FIFO.
    pub const LEAF: &str = "ab10:";
    /// Unclassified frames (priority 0 and any other that names no class)
    /// go to HTB's unshaped direct queue: there is no class of minor 0.
    pub const DEFAULT_MINOR: &str = "0";
    /// Room in the direct queue, where the frames that are not delayed wait
    /// (a veth has no queue of its own): as much as the slow class has.
    pub const DIRECT_QUEUE: u32 = super::SLOW_PATH_QUEUE;
    /// Bytes of the class's bucket: none to speak of, so that a delayed
    /// frame waits for the one before it.
    pub const BURST: &str = "1b";
    /// Bytes the class sends per round; there is one class, so it only has to
    /// be in the range HTB does not warn about.
    pub const QUANTUM: u32 = 1514;
}

/// Where `tc` may be, first match wins; else it is looked up in `PATH`.
const TC_CANDIDATES: [&str; 4] = ["/usr/sbin/tc", "/sbin/tc", "/usr/bin/tc", "/bin/tc"];

/// The network namespace of the calling thread.
const THREAD_NETNS: &str = "/proc/thread-self/ns/net";

/// What to do to the UDP frames delivered to a host.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct FaultSpec {
    /// Frames dropped, in parts per million.
    pub drop_ppm: u32,
    /// Frames not dropped that are delivered twice, in parts per million.
    pub dup_ppm: u32,
    /// Frames not dropped that are delayed, so that frames sent after them
    /// may arrive first, in parts per million (see the [module](self) for
    /// how long). A duplicate is never delayed; its original may be.
    pub reorder_ppm: u32,
    /// Lowest UDP destination port affected.
    pub port_lo: u16,
    /// Highest UDP destination port affected (inclusive).
    pub port_hi: u16,
}

impl FaultSpec {
    /// No faults, on all UDP ports.
    pub const NONE: FaultSpec = FaultSpec {
        drop_ppm: 0,
        dup_ppm: 0,
        reorder_ppm: 0,
        port_lo: 0,
        port_hi: u16::MAX,
    };

    /// Drops `drop` percent of the UDP frames on every port, and duplicates
    /// `duplicate` percent of those it does not drop; delays none (see
    /// [`FaultSpec::reorder`]).
    ///
    /// # Panics
    ///
    /// If a percentage is not a number in `0.0..=100.0`.
    pub fn percent(drop: f64, duplicate: f64) -> Self {
        FaultSpec {
            drop_ppm: percent_to_ppm(drop),
            dup_ppm: percent_to_ppm(duplicate),
            ..Self::NONE
        }
    }

    /// The same faults, and `percent` percent of the frames not dropped
    /// delayed so that frames sent after them overtake them.
    ///
    /// # Panics
    ///
    /// If `percent` is not a number in `0.0..=100.0`.
    pub fn reorder(self, percent: f64) -> Self {
        FaultSpec {
            reorder_ppm: percent_to_ppm(percent),
            ..self
        }
    }

    /// The same faults, only on UDP destination ports `lo..=hi`.
    pub fn ports(self, lo: u16, hi: u16) -> Self {
        FaultSpec {
            port_lo: lo,
            port_hi: hi,
            ..self
        }
    }

    /// Whether this spec leaves every frame alone.
    pub fn is_none(&self) -> bool {
        self.drop_ppm == 0 && self.dup_ppm == 0 && self.reorder_ppm == 0
    }

    /// Checks that the rates are at most [`PER_MILLION`] and the port range
    /// is not empty.
    pub fn validate(&self) -> Result<()> {
        if self.drop_ppm > PER_MILLION || self.dup_ppm > PER_MILLION || self.reorder_ppm > PER_MILLION {
            return Err(Error::InvalidArgument(format!(
                "fault rates are parts per million, at most {PER_MILLION}: {self:?}"
            )));
        }
        if self.port_lo > self.port_hi {
            return Err(Error::InvalidArgument(format!(
                "empty fault port range {}..={}",
                self.port_lo, self.port_hi
            )));
        }
        Ok(())
    }
}

impl Default for FaultSpec {
    fn default() -> Self {
        Self::NONE
    }
}

/// Parses `DROP,DUP` or `DROP,DUP,REORDER`: percentages, each may end with
/// `%` (`"10,2"`, `"10%,2%,5%"`), as [`FaultSpec::percent`] and
/// [`FaultSpec::reorder`] take them, on every port.
impl FromStr for FaultSpec {
    type Err = Error;

    fn from_str(text: &str) -> Result<Self> {
        let bad = || {
            Error::InvalidArgument(format!(
                "fault spec {text:?}: expected DROP%,DUP% or DROP%,DUP%,REORDER%, percentages in 0..=100, such as 10,2,5"
            ))
        };
        let percents = text
            .split(',')
            .map(|part| {
                let percent: f64 = part.trim().trim_end_matches('%').trim().parse().map_err(|_| bad())?;
                if (0.0..=100.0).contains(&percent) {
                    Ok(percent)
                } else {
                    Err(bad())
                }
            })
            .collect::<Result<Vec<f64>>>()?;
        match percents[..] {
            [drop, dup] => Ok(FaultSpec::percent(drop, dup)),
            [drop, dup, reorder] => Ok(FaultSpec::percent(drop, dup).reorder(reorder)),
            _ => Err(bad()),
        }
    }
}

fn percent_to_ppm(percent: f64) -> u32 {
    assert!(
        (0.0..=100.0).contains(&percent),
        "a fault percentage must be in 0..=100, not {percent}"
    );
    (percent * PPM_PER_PERCENT).round() as u32
}

/// What the fault program did to the frames delivered to one host.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct FaultStats {
    /// UDP frames in the port range that reached the program (duplicates it
    /// made are not counted again).
    pub seen: u64,
    /// Of those, how many it dropped.
    pub dropped: u64,
    /// Of those, how many it delivered twice.
    pub duplicated: u64,
    /// Of those, how many it delayed through the slow class (still
    /// delivered: frames sent after them may arrive first).
    pub delayed: u64,
}

impl FaultStats {
    /// How many frames in the port range it delivered: `seen - dropped +
    /// duplicated` (delayed frames are delivered too, later).
    pub fn delivered(&self) -> u64 {
        self.seen - self.dropped + self.duplicated
    }
}

/// Wraps a BPF library error with what AggBox was doing.
pub(crate) fn bpf_error(context: impl Into<String>, err: impl std::error::Error + Send + Sync + 'static) -> Error {
    Error::system(context, io::Error::other(err))
}

/// The `tc` binary of iproute2.
fn tc_binary() -> &'static str {
    static TC: OnceLock<&'static str> = OnceLock::new();
    TC.get_or_init(|| {
        TC_CANDIDATES
            .into_iter()
            .find(|path| Path::new(path).exists())
            .unwrap_or("tc")
    })
}

/// Runs `tc <args>` inside network namespace `netns`, failing with its
/// stderr.
fn tc_in(netns: &File, args: &[&str]) -> Result<()> {
    let context = format!("tc {}", args.join(" "));
    let fd = netns.as_raw_fd();
    let mut command = Command::new(tc_binary());
    command.args(args);
    // SAFETY: setns is a plain system call, safe between fork and exec; it
    // moves the child only, and `netns` stays open until the child is done.
    unsafe {
        command.pre_exec(move || {
            if libc::setns(fd, libc::CLONE_NEWNET) == 0 {
                Ok(())
            } else {
                Err(io::Error::last_os_error())
            }
        });
    }
    let output = match command.output() {
        Ok(output) => output,
        Err(e) if e.kind() == io::ErrorKind::NotFound => {
            return Err(Error::Unsupported(format!(
                "reordering frames needs tc of iproute2 (apt-get install iproute2): {context}: {e}"
            )))
        }
        Err(e) => return Err(Error::system(context, e)),
    };
    if output.status.success() {
        return Ok(());
    }
    let stderr = String::from_utf8_lossy(&output.stderr).trim().to_string();
    if stderr.contains("qdisc kind is unknown") {
        return Err(Error::Unsupported(format!(
            "reordering frames needs the HTB and pfifo qdiscs (CONFIG_NET_SCH_HTB): {context}: {stderr}"
        )));
    }
    Err(Error::system(
        context,
        io::Error::other(format!("{} ({})", stderr, output.status)),
    ))
}

/// The slow path of delayed frames: an HTB qdisc at the root of one
/// interface, with one rate-limited class (see the [module](self)). Dropping
/// it removes the qdisc, from whatever thread, in the namespace it was made
/// in.
#[derive(Debug)]
struct SlowPath {
    /// The network namespace of the interface.
    netns: File,
    iface: String,
    /// Set once the qdisc is removed or is to outlive this value.
    done: bool,
}

impl SlowPath {
    /// Puts the qdisc at the root of `iface`, in the network namespace of the
    /// calling thread. Fails, leaving the interface alone, if it has a root
    /// qdisc already.
    fn install(iface: &str) -> Result<Self> {
        let netns = File::open(THREAD_NETNS).map_err(|e| Error::system(format!("opening {THREAD_NETNS}"), e))?;
        let (direct, rate, mpu, quantum, limit) = (
            slow::DIRECT_QUEUE.to_string(),
            format!("{SLOW_PATH_RATE_BITS}bit"),
            SLOW_PATH_MIN_FRAME.to_string(),
            slow::QUANTUM.to_string(),
            SLOW_PATH_QUEUE.to_string(),
        );
        #[rustfmt::skip]
        tc_in(&netns, &["qdisc", "add", "dev", iface, "root", "handle", slow::QDISC, "htb",
                        "default", slow::DEFAULT_MINOR, "direct_qlen", &direct])?;
        // From here on dropping `path` removes the qdisc.
        let path = SlowPath {
            netns,
            iface: iface.to_string(),
            done: false,
        };
        #[rustfmt::skip]
        tc_in(&path.netns, &["class", "add", "dev", iface, "parent", slow::QDISC, "classid", slow::CLASS,
                             "htb", "rate", &rate, "ceil", &rate, "burst", slow::BURST, "cburst", slow::BURST,
                             "mpu", &mpu, "quantum", &quantum])?;
        #[rustfmt::skip]
        tc_in(&path.netns, &["qdisc", "add", "dev", iface, "parent", slow::CLASS, "handle", slow::LEAF,
                             "pfifo", "limit", &limit])?;
        Ok(path)
    }

    /// Removes the qdisc now, reporting a failure that dropping it would
    /// ignore.
    fn remove(mut self) -> Result<()> {
        self.done = true;
        self.delete()
    }

    /// Runs `tc qdisc del` for the qdisc.
    fn delete(&self) -> Result<()> {
        // Naming the handle removes only this qdisc, never another.
        tc_in(
            &self.netns,
            &["qdisc", "del", "dev", &self.iface, "root", "handle", slow::QDISC],
        )
    }

    /// Leaves the qdisc in place after this value is gone (it goes with the
    /// interface).
    fn keep(mut self) {
        self.done = true;
    }
}

impl Drop for SlowPath {
    fn drop(&mut self) {
        if self.done {
            return;
        }
        self.done = true;
        if let Err(e) = self.delete() {
            tracing::warn!(iface = %self.iface, error = %e, "could not remove the slow-path qdisc of the fault injector");
        }
    }
}

/// The fault program, loaded with one [`FaultSpec`] and attached at TC
/// egress of one interface, with the slow-path qdisc there if the spec
/// reorders. Dropping it detaches it and removes the qdisc.
#[derive(Debug)]
pub struct FaultInjector {
    ebpf: Ebpf,
    link: SchedClassifierLinkId,
    iface: String,
    /// Dropped after the program is detached (fields drop in order).
    slow_path: Option<SlowPath>,
}

impl FaultInjector {
    /// Loads the fault program with `spec` and attaches it at TC egress of
    /// `iface`, in the network namespace of the calling thread. If the spec
    /// reorders, first puts the slow-path HTB qdisc at the root of `iface`
    /// (with `tc`), and fails if `iface` has a root qdisc already.
    pub fn attach(iface: &str, spec: &FaultSpec) -> Result<Self> {
        spec.validate()?;
        let mut ebpf = EbpfLoader::new()
            .override_global(global::DROP_PPM, &spec.drop_ppm, true)
            .override_global(global::DUP_PPM, &spec.dup_ppm, true)
            .override_global(global::REORDER_PPM, &spec.reorder_ppm, true)
            .override_global(global::DELAY_PRIORITY, &slow::CLASS_ID, true)
            .override_global(global::PORT_LO, &spec.port_lo, true)
            .override_global(global::PORT_HI, &spec.port_hi, true)
            .load(bpf::FAULT)
            .map_err(|e| bpf_error("loading the fault object", e))?;
        let program: &mut SchedClassifier = ebpf
            .program_mut(bpf::programs::FAULT)
            .ok_or_else(|| Error::Internal(format!("no program {} in the fault object", bpf::programs::FAULT)))?
            .try_into()
            .map_err(|e| bpf_error("the fault program", e))?;
        program.load().map_err(|e| bpf_error("loading the fault program", e))?;
        // Before the program picks frames for it; removed again if the attach
        // below fails.
        let slow_path = if spec.reorder_ppm > 0 {
            Some(SlowPath::install(iface)?)
        } else {
            None
        };
        // Kernels before 6.6 attach TC programs through a clsact qdisc; with
        // TCX it is not needed. It may already be there, which is fine, and
        // any other failure shows up in the attach below.
        let _ = tc::qdisc_add_clsact(iface);
        let link = program
            .attach(iface, TcAttachType::Egress)
            .map_err(|e| bpf_error(format!("attaching the fault program at TC egress of {iface}"), e))?;
        Ok(FaultInjector {
            ebpf,
            link,
            iface: iface.to_string(),
            slow_path,
        })
    }

    /// The interface it is attached to.
    pub fn iface(&self) -> &str {
        &self.iface
    }

    /// Its counters, summed over CPUs.
    pub fn stats(&self) -> Result<FaultStats> {
        let map = self
            .ebpf
            .map(STATS_MAP)
            .ok_or_else(|| Error::Internal(format!("no map {STATS_MAP} in the fault object")))?;
        let counters: PerCpuArray<_, u64> =
            PerCpuArray::try_from(map).map_err(|e| bpf_error(format!("the {STATS_MAP} map"), e))?;
        let read = |index: u32| -> Result<u64> {
            let per_cpu = counters
                .get(&index, 0)
                .map_err(|e| bpf_error(format!("reading {STATS_MAP}[{index}]"), e))?;
            Ok(per_cpu.iter().sum())
        };
        Ok(FaultStats {
            seen: read(stat::SEEN)?,
            dropped: read(stat::DROPPED)?,
            duplicated: read(stat::DUPLICATED)?,
            delayed: read(stat::DELAYED)?,
        })
    }

    /// Pins its link at `path` (on a bpffs) so that it stays attached after
    /// this process exits, until the pin is removed or the interface goes.
    /// The slow-path qdisc, if any, stays too, until the interface goes.
    pub fn pin(mut self, path: &Path) -> Result<()> {
        let program: &mut SchedClassifier = self
            .ebpf
            .program_mut(bpf::programs::FAULT)
            .ok_or_else(|| Error::Internal("fault program vanished".into()))?
            .try_into()
            .map_err(|e| bpf_error("the fault program", e))?;
        let link = program
            .take_link(self.link)
            .map_err(|e| bpf_error("taking the fault link", e))?;
        let link = FdLink::try_from(link)
            .map_err(|e| bpf_error(format!("the fault link on {} is not a bpf_link", self.iface), e))?;
        link.pin(path)
            .map_err(|e| bpf_error(format!("pinning the fault link at {}", path.display()), e))?;
        if let Some(slow_path) = self.slow_path.take() {
            slow_path.keep();
        }
        Ok(())
    }

    /// Detaches it now and removes the slow-path qdisc, reporting a failure
    /// that dropping it would ignore.
    pub fn detach(mut self) -> Result<()> {
        let program: &mut SchedClassifier = self
            .ebpf
            .program_mut(bpf::programs::FAULT)
            .ok_or_else(|| Error::Internal("fault program vanished".into()))?
            .try_into()
            .map_err(|e| bpf_error("the fault program", e))?;
        let detached = program
            .detach(self.link)
            .map_err(|e| bpf_error(format!("detaching the fault program from {}", self.iface), e));
        let removed = self.slow_path.take().map_or(Ok(()), SlowPath::remove);
        detached.and(removed)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn percent_is_parts_per_million() {
        let spec = FaultSpec::percent(10.0, 2.5);
        assert_eq!(spec.drop_ppm, 100_000);
        assert_eq!(spec.dup_ppm, 25_000);
        assert_eq!((spec.port_lo, spec.port_hi), (0, u16::MAX));
        assert!(spec.validate().is_ok());
        assert!(FaultSpec::NONE.is_none());
        assert!(!spec.is_none());
    }

    #[test]
    fn bad_specs_are_refused() {
        assert!(FaultSpec {
            drop_ppm: PER_MILLION + 1,
            ..FaultSpec::NONE
        }
        .validate()
        .is_err());
        assert!(FaultSpec::percent(1.0, 0.0).ports(9, 8).validate().is_err());
        assert!(FaultSpec::percent(1.0, 0.0).ports(8, 8).validate().is_ok());
    }

    #[test]
    #[should_panic]
    fn negative_percent_panics() {
        FaultSpec::percent(-1.0, 0.0);
    }

    #[test]
    fn delivered_counts_duplicates_once_more() {
        let stats = FaultStats {
            seen: 100,
            dropped: 10,
            duplicated: 3,
            delayed: 7,
        };
        assert_eq!(stats.delivered(), 93);
    }

    #[test]
    fn reorder_is_parts_per_million_and_checked() {
        let spec = FaultSpec::percent(1.0, 2.0).reorder(12.5).ports(5, 6);
        assert_eq!(
            (spec.drop_ppm, spec.dup_ppm, spec.reorder_ppm),
            (10_000, 20_000, 125_000)
        );
        assert_eq!((spec.port_lo, spec.port_hi), (5, 6));
        assert!(spec.validate().is_ok());
        assert_eq!(FaultSpec::percent(1.0, 2.0).reorder_ppm, 0);
        assert!(!FaultSpec::NONE.reorder(0.1).is_none());
        assert!(FaultSpec::NONE.reorder(0.0).is_none());
        assert!(FaultSpec {
            reorder_ppm: PER_MILLION + 1,
            ..FaultSpec::NONE
        }
        .validate()
        .is_err());
    }

    #[test]
    #[should_panic]
    fn reorder_over_100_percent_panics() {
        FaultSpec::NONE.reorder(100.5);
    }

    #[test]
    fn specs_parse_from_percentages() {
        assert_eq!("10,2".parse::<FaultSpec>().unwrap(), FaultSpec::percent(10.0, 2.0));
        assert_eq!(
            "10%, 2%, 5%".parse::<FaultSpec>().unwrap(),
            FaultSpec::percent(10.0, 2.0).reorder(5.0)
        );
        assert_eq!("0,0,5".parse::<FaultSpec>().unwrap().reorder_ppm, 50_000);
        for bad in ["", "10", "10,2,5,1", "10,x", "101,0", "-1,0", "0,0,NaN", "1,,2"] {
            assert!(
                matches!(bad.parse::<FaultSpec>(), Err(Error::InvalidArgument(_))),
                "{bad:?} parsed"
            );
        }
    }

    #[test]
    fn the_slow_class_is_the_priority_the_program_sets() {
        let (major, minor) = slow::CLASS.split_once(':').unwrap();
        assert_eq!(slow::QDISC, format!("{major}:"));
        let id = u32::from_str_radix(major, 16).unwrap() << 16 | u32::from_str_radix(minor, 16).unwrap();
        assert_eq!(id, slow::CLASS_ID);
    }
}
