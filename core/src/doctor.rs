//! `aggbox doctor`: what this host supports, which datapath `auto` would
//! choose, and the fix for each missing piece.
//!
//! The XDP and TC checks are real: they load AggBox's programs, attach them
//! to the interface (XDP first in driver mode, then SKB mode) and detach them
//! at once. The XDP program passes every frame that is not AggBox's, so this
//! does not disturb traffic on veth and virtual NICs; on some physical NICs
//! attaching XDP in driver mode briefly resets the queues.

use std::{fs, net::Ipv4Addr, path::Path};

use aya::programs::{tc::TcAttachType, SchedClassifier, Xdp, XdpMode};

use crate::{
    bpf,
    error::chain,
    loader::{self, XdpAttachMode},
    netif::{self, Interface},
    Datapath, Result,
};

/// One line of the report.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Check {
    /// What was checked.
    pub name: &'static str,
    /// Whether it is there.
    pub ok: bool,
    /// What was found.
    pub detail: String,
    /// How to get it, when it is missing.
    pub fix: Option<String>,
    /// Whether the kernel datapath needs it.
    pub needed_by_kernel: bool,
}

/// The whole report.
#[derive(Clone, Debug)]
pub struct Report {
    /// The interface examined.
    pub iface: Option<Interface>,
    /// Every check, in order.
    pub checks: Vec<Check>,
    /// What `AGGBOX_DATAPATH=auto` would choose here.
    pub auto: Datapath,
    /// Whether at least the user datapath can run.
    pub user_ok: bool,
}

/// Capability bits of interest (linux/capability.h).
const CAPS: [(&str, u32); 4] =
    [("CAP_NET_ADMIN", 12), ("CAP_SYS_ADMIN", 21), ("CAP_PERFMON", 38), ("CAP_BPF", 39)];

fn effective_caps() -> u64 {
    fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines()
                .find_map(|l| l.strip_prefix("CapEff:"))
                .and_then(|hex| u64::from_str_radix(hex.trim(), 16).ok())
        })
        .unwrap_or(0)
}

fn kernel_release() -> String {
    fs::read_to_string("/proc/sys/kernel/osrelease").map(|s| s.trim().to_string()).unwrap_or_else(|_| "unknown".into())
}

fn check(name: &'static str, ok: bool, detail: String, fix: &str, needed_by_kernel: bool) -> Check {
    Check { name, ok, detail, fix: (!ok).then(|| fix.to_string()), needed_by_kernel }
}

/// Attaches the XDP ingress program to `iface` (driver, then SKB mode) and
/// detaches it at once; says which mode worked.
fn probe_xdp(iface: &Interface) -> std::result::Result<XdpAttachMode, String> {
    let mut obj = aya::Ebpf::load(bpf::XDP_PASS).map_err(|e| format!("loading an XDP program: {}", chain(&e)))?;
    let xdp: &mut Xdp = obj
        .program_mut(bpf::programs::XDP_PASS)
        .ok_or("XDP program missing")?
        .try_into()
        .map_err(|e| format!("{e}"))?;
    xdp.load().map_err(|e| format!("loading an XDP program: {}", chain(&e)))?;
    let driver = xdp.attach_to_if_index(iface.index, XdpMode::Driver);
    let mode = match driver {
        Ok(id) => {
            let _ = xdp.detach(id);
            XdpAttachMode::Driver
        }
        Err(driver_err) => match xdp.attach_to_if_index(iface.index, XdpMode::Skb) {
            Ok(id) => {
                let _ = xdp.detach(id);
                XdpAttachMode::Skb
            }
            Err(skb_err) => return Err(format!("driver mode: {}; SKB mode: {}", chain(&driver_err), chain(&skb_err))),
        },
    };
    Ok(mode)
}

/// Attaches the TC egress program to `iface` and detaches it at once.
fn probe_tc(iface: &Interface) -> std::result::Result<(), String> {
    let mut obj = aya::Ebpf::load(bpf::FAULT).map_err(|e| format!("loading a TC program: {}", chain(&e)))?;
    let tc: &mut SchedClassifier = obj
        .program_mut(bpf::programs::FAULT)
        .ok_or("TC program missing")?
        .try_into()
        .map_err(|e| format!("{e}"))?;
    tc.load().map_err(|e| format!("loading a TC program: {}", chain(&e)))?;
    let id = tc.attach(&iface.name, TcAttachType::Egress).map_err(|e| format!("attaching at TC egress: {}", chain(&e)))?;
    tc.detach(id).map_err(|e| format!("detaching: {e}"))
}

/// Runs every check on `iface` (or the interface that reaches `toward`, or
/// the first non-loopback one).
pub fn diagnose(iface: Option<&str>, toward: Option<Ipv4Addr>) -> Result<Report> {
    let mut checks = Vec::new();
    checks.push(check("kernel", true, format!("Linux {}", kernel_release()), "", false));

    let caps = effective_caps();
    let missing: Vec<&str> = CAPS
        .iter()
        .filter(|(name, bit)| caps & (1 << bit) == 0 && *name != "CAP_PERFMON")
        .map(|(name, _)| *name)
        .collect();
    checks.push(check(
        "capabilities",
        missing.is_empty(),
        if missing.is_empty() { "CAP_BPF, CAP_NET_ADMIN and CAP_SYS_ADMIN present".into() } else { format!("missing {}", missing.join(", ")) },
        "run as root, or grant the process CAP_BPF, CAP_NET_ADMIN and CAP_PERFMON (setcap or the container's capabilities)",
        true,
    ));

    let btf = Path::new("/sys/kernel/btf/vmlinux").exists();
    checks.push(check(
        "btf",
        btf,
        if btf { "/sys/kernel/btf/vmlinux present".into() } else { "no /sys/kernel/btf/vmlinux".into() },
        "use a kernel built with CONFIG_DEBUG_INFO_BTF=y",
        true,
    ));

    let bpffs = loader::bpffs_root();
    checks.push(check(
        "bpffs",
        bpffs.is_ok(),
        match &bpffs {
            Ok(path) => format!("pins go to {}", path.join("aggbox").display()),
            Err(e) => e.to_string(),
        },
        "mount -t bpf bpf /sys/fs/bpf",
        true,
    ));

    let program = crate::testrun::Harness::new().map(drop).map_err(|e| e.to_string());
    checks.push(check(
        "bpf syscall",
        program.is_ok(),
        match &program {
            Ok(()) => "the AggBox programs load and pass the verifier".into(),
            Err(e) => format!("loading the AggBox programs failed: {e}"),
        },
        "needs CAP_BPF (see capabilities) and a kernel with CONFIG_BPF_SYSCALL; check kernel.unprivileged_bpf_disabled",
        true,
    ));

    let chosen = match (iface, toward) {
        (Some(name), _) => netif::choose(Some(name), Ipv4Addr::UNSPECIFIED).map(Some),
        (None, Some(addr)) => netif::choose(None, addr).map(Some),
        (None, None) => Ok(netif::list()?.into_iter().find(|i| !i.is_loopback())),
    };
    let chosen = match chosen {
        Ok(found) => found,
        Err(e) => {
            checks.push(check("interface", false, e.to_string(), "pass --iface NAME (or set AGGBOX_IFACE)", false));
            None
        }
    };
    let mut user_ok = false;
    if let Some(iface) = &chosen {
        let udp = crate::transport::Transport::bind(iface.ipv4, 0);
        user_ok = udp.is_ok();
        checks.push(check(
            "interface",
            user_ok,
            format!("{} ({}, MTU {}, UDP {})", iface.name, iface.ipv4, iface.mtu, if user_ok { "ok" } else { "bind failed" }),
            "free a UDP port in 47000..47064 or set AGGBOX_PORT",
            false,
        ));
        let (tc_hooks, why) = match loader::HooksChoice::from_env() {
            Ok(choice) => choice.wants_tc(iface),
            Err(e) => {
                checks.push(check("hooks", false, e.to_string(), "set AGGBOX_HOOKS to auto, xdp or tc", true));
                (true, "")
            }
        };
        let hooks = if tc_hooks { "TC" } else { "XDP and TC" };
        let pinned = loader::pin_dir(iface, tc_hooks).ok().filter(|d| d.exists());
        if let Some(dir) = pinned {
            // Attached already: probing would collide with it.
            let mode = if dir.join("xdp_drv").exists() {
                "XDP in driver mode, and TC"
            } else if dir.join("xdp_skb").exists() {
                "XDP in SKB mode, and TC"
            } else {
                "TC only"
            };
            checks.push(check("hooks", true, format!("AggBox is attached to {} ({mode}); shared", iface.name), "", true));
        } else if iface.is_loopback() {
            checks.push(check("hooks", false, format!("{} is loopback", iface.name), "choose a network interface with --iface", true));
        } else {
            checks.push(check("hooks", true, format!("{hooks} programs on {}: {why}", iface.name), "", false));
            if !tc_hooks {
                let xdp = probe_xdp(iface);
                checks.push(check(
                    "xdp",
                    xdp.is_ok(),
                    match &xdp {
                        Ok(mode) => format!("attaches to {} in {} mode", iface.name, mode.name()),
                        Err(e) => format!("cannot attach to {}: {e}", iface.name),
                    },
                    "needs CAP_NET_ADMIN and a kernel with XDP; a driver without native XDP still gets SKB mode",
                    true,
                ));
            }
            let tc = probe_tc(iface);
            checks.push(check(
                "tc",
                tc.is_ok(),
                match &tc {
                    Ok(()) => format!("TC ingress/egress programs attach to {} (TCX)", iface.name),
                    Err(e) => format!("cannot attach to {}: {e}", iface.name),
                },
                "needs CAP_NET_ADMIN and Linux 6.6 or later (TCX links)",
                true,
            ));
        }
    }
    let kernel_ok = chosen.is_some() && checks.iter().filter(|c| c.needed_by_kernel).all(|c| c.ok);
    Ok(Report { iface: chosen, checks, auto: if kernel_ok { Datapath::Kernel } else { Datapath::User }, user_ok })
}

impl Report {
    /// The report as text: one line per check, then the choice of `auto`.
    pub fn render(&self) -> String {
        let mut out = String::new();
        for c in &self.checks {
            out.push_str(&format!("{:<4} {:<13} {}\n", if c.ok { "ok" } else { "FAIL" }, c.name, c.detail));
            if let Some(fix) = &c.fix {
                out.push_str(&format!("     {:<13} fix: {fix}\n", ""));
            }
        }
        let why: Vec<&str> = self.checks.iter().filter(|c| c.needed_by_kernel && !c.ok).map(|c| c.name).collect();
        match self.auto {
            Datapath::Kernel => out.push_str("datapath: auto would choose kernel\n"),
            _ if why.is_empty() => out.push_str("datapath: auto would choose user (no usable interface)\n"),
            _ => out.push_str(&format!("datapath: auto would choose user (kernel datapath unavailable: {} failed)\n", why.join(", "))),
        }
        if !self.user_ok {
            out.push_str("the user datapath cannot run either: see the interface line\n");
        }
        let memory = crate::maps::window_memory();
        let total: usize = memory.iter().map(|(_, bytes)| bytes).sum();
        let parts: Vec<String> = memory.iter().map(|(what, bytes)| format!("{what} {:.1}", *bytes as f64 / (1 << 20) as f64)).collect();
        out.push_str(&format!(
            "kernel window memory per attached interface: {:.1} MiB ({} MiB), for the first {} communicators (the mmapable maps, fixed at build time; with the other shared maps an attachment pins about 61 MiB: Attachment::map_memory measures it)\n",
            total as f64 / (1 << 20) as f64,
            parts.join(", "),
            crate::maps::CTL_SLOTS
        ));
        out
    }
}
