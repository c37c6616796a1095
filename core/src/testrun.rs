//! `BPF_PROG_TEST_RUN`: runs a loaded program on a crafted frame, without
//! attaching it anywhere, and returns its verdict and the frame it left.
//!
//! [`Harness`] loads the three AggBox programs with their shared maps
//! (unpinned: nothing is left behind), so a test can register a group and
//! feed each program good and malformed frames.

use std::{
    io,
    os::fd::{AsFd, AsRawFd, BorrowedFd},
    path::PathBuf,
    sync::atomic::{AtomicU32, Ordering},
};

use aya::programs::SchedClassifier;

use crate::{
    bpf,
    loader::{self, SharedMaps},
    maps::Prog,
    rendezvous::GroupInfo,
    stats::KernelStats,
    Error, Result,
};

/// `BPF_PROG_TEST_RUN`, the bpf(2) command number.
const BPF_PROG_TEST_RUN: libc::c_long = 10;

/// The `test` member of `union bpf_attr`.
#[repr(C)]
#[derive(Default)]
struct TestRunAttr {
    prog_fd: u32,
    retval: u32,
    data_size_in: u32,
    data_size_out: u32,
    data_in: u64,
    data_out: u64,
    repeat: u32,
    duration: u32,
    ctx_size_in: u32,
    ctx_size_out: u32,
    ctx_in: u64,
    ctx_out: u64,
    flags: u32,
    cpu: u32,
    batch_size: u32,
    _pad: u32,
}

/// What a test run gave back.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TestRun {
    /// The program's return value (an `XDP_*` or `TC_ACT_*` verdict).
    pub retval: u32,
    /// The frame as the program left it.
    pub frame: Vec<u8>,
}

/// XDP verdicts.
pub mod xdp {
    /// `XDP_DROP`.
    pub const DROP: u32 = 1;
    /// `XDP_PASS`.
    pub const PASS: u32 = 2;
    /// `XDP_TX`.
    pub const TX: u32 = 3;
}

/// TC verdicts.
pub mod tc {
    /// `TC_ACT_OK`.
    pub const OK: u32 = 0;
    /// `TC_ACT_SHOT`.
    pub const SHOT: u32 = 2;
    /// `TC_ACT_REDIRECT` (what `bpf_redirect` returns).
    pub const REDIRECT: u32 = 7;
}

/// Runs `prog` once on `frame`.
pub fn test_run(prog: BorrowedFd<'_>, frame: &[u8]) -> Result<TestRun> {
    test_run_timed(prog, frame, 1).map(|(run, _)| run)
}

/// Runs `prog` `repeat` times on `frame`; also returns the kernel's mean
/// time of one run, in ns (its `duration`).
pub fn test_run_timed(prog: BorrowedFd<'_>, frame: &[u8], repeat: u32) -> Result<(TestRun, u32)> {
    run_raw(prog, frame, repeat, None)
}

/// The fields of `struct __sk_buff` a TC test run may set, at their offsets
/// (`linux/bpf.h`; the kernel refuses a context with any other field set).
#[repr(C)]
#[derive(Clone, Copy)]
struct SkbContext {
    _before: [u8; SKB_GSO_SEGS],
    gso_segs: u32,
    _between: [u8; SKB_GSO_SIZE - SKB_GSO_SEGS - 4],
    gso_size: u32,
    _after: [u8; SKB_CONTEXT_LEN - SKB_GSO_SIZE - 4],
}

/// `sizeof(struct __sk_buff)`, and the offsets of `gso_segs` and `gso_size`.
const SKB_CONTEXT_LEN: usize = 192;
const SKB_GSO_SEGS: usize = 164;
const SKB_GSO_SIZE: usize = 176;

/// What a TC test run of a GSO skb gave back.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct GsoRun {
    /// The verdict and the frame the program left.
    pub run: TestRun,
    /// `skb->gso_segs` after the run (0 once a helper reset GSO).
    pub gso_segs: u32,
}

/// Runs TC program `prog` once on `frame` as one GSO skb of `gso_segs`
/// segments of `gso_size` bytes (UDP payload): a super-packet as veth and a
/// bridge deliver it.
pub fn test_run_gso(prog: BorrowedFd<'_>, frame: &[u8], gso_segs: u32, gso_size: u32) -> Result<GsoRun> {
    let mut ctx = SkbContext {
        _before: [0; SKB_GSO_SEGS],
        gso_segs,
        _between: [0; SKB_GSO_SIZE - SKB_GSO_SEGS - 4],
        gso_size,
        _after: [0; SKB_CONTEXT_LEN - SKB_GSO_SIZE - 4],
    };
    let (run, _) = run_raw(prog, frame, 1, Some(&mut ctx))?;
    Ok(GsoRun { run, gso_segs: ctx.gso_segs })
}

fn run_raw(prog: BorrowedFd<'_>, frame: &[u8], repeat: u32, ctx: Option<&mut SkbContext>) -> Result<(TestRun, u32)> {
    let mut out = vec![0u8; frame.len() + 512];
    let (ctx_size, ctx_ptr) = match ctx {
        Some(ctx) => (std::mem::size_of::<SkbContext>() as u32, ctx as *mut SkbContext as u64),
        None => (0, 0),
    };
    let mut attr = TestRunAttr {
        prog_fd: prog.as_raw_fd() as u32,
        data_size_in: frame.len() as u32,
        data_size_out: out.len() as u32,
        data_in: frame.as_ptr() as u64,
        data_out: out.as_mut_ptr() as u64,
        repeat: repeat.max(1),
        ctx_size_in: ctx_size,
        ctx_size_out: ctx_size,
        ctx_in: ctx_ptr,
        ctx_out: ctx_ptr,
        ..TestRunAttr::default()
    };
    // SAFETY: attr points at valid in/out buffers of the sizes it gives
    // (the context is read and written in place).
    let rc = unsafe {
        libc::syscall(
            libc::SYS_bpf,
            BPF_PROG_TEST_RUN,
            &mut attr as *mut TestRunAttr,
            std::mem::size_of::<TestRunAttr>() as u32,
        )
    };
    if rc < 0 {
        return Err(Error::system("BPF_PROG_TEST_RUN", io::Error::last_os_error()));
    }
    out.truncate(attr.data_size_out as usize);
    Ok((TestRun { retval: attr.retval, frame: out }, attr.duration))
}

/// The AggBox programs loaded (not attached) with private shared maps.
pub struct Harness {
    objects: Vec<aya::Ebpf>,
    maps: SharedMaps,
}

impl Harness {
    /// Loads XDP ingress, TC ingress and TC egress around one set of maps.
    pub fn new() -> Result<Harness> {
        Harness::with_xdp(bpf::XDP_INGRESS)
    }

    /// As [`Harness::new`], with XDP ingress from the object `xdp` (one
    /// built from `ebpf/xdp_ingress.bpf.c`, e.g. [`bpf::XDP_INGRESS_ATOMICS`]).
    pub fn with_xdp(xdp: &[u8]) -> Result<Harness> {
        Harness::load(xdp, false)
    }

    /// The programs as the TC hooks load them (`aggbox_tc_hooks` set: TC
    /// ingress is the first program a datagram meets). XDP ingress is
    /// loaded too, but an attachment on the TC hooks never attaches it.
    pub fn tc_hooks() -> Result<Harness> {
        Harness::load(bpf::XDP_INGRESS, true)
    }

    fn load(xdp: &[u8], tc_hooks: bool) -> Result<Harness> {
        static NEXT: AtomicU32 = AtomicU32::new(0);
        let dir: PathBuf = loader::bpffs_root()?.join(format!(
            "aggbox-testrun-{}-{}",
            std::process::id(),
            NEXT.fetch_add(1, Ordering::Relaxed)
        ));
        std::fs::create_dir_all(&dir).map_err(|e| Error::system("creating a test pin dir", e))?;
        let result = (|| {
            let mut objects = Vec::new();
            for bytes in [xdp, bpf::TC_INGRESS, bpf::TC_EGRESS] {
                objects.push(loader::load_object(bytes, &dir, tc_hooks)?);
            }
            let load = |e: aya::programs::ProgramError| Error::Unsupported(format!("loading: {e}"));
            loader::load_xdp(&mut objects[0])?;
            for (object, name) in objects[1..].iter_mut().zip([bpf::programs::TC_INGRESS, bpf::programs::TC_EGRESS]) {
                let tc: &mut SchedClassifier = object.program_mut(name).unwrap().try_into().map_err(load)?;
                tc.load().map_err(load)?;
            }
            let maps = SharedMaps::open(&dir)?;
            Ok(Harness { objects, maps })
        })();
        // The objects and maps hold their fds: the pins are not needed.
        loader::tear_down(&dir);
        result
    }

    /// Registers `group`, served by a local communicator on `ipv4:port`.
    pub fn register(&mut self, ipv4: std::net::Ipv4Addr, port: u16, group: &GroupInfo) -> Result<()> {
        self.maps.insert_group(group)?;
        let key = crate::maps::PortKey { ipv4: u32::from(ipv4).to_be(), port, reserved: 0 };
        self.maps.insert_port(key, group.group, crate::maps::NO_CTL)
    }

    /// Registers `group` on `ipv4:port` with broadcast control block
    /// `ctl`, and maps that block's windows (cleared).
    pub fn register_with_windows(
        &mut self,
        ipv4: std::net::Ipv4Addr,
        port: u16,
        group: &GroupInfo,
        ctl: u32,
    ) -> Result<crate::window::Windows> {
        self.maps.insert_group(group)?;
        let key = crate::maps::PortKey { ipv4: u32::from(ipv4).to_be(), port, reserved: 0 };
        self.maps.insert_port(key, group.group, ctl)?;
        let windows = self.maps.windows(ctl)?;
        windows.reset();
        Ok(windows)
    }

    /// The reduction counters, indexed like [`crate::maps::RSTAT_NAMES`].
    pub fn reduce_stats(&self) -> Result<[u64; crate::maps::RSTAT_NAMES.len()]> {
        self.maps.reduce_stats()
    }

    /// The agreement counters, indexed like [`crate::maps::ASTAT_NAMES`].
    pub fn agree_stats(&self) -> Result<[u64; crate::maps::ASTAT_NAMES.len()]> {
        self.maps.agree_stats()
    }

    /// The broadcast counters, indexed like [`crate::maps::BSTAT_NAMES`].
    pub fn broadcast_stats(&self) -> Result<[u64; crate::maps::BSTAT_NAMES.len()]> {
        self.maps.broadcast_stats()
    }

    /// Runs `prog` on `frame`.
    pub fn run(&self, prog: Prog, frame: &[u8]) -> Result<TestRun> {
        test_run(self.prog_fd(prog)?, frame)
    }

    /// Runs TC program `prog` on `frame` as one GSO skb (see [`test_run_gso`]).
    pub fn run_gso(&self, prog: Prog, frame: &[u8], gso_segs: u32, gso_size: u32) -> Result<GsoRun> {
        test_run_gso(self.prog_fd(prog)?, frame, gso_segs, gso_size)
    }

    /// The fd of loaded program `prog`, for [`test_run_timed`] (e.g. from
    /// several threads at once).
    pub fn prog_fd(&self, prog: Prog) -> Result<BorrowedFd<'_>> {
        let (program, name) = self.program(prog);
        let fd = program.fd().map_err(|e| Error::Internal(format!("{name} fd: {e}")))?;
        Ok(fd.as_fd())
    }

    /// How many instructions the verifier processed to load `prog` (the
    /// kernel's `verified_insns`): what loading costs each joining rank.
    pub fn verified_insns(&self, prog: Prog) -> Result<u32> {
        let (program, name) = self.program(prog);
        let info = program.info().map_err(|e| Error::Internal(format!("{name} info: {e}")))?;
        info.verified_instruction_count()
            .ok_or_else(|| Error::Unsupported(format!("{name}: the kernel does not report verified instructions")))
    }

    /// Loaded program `prog` and its name.
    fn program(&self, prog: Prog) -> (&aya::programs::Program, &'static str) {
        let (index, name) = match prog {
            Prog::XdpIngress => (0, bpf::programs::XDP_INGRESS),
            Prog::TcIngress => (1, bpf::programs::TC_INGRESS),
            Prog::TcEgress => (2, bpf::programs::TC_EGRESS),
        };
        (self.objects[index].program(name).expect("program in object"), name)
    }

    /// The counters every program keeps.
    pub fn stats(&self) -> Result<KernelStats> {
        self.maps.kernel_stats()
    }
}
