//! Loading, attaching, pinning and sharing the AggBox programs on an
//! interface.
//!
//! One attachment serves every communicator of every process on an
//! interface. It lives under `/sys/fs/bpf/aggbox/<netns>-<ifindex>-<build><hooks>/`
//! (`<build>` is a hash of the BPF objects, so two builds never share maps
//! whose layout they disagree on; `<hooks>` is `xdp` or `tc`, see [`Hooks`]):
//!
//! | pin | what |
//! | --- | --- |
//! | `xdp_drv` or `xdp_skb` | the XDP ingress link (the name says the mode; none on the TC hooks) |
//! | `tc_ingress`, `tc_egress` | the TC (TCX) links |
//! | `ab_ports`, `ab_groups`, `ab_members`, `ab_users`, `ab_stats` | the shared maps |
//!
//! The links are pinned, so the programs stay attached while any process
//! uses them, and are detached when the last user removes the pins. Who uses
//! the attachment is the `ab_users` map: one entry per communicator, keyed by
//! (pid, port), holding the process's start time. Every join and leave runs
//! under an exclusive `flock` on `/sys/fs/bpf/aggbox`, and first reclaims the
//! entries of processes that are gone (a SIGKILLed process cannot clean up):
//! their ports and groups are removed, and when no live user is left the old
//! attachment is torn down and made anew.
//!
//! Processes started with `ip netns exec` get a fresh `/sys` without the
//! host's bpffs; [`bpffs_root`] reaches the host's through an ancestor's
//! `/proc/<pid>/root`, so every process of a host sees the same pins.

use std::{
    ffi::CString,
    fs, io,
    os::{
        fd::{AsRawFd, OwnedFd},
        unix::fs::MetadataExt,
    },
    path::{Path, PathBuf},
    sync::OnceLock,
};

use aya::{
    maps::{HashMap, IterableMap, Map, MapData, PerCpuArray, ProgramArray},
    programs::{links::FdLink, tc::TcAttachType, SchedClassifier, Xdp, XdpMode},
    EbpfLoader,
};

use crate::{
    bpf,
    maps::{
        names, GroupValue, MemberKey, MemberValue, PortKey, PortValue, Prog, UserKey, UserValue, ASTAT_NAMES, BSTAT_NAMES,
        CTL_SLOTS, NO_CTL, RSTAT_NAMES, STAT_MAX,
    },
    netif::{self, Interface},
    rendezvous::GroupInfo,
    stats::KernelStats,
    error::chain,
    window::Windows,
    Error, Result,
};

/// Where AggBox pins its attachments, as seen from the host.
pub const PIN_ROOT: &str = "/sys/fs/bpf/aggbox";
/// The name of AggBox's directory in the bpffs.
const PIN_DIR_NAME: &str = "aggbox";
/// The bpffs mount point.
pub const BPFFS: &str = "/sys/fs/bpf";
/// `statfs` magic of bpffs.
const BPF_FS_MAGIC: i64 = 0xcafe_4a11;

const LINK_XDP_DRIVER: &str = "xdp_drv";
const LINK_XDP_SKB: &str = "xdp_skb";
const LINK_TC_INGRESS: &str = "tc_ingress";
const LINK_TC_EGRESS: &str = "tc_egress";

/// How the XDP program is attached.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum XdpAttachMode {
    /// In the driver (native XDP): before any skb is made.
    Driver,
    /// Generic XDP on the skb, where the driver has no XDP support.
    Skb,
}

impl XdpAttachMode {
    /// Its name in reports.
    pub fn name(self) -> &'static str {
        match self {
            XdpAttachMode::Driver => "driver",
            XdpAttachMode::Skb => "skb",
        }
    }
}

/// The hooks that carry the kernel datapath on an interface.
///
/// On a virtual device (veth, a bridge, a tunnel: no `device` in sysfs) any
/// XDP program turns GSO off on its peer, so every big packet reaches the
/// host cut into MTU frames; there AggBox attaches only TC programs, which see
/// a UDP GSO super-chunk as one skb (docs/BROADCAST.md, "The TC datapath").
/// On a physical NIC, XDP runs before any skb is made.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Hooks {
    /// XDP ingress (in this mode) with TC ingress and egress: every
    /// collective's kernel half.
    Xdp(XdpAttachMode),
    /// TC ingress and egress only: every collective's kernel half, TC
    /// ingress first.
    Tc,
}

impl Hooks {
    /// Its name in reports: `xdp-driver`, `xdp-skb` or `tc`.
    pub fn name(self) -> &'static str {
        match self {
            Hooks::Xdp(XdpAttachMode::Driver) => "xdp-driver",
            Hooks::Xdp(XdpAttachMode::Skb) => "xdp-skb",
            Hooks::Tc => "tc",
        }
    }

    /// Whether XDP ingress is attached (and is the first program a datagram
    /// meets).
    pub fn has_xdp(self) -> bool {
        matches!(self, Hooks::Xdp(_))
    }
}

/// What `AGGBOX_HOOKS` asks for.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum HooksChoice {
    /// TC on virtual devices, XDP on physical ones (the default).
    Auto,
    /// XDP wherever it attaches.
    Xdp,
    /// TC only.
    Tc,
}

impl HooksChoice {
    /// Reads `AGGBOX_HOOKS` (`auto`, `xdp` or `tc`; unset is `auto`).
    pub fn from_env() -> Result<HooksChoice> {
        match std::env::var("AGGBOX_HOOKS").ok().as_deref().map(str::trim) {
            None | Some("") | Some("auto") => Ok(HooksChoice::Auto),
            Some("xdp") => Ok(HooksChoice::Xdp),
            Some("tc") => Ok(HooksChoice::Tc),
            Some(other) => Err(Error::InvalidArgument(format!(
                "AGGBOX_HOOKS={other:?}: expected auto, xdp or tc"
            ))),
        }
    }

    /// Whether this choice puts `iface` on the TC hooks, and why (for
    /// `aggbox doctor` and the datapath reason).
    pub fn wants_tc(self, iface: &Interface) -> (bool, &'static str) {
        match self {
            HooksChoice::Tc => (true, "AGGBOX_HOOKS=tc"),
            HooksChoice::Xdp => (false, "AGGBOX_HOOKS=xdp"),
            HooksChoice::Auto if netif::is_virtual(&iface.name) => {
                (true, "a virtual device, where XDP would turn GSO off on its peer")
            }
            HooksChoice::Auto => (false, "a physical device, where XDP runs in the driver"),
        }
    }
}

fn is_bpffs(path: &str) -> bool {
    let Ok(c_path) = CString::new(path) else { return false };
    // SAFETY: statfs into a zeroed struct with a valid C path.
    unsafe {
        let mut st: libc::statfs = std::mem::zeroed();
        libc::statfs(c_path.as_ptr(), &mut st) == 0 && st.f_type as i64 == BPF_FS_MAGIC
    }
}

fn mount(source: &str, target: &str, fstype: &str, flags: libc::c_ulong) -> io::Result<()> {
    let source = CString::new(source)?;
    let target = CString::new(target)?;
    let fstype = CString::new(fstype)?;
    // SAFETY: valid C strings; no data argument.
    let rc = unsafe {
        libc::mount(source.as_ptr(), target.as_ptr(), fstype.as_ptr(), flags, std::ptr::null())
    };
    if rc == 0 {
        Ok(())
    } else {
        Err(io::Error::last_os_error())
    }
}

/// The parent of `pid` (field 4 of `/proc/<pid>/stat`).
fn parent_pid(pid: u32) -> Option<u32> {
    let stat = fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    stat[stat.rfind(')')? + 2..].split_whitespace().nth(1)?.parse().ok()
}

/// The bpffs to pin in, found once per process: `/sys/fs/bpf` when it is
/// one; else (inside `ip netns exec`, which mounts a fresh `/sys` without
/// it) the host's, reached through the root of PID 1 or of the nearest
/// ancestor process that still sees it, and held open as a directory fd so
/// `/proc/self/fd/<fd>` keeps reaching it; else a new private mount (then
/// processes started apart cannot share an attachment, and a warning says
/// so).
pub fn bpffs_root() -> Result<PathBuf> {
    static ROOT: OnceLock<PathBuf> = OnceLock::new();
    if let Some(root) = ROOT.get() {
        return Ok(root.clone());
    }
    let root = find_bpffs()?;
    Ok(ROOT.get_or_init(|| root).clone())
}

fn find_bpffs() -> Result<PathBuf> {
    if is_bpffs(BPFFS) {
        return Ok(PathBuf::from(BPFFS));
    }
    let mut candidates = vec![1];
    let mut pid = std::process::id();
    while let Some(parent) = parent_pid(pid).filter(|&p| p > 1) {
        candidates.push(parent);
        pid = parent;
    }
    for pid in candidates {
        let host = format!("/proc/{pid}/root{BPFFS}");
        if !is_bpffs(&host) {
            continue;
        }
        if let Ok(dir) = fs::File::open(&host) {
            // Kept open for the life of the process: the path below goes
            // through it.
            let fd = OwnedFd::from(dir);
            let path = PathBuf::from(format!("/proc/self/fd/{}", fd.as_raw_fd()));
            std::mem::forget(fd);
            return Ok(path);
        }
    }
    tracing::warn!("no host bpffs is visible; mounting a private one: processes started apart cannot share an attachment (mount -t bpf bpf {BPFFS} on the host)");
    mount("bpf", BPFFS, "bpf", 0).map_err(|e| {
        Error::system(format!("mounting bpffs on {BPFFS} (try: mount -t bpf bpf {BPFFS})"), e)
    })?;
    Ok(PathBuf::from(BPFFS))
}

/// Where AggBox's pins live: `aggbox/` in [`bpffs_root`].
pub fn pin_root() -> Result<PathBuf> {
    Ok(bpffs_root()?.join(PIN_DIR_NAME))
}

/// The inode of this thread's network namespace: tells namespaces apart.
fn netns_inode() -> Result<u64> {
    fs::metadata("/proc/thread-self/ns/net")
        .map(|m| m.ino())
        .map_err(|e| Error::system("reading /proc/thread-self/ns/net", e))
}

/// The pin directory of the attachment on `iface` in this network
/// namespace, on the TC hooks when `tc`.
pub fn pin_dir(iface: &Interface, tc: bool) -> Result<PathBuf> {
    let hooks = if tc { "tc" } else { "xdp" };
    Ok(pin_root()?.join(format!("{}-{}-{}{hooks}", netns_inode()?, iface.index, bpf::BUILD_ID)))
}

/// An exclusive `flock` on [`PIN_ROOT`], held while joining or leaving.
struct PinLock(OwnedFd);

impl PinLock {
    fn take() -> Result<PinLock> {
        let root = pin_root()?;
        fs::create_dir_all(&root).map_err(|e| Error::system(format!("creating {}", root.display()), e))?;
        let dir = fs::File::open(&root).map_err(|e| Error::system(format!("opening {}", root.display()), e))?;
        loop {
            // SAFETY: flock on an fd we own.
            if unsafe { libc::flock(dir.as_raw_fd(), libc::LOCK_EX) } == 0 {
                return Ok(PinLock(dir.into()));
            }
            let err = io::Error::last_os_error();
            if err.kind() != io::ErrorKind::Interrupted {
                return Err(Error::system(format!("locking {PIN_ROOT}"), err));
            }
        }
    }
}

impl Drop for PinLock {
    fn drop(&mut self) {
        // SAFETY: unlocking the fd we locked; closing it would unlock too.
        unsafe { libc::flock(self.0.as_raw_fd(), libc::LOCK_UN) };
    }
}

/// Start time of `pid` (field 22 of `/proc/<pid>/stat`), if it is alive.
pub fn process_start_time(pid: u32) -> Option<u64> {
    let stat = fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // The command name (field 2) is in parentheses and may hold spaces.
    let after_name = &stat[stat.rfind(')')? + 2..];
    // after_name starts at field 3; field 22 is the 20th from there.
    after_name.split_whitespace().nth(19)?.parse().ok()
}

/// Inode of this process's PID namespace (0 if unreadable).
pub fn pid_namespace() -> u32 {
    fs::metadata("/proc/self/ns/pid").map(|m| m.ino() as u32).unwrap_or(0)
}

/// Whether `pid` is a zombie (dead, not yet reaped).
fn is_zombie(pid: u32) -> bool {
    fs::read_to_string(format!("/proc/{pid}/stat"))
        .ok()
        .and_then(|stat| stat.rfind(')').map(|i| stat[i + 1..].trim_start().starts_with('Z')))
        .unwrap_or(false)
}

/// Whether the user entry belongs to a live process. An entry made in
/// another PID namespace cannot be checked from here (its pid means
/// something else), so it counts as alive.
fn is_alive(key: &UserKey, user: &UserValue) -> bool {
    if user.pidns != pid_namespace() {
        return true;
    }
    process_start_time(key.pid) == Some(user.start_time) && !is_zombie(key.pid)
}

/// The shared maps of one attachment, opened from their pins.
pub(crate) struct SharedMaps {
    ports: HashMap<MapData, PortKey, PortValue>,
    groups: HashMap<MapData, u32, GroupValue>,
    members: HashMap<MapData, MemberKey, MemberValue>,
    users: HashMap<MapData, UserKey, UserValue>,
    stats: PerCpuArray<MapData, u64>,
    bstats: PerCpuArray<MapData, u64>,
    rstats: PerCpuArray<MapData, u64>,
    ctl: MapData,
    rxwin: MapData,
    txwin: MapData,
    redwin: MapData,
    redres: MapData,
    agree: MapData,
    astats: PerCpuArray<MapData, u64>,
}

fn open_pinned_data(dir: &Path, name: &str) -> Result<MapData> {
    let path = dir.join(name);
    MapData::from_pin(&path)
        .map_err(|e| Error::system(format!("opening pinned map {}", path.display()), io::Error::other(chain(&e))))
}

fn open_pinned(dir: &Path, name: &str) -> Result<Map> {
    Map::from_map_data(open_pinned_data(dir, name)?).map_err(|e| Error::Internal(format!("pinned map {name}: {e}")))
}

fn map_error(what: impl Into<String>) -> impl FnOnce(aya::maps::MapError) -> Error {
    let what = what.into();
    move |e| Error::system(what, io::Error::other(chain(&e)))
}

impl SharedMaps {
    pub(crate) fn open(dir: &Path) -> Result<SharedMaps> {
        let typed = |name: &str| -> Result<Map> { open_pinned(dir, name) };
        let wrong = |name: &'static str| move |e: aya::maps::MapError| Error::Internal(format!("map {name}: {e}"));
        Ok(SharedMaps {
            ports: HashMap::try_from(typed(names::PORTS)?).map_err(wrong(names::PORTS))?,
            groups: HashMap::try_from(typed(names::GROUPS)?).map_err(wrong(names::GROUPS))?,
            members: HashMap::try_from(typed(names::MEMBERS)?).map_err(wrong(names::MEMBERS))?,
            users: HashMap::try_from(typed(names::USERS)?).map_err(wrong(names::USERS))?,
            stats: PerCpuArray::try_from(typed(names::STATS)?).map_err(wrong(names::STATS))?,
            bstats: PerCpuArray::try_from(typed(names::BSTATS)?).map_err(wrong(names::BSTATS))?,
            rstats: PerCpuArray::try_from(typed(names::RSTATS)?).map_err(wrong(names::RSTATS))?,
            ctl: open_pinned_data(dir, names::CTL)?,
            rxwin: open_pinned_data(dir, names::RXWIN)?,
            txwin: open_pinned_data(dir, names::TXWIN)?,
            redwin: open_pinned_data(dir, names::REDWIN)?,
            redres: open_pinned_data(dir, names::REDRES)?,
            agree: open_pinned_data(dir, names::AGREE)?,
            astats: PerCpuArray::try_from(typed(names::ASTATS)?).map_err(wrong(names::ASTATS))?,
        })
    }

    /// Every (key, value) of ab_users.
    fn user_entries(&self) -> Vec<(UserKey, UserValue)> {
        self.users.iter().filter_map(|entry| entry.ok()).collect()
    }

    /// Removes what the processes that are gone left: their user entries,
    /// their ports, and the groups no live user serves. Returns how many
    /// live users remain.
    fn reclaim_stale(&mut self) -> usize {
        let entries = self.user_entries();
        let (live, dead): (Vec<_>, Vec<_>) =
            entries.into_iter().partition(|(key, user)| is_alive(key, user));
        for (key, user) in &dead {
            tracing::info!(pid = key.pid, port = key.port, group = user.group, "reclaiming a stale AggBox user");
            let _ = self.users.remove(key);
            self.remove_port(PortKey { ipv4: user.ipv4, port: key.port, reserved: 0 }, user.group);
            if user.group != 0 && !live.iter().any(|(_, u)| u.group == user.group) {
                self.remove_group(user.group);
            }
        }
        live.len()
    }

    fn group_value(group: &GroupInfo) -> GroupValue {
        GroupValue { token: group.token, size: group.peers.len() as u32, reserved: 0 }
    }

    /// Fails when `group`'s id is registered here for a different group.
    fn check_group_free(&self, group: &GroupInfo, iface: &str) -> Result<()> {
        match self.groups.get(&group.group, 0) {
            Ok(existing) if existing != Self::group_value(group) => Err(Error::Internal(format!(
                "group id {} is already registered on {iface} for another group; start again",
                group.group
            ))),
            _ => Ok(()),
        }
    }

    /// Registers the group and its members.
    pub(crate) fn insert_group(&mut self, group: &GroupInfo) -> Result<()> {
        self.groups.insert(group.group, Self::group_value(group), 0).map_err(map_error("registering the group"))?;
        for peer in &group.peers {
            let member = MemberValue { ipv4: u32::from(peer.ipv4).to_be(), port: peer.port, mac: peer.mac };
            let member_key = MemberKey { group: group.group, rank: peer.rank as u32 };
            self.members.insert(member_key, member, 0).map_err(map_error("registering a member"))?;
        }
        Ok(())
    }

    /// Makes `port` a port of `group`, with broadcast control block `ctl`.
    pub(crate) fn insert_port(&mut self, port: PortKey, group: u32, ctl: u32) -> Result<()> {
        self.ports.insert(port, PortValue { group, ctl }, 0).map_err(map_error("registering the port"))
    }

    /// The lowest control block no registered port uses, if any is free.
    fn free_ctl(&self) -> Option<u32> {
        let used: Vec<u32> = self.ports.iter().filter_map(|e| e.ok()).map(|(_, v)| v.ctl).collect();
        (0..CTL_SLOTS).find(|i| !used.contains(i))
    }

    /// Maps the windows of control block `index`.
    pub(crate) fn windows(&self, index: u32) -> Result<Windows> {
        use std::os::fd::AsFd;
        Windows::map(
            index,
            self.ctl.fd().as_fd(),
            self.rxwin.fd().as_fd(),
            self.txwin.fd().as_fd(),
            self.redwin.fd().as_fd(),
            self.redres.fd().as_fd(),
            self.agree.fd().as_fd(),
        )
    }

    /// The agreement counters, indexed like [`ASTAT_NAMES`].
    pub(crate) fn agree_stats(&self) -> Result<[u64; ASTAT_NAMES.len()]> {
        let mut out = [0u64; ASTAT_NAMES.len()];
        for (i, value) in out.iter_mut().enumerate() {
            let values = self.astats.get(&(i as u32), 0).map_err(map_error("reading ab_astats"))?;
            *value = values.iter().sum();
        }
        Ok(out)
    }

    /// The reduction counters, indexed like [`RSTAT_NAMES`].
    pub(crate) fn reduce_stats(&self) -> Result<[u64; RSTAT_NAMES.len()]> {
        let mut out = [0u64; RSTAT_NAMES.len()];
        for (i, value) in out.iter_mut().enumerate() {
            let values = self.rstats.get(&(i as u32), 0).map_err(map_error("reading ab_rstats"))?;
            *value = values.iter().sum();
        }
        Ok(out)
    }

    /// The broadcast counters.
    pub(crate) fn broadcast_stats(&self) -> Result<[u64; BSTAT_NAMES.len()]> {
        let mut out = [0u64; BSTAT_NAMES.len()];
        for (i, value) in out.iter_mut().enumerate() {
            let values = self.bstats.get(&(i as u32), 0).map_err(map_error("reading ab_bstats"))?;
            *value = values.iter().sum();
        }
        Ok(out)
    }

    /// Removes `port` if it still serves `group` (another communicator may
    /// have bound the same port since).
    fn remove_port(&mut self, port: PortKey, group: u32) {
        if self.ports.get(&port, 0).is_ok_and(|p| p.group == group) {
            let _ = self.ports.remove(&port);
        }
    }

    /// The kernel id of the `ab_users` map these handles point at.
    fn users_map_id(&self) -> Option<u32> {
        let map: &MapData = self.users.map();
        map.info().ok().map(|info| info.id())
    }

    /// The kernel counters.
    pub(crate) fn kernel_stats(&self) -> Result<KernelStats> {
        let mut stats = KernelStats::default();
        for prog in Prog::ALL {
            for stat in 0..STAT_MAX {
                let index = (prog as usize * STAT_MAX + stat) as u32;
                let values = self.stats.get(&index, 0).map_err(map_error("reading ab_stats"))?;
                stats.counters[prog as usize][stat] = values.iter().sum();
            }
        }
        Ok(stats)
    }

    fn remove_group(&mut self, group: u32) {
        let Ok(value) = self.groups.get(&group, 0) else { return };
        for rank in 0..value.size {
            let _ = self.members.remove(&MemberKey { group, rank });
        }
        let _ = self.groups.remove(&group);
    }
}

/// Loads one of the AggBox objects with its maps pinned by name in `dir`;
/// `tc_hooks` sets the TC programs' `aggbox_tc_hooks` (no XDP before them).
pub(crate) fn load_object(bytes: &[u8], dir: &Path, tc_hooks: bool) -> Result<aya::Ebpf> {
    let tc_hooks = u32::from(tc_hooks);
    let mut loader = EbpfLoader::new();
    loader.default_map_pin_directory(dir);
    // Only TC ingress has it: the others load as they are.
    loader.override_global("aggbox_tc_hooks", &tc_hooks, false);
    loader
        .load(bytes)
        .map_err(|e| Error::Unsupported(format!("loading the AggBox BPF programs failed ({}); run `aggbox doctor`", chain(&e))))
}

fn pin_link(link: FdLink, dir: &Path, name: &str) -> Result<()> {
    link.pin(dir.join(name))
        .map(drop)
        .map_err(|e| Error::system(format!("pinning {name} in {}", dir.display()), io::Error::other(e)))
}

fn program_error(what: String) -> impl FnOnce(aya::programs::ProgramError) -> Error {
    move |e| Error::Unsupported(format!("{what}: {}", chain(&e)))
}

/// Loads the XDP object's programs: XDP ingress, and the reduction fold
/// stage it tail-calls, which it puts in `ab_redprogs`. Returns XDP
/// ingress, ready to attach (or to test-run).
pub(crate) fn load_xdp(obj: &mut aya::Ebpf) -> Result<&mut Xdp> {
    let fold: &mut Xdp = obj
        .program_mut(bpf::programs::XDP_RED_FOLD)
        .ok_or_else(|| Error::Internal("the fold stage is missing from the XDP object".into()))?
        .try_into()
        .map_err(program_error("the fold stage".into()))?;
    fold.load().map_err(program_error("loading the reduction fold stage".into()))?;
    let fd = fold
        .fd()
        .and_then(|fd| fd.try_clone().map_err(aya::programs::ProgramError::from))
        .map_err(program_error("the fold stage's fd".into()))?;
    let map = obj.map_mut(names::REDPROGS).ok_or_else(|| Error::Internal("ab_redprogs missing".into()))?;
    let mut progs = ProgramArray::try_from(map).map_err(|e| Error::Internal(format!("ab_redprogs: {e}")))?;
    progs.set(0, &fd, 0).map_err(map_error("putting the fold stage in ab_redprogs"))?;
    let xdp: &mut Xdp = obj
        .program_mut(bpf::programs::XDP_INGRESS)
        .ok_or_else(|| Error::Internal("XDP program missing from its object".into()))?
        .try_into()
        .map_err(program_error("XDP program".into()))?;
    xdp.load().map_err(program_error("loading XDP ingress".into()))?;
    Ok(xdp)
}

/// How long attaching waits for the kernel to release an XDP link that was
/// just unpinned.
const XDP_RELEASE_WAIT: std::time::Duration = std::time::Duration::from_secs(2);

/// Whether `e` (or an error it wraps) is EEXIST: the interface has an XDP
/// program attached.
fn is_eexist(e: &(dyn std::error::Error + 'static)) -> bool {
    let mut next: Option<&(dyn std::error::Error + 'static)> = Some(e);
    while let Some(err) = next {
        if err.downcast_ref::<std::io::Error>().and_then(std::io::Error::raw_os_error) == Some(libc::EEXIST) {
            return true;
        }
        next = err.source();
    }
    false
}

/// Loads the programs, attaches them to `iface` and pins links and maps in
/// `dir`. Returns the hooks it got: on the TC hooks (`tc`) the XDP object
/// only makes the maps, its programs are neither loaded nor attached.
fn attach_fresh(iface: &Interface, dir: &Path, tc: bool) -> Result<Hooks> {
    fs::create_dir_all(dir).map_err(|e| Error::system(format!("creating {}", dir.display()), e))?;

    let mut xdp_obj = load_object(bpf::XDP_INGRESS, dir, tc)?;
    let hooks = if tc { Hooks::Tc } else { Hooks::Xdp(attach_xdp(iface, dir, &mut xdp_obj)?) };
    for (bytes, program, attach, pin) in [
        (bpf::TC_INGRESS, bpf::programs::TC_INGRESS, TcAttachType::Ingress, LINK_TC_INGRESS),
        (bpf::TC_EGRESS, bpf::programs::TC_EGRESS, TcAttachType::Egress, LINK_TC_EGRESS),
    ] {
        let mut obj = load_object(bytes, dir, tc)?;
        let tc: &mut SchedClassifier = obj
            .program_mut(program)
            .ok_or_else(|| Error::Internal(format!("{program} missing from its object")))?
            .try_into()
            .map_err(program_error(program.into()))?;
        tc.load().map_err(program_error(format!("loading {program}")))?;
        let id = tc
            .attach(&iface.name, attach)
            .map_err(program_error(format!("attaching {program} to {}", iface.name)))?;
        let link = tc.take_link(id).map_err(program_error(format!("{program} link")))?;
        let link = FdLink::try_from(link)
            .map_err(|e| Error::Unsupported(format!("{program} link is not a bpf_link (TCX needs Linux 6.6): {e}")))?;
        pin_link(link, dir, pin)?;
    }
    Ok(hooks)
}

/// Loads XDP ingress and its stages from `xdp_obj`, attaches it to `iface`
/// (in the driver if it can) and pins its link in `dir`.
fn attach_xdp(iface: &Interface, dir: &Path, xdp_obj: &mut aya::Ebpf) -> Result<XdpAttachMode> {
    let xdp = load_xdp(xdp_obj).map_err(|e| e.context(&iface.name))?;
    // A link that tear_down unpinned is released by a kernel work item, not
    // at once: until it runs the interface still has that XDP program, and
    // attaching fails with EEXIST (seen when a rank killed for good left its
    // pins and the next process on its host reclaimed them). Wait for it.
    let release_by = std::time::Instant::now() + XDP_RELEASE_WAIT;
    let releasing = |e: &aya::programs::ProgramError| is_eexist(e) && std::time::Instant::now() < release_by;
    let (link_id, mode) = loop {
        match xdp.attach_to_if_index(iface.index, XdpMode::Driver) {
            Ok(id) => break (id, XdpAttachMode::Driver),
            Err(e) if releasing(&e) => std::thread::sleep(std::time::Duration::from_millis(5)),
            Err(driver_err) => {
                tracing::info!(iface = %iface.name, error = %driver_err, "no driver-mode XDP; using SKB mode");
                match xdp.attach_to_if_index(iface.index, XdpMode::Skb) {
                    Ok(id) => break (id, XdpAttachMode::Skb),
                    Err(e) if releasing(&e) => std::thread::sleep(std::time::Duration::from_millis(5)),
                    Err(e) => {
                        return Err(program_error(format!(
                            "attaching XDP to {} (driver mode: {driver_err}; SKB mode)",
                            iface.name
                        ))(e))
                    }
                }
            }
        }
    };
    let link = xdp.take_link(link_id).map_err(program_error("XDP link".into()))?;
    let link = FdLink::try_from(link).map_err(|e| Error::Unsupported(format!("XDP link is not a bpf_link: {e}")))?;
    pin_link(link, dir, if mode == XdpAttachMode::Driver { LINK_XDP_DRIVER } else { LINK_XDP_SKB })?;
    Ok(mode)
}

/// Removes every pin in `dir` (detaching the programs whose links they
/// held) and the directory itself.
pub(crate) fn tear_down(dir: &Path) {
    if let Ok(entries) = fs::read_dir(dir) {
        for entry in entries.flatten() {
            let _ = fs::remove_file(entry.path());
        }
    }
    let _ = fs::remove_dir(dir);
}

/// The hooks of the attachment pinned in `dir`, if its links are there.
fn existing_hooks(dir: &Path) -> Option<Hooks> {
    if ![LINK_TC_INGRESS, LINK_TC_EGRESS].iter().all(|n| dir.join(n).exists()) {
        None
    } else if dir.join(LINK_XDP_DRIVER).exists() {
        Some(Hooks::Xdp(XdpAttachMode::Driver))
    } else if dir.join(LINK_XDP_SKB).exists() {
        Some(Hooks::Xdp(XdpAttachMode::Skb))
    } else if dir.to_string_lossy().ends_with("tc") {
        Some(Hooks::Tc)
    } else {
        None
    }
}

fn complete(dir: &Path) -> bool {
    existing_hooks(dir).is_some() && names::ALL.iter().all(|n| dir.join(n).exists())
}

/// Tears down the attachments of other AggBox builds on the same interface
/// that no live process uses; fails, naming them, when one is in use (only
/// one build's programs can be attached to an interface at a time).
fn clear_other_builds(dir: &Path) -> Result<()> {
    let (Some(parent), Some(name)) = (dir.parent(), dir.file_name()) else { return Ok(()) };
    let name = name.to_string_lossy();
    let Some((interface_part, _)) = name.rsplit_once('-') else { return Ok(()) };
    let Ok(entries) = fs::read_dir(parent) else { return Ok(()) };
    for entry in entries.flatten() {
        let other = entry.file_name().to_string_lossy().into_owned();
        if other == name || other.rsplit_once('-').map(|(p, _)| p) != Some(interface_part) {
            continue;
        }
        let path = entry.path();
        let Ok(mut maps) = SharedMaps::open(&path) else {
            // Its maps are not ours to read: leave it; attaching will say
            // the interface is taken.
            continue;
        };
        match maps.reclaim_stale() {
            0 => tear_down(&path),
            _ => {
                let pids: Vec<String> = maps.user_entries().iter().map(|(k, _)| k.pid.to_string()).collect();
                return Err(Error::Unsupported(format!(
                    "another AggBox build is attached here ({}) and in use by pid(s) {}",
                    path.display(),
                    pids.join(", ")
                )));
            }
        }
    }
    Ok(())
}

/// One communicator's use of the attachment on its interface. Dropping it
/// unregisters the communicator and, when it was the last user, detaches.
pub struct Attachment {
    dir: PathBuf,
    iface: String,
    ipv4: u32,
    hooks: Hooks,
    hooks_reason: &'static str,
    shared_with: usize,
    key: UserKey,
    user: UserValue,
    maps: SharedMaps,
    windows: Option<Windows>,
}

impl Attachment {
    /// Attaches to `iface` (or shares the attachment already there) and
    /// registers this process's communicator on local `port`. The group is
    /// registered later, with [`Attachment::register_group`], once
    /// rendezvous has made it. The hooks are the ones `AGGBOX_HOOKS` asks for.
    pub fn acquire(iface: &Interface, port: u16) -> Result<Attachment> {
        Self::acquire_on(iface, port, HooksChoice::from_env()?)
    }

    /// [`Attachment::acquire`] on the hooks `choice` picks, whatever the
    /// environment says.
    pub fn acquire_on(iface: &Interface, port: u16, choice: HooksChoice) -> Result<Attachment> {
        let (tc, hooks_reason) = choice.wants_tc(iface);
        let dir = pin_dir(iface, tc)?;
        let _lock = PinLock::take()?;

        let mut live = 0;
        if complete(&dir) {
            let mut maps = SharedMaps::open(&dir)?;
            live = maps.reclaim_stale();
        }
        if live == 0 {
            // Nobody uses what is there (or it is half made): start anew.
            tear_down(&dir);
            clear_other_builds(&dir)?;
            if let Err(e) = attach_fresh(iface, &dir, tc) {
                tear_down(&dir);
                return Err(e);
            }
        }
        let hooks = existing_hooks(&dir).ok_or_else(|| Error::Internal("a link pin vanished".into()))?;
        let mut maps = SharedMaps::open(&dir)?;
        let me = std::process::id();
        let key = UserKey { pid: me, port, reserved: 0 };
        let ipv4 = u32::from(iface.ipv4).to_be();
        let user = UserValue {
            start_time: process_start_time(me)
                .ok_or_else(|| Error::Internal("cannot read this process's start time".into()))?,
            group: 0,
            ipv4,
            pidns: pid_namespace(),
            reserved: 0,
        };
        if let Err(e) = maps.users.insert(key, user, 0).map_err(map_error("registering this process")) {
            // Not registered: leave nothing behind if nobody else uses it.
            if maps.reclaim_stale() == 0 {
                tear_down(&dir);
            }
            return Err(e);
        }
        tracing::info!(iface = %iface.name, hooks = hooks.name(), why = hooks_reason, shared_with = live, "AggBox programs attached");
        Ok(Attachment {
            dir,
            iface: iface.name.clone(),
            ipv4,
            hooks,
            hooks_reason,
            shared_with: live,
            key,
            user,
            maps,
            windows: None,
        })
    }

    /// Registers `group` (made by rendezvous) for this communicator's port:
    /// from then on the programs admit its datagrams and drop others'.
    pub fn register_group(&mut self, group: &GroupInfo) -> Result<()> {
        let _lock = PinLock::take()?;
        let maps = &mut self.maps;
        maps.check_group_free(group, &self.iface)?;
        self.user.group = group.group;
        maps.users.insert(self.key, self.user, 0).map_err(map_error("registering this process's group"))?;
        maps.insert_group(group)?;
        // A broadcast control block and windows, while any is free.
        let ctl = match maps.free_ctl() {
            Some(index) => {
                let windows = maps.windows(index)?;
                windows.reset();
                self.windows = Some(windows);
                index
            }
            None => {
                tracing::info!(iface = %self.iface, "no free kernel broadcast window: broadcasts of this communicator run in user space");
                NO_CTL
            }
        };
        // Last: from here on the programs treat the port as AggBox's.
        let port = PortKey { ipv4: self.ipv4, port: self.key.port, reserved: 0 };
        maps.insert_port(port, group.group, ctl)
    }

    fn port_key(&self) -> PortKey {
        PortKey { ipv4: self.ipv4, port: self.key.port, reserved: 0 }
    }

    /// The hooks of the attachment.
    pub fn hooks(&self) -> Hooks {
        self.hooks
    }

    /// Why this attachment is on its hooks (`AGGBOX_HOOKS`, or the device).
    pub fn hooks_reason(&self) -> &'static str {
        self.hooks_reason
    }

    /// The interface it is on.
    pub fn iface(&self) -> &str {
        &self.iface
    }

    /// How many other communicators already used the attachment when this
    /// one joined (0: this one attached the programs).
    pub fn shared_with(&self) -> usize {
        self.shared_with
    }

    /// The pin directory.
    pub fn pin_dir(&self) -> &Path {
        &self.dir
    }

    /// The kernel counters of the programs on this interface.
    pub fn kernel_stats(&self) -> Result<KernelStats> {
        self.maps.kernel_stats()
    }

    /// The broadcast counters of the programs on this interface, indexed
    /// like [`BSTAT_NAMES`].
    pub fn broadcast_stats(&self) -> Result<[u64; BSTAT_NAMES.len()]> {
        self.maps.broadcast_stats()
    }

    /// The reduction counters of the programs on this interface, indexed
    /// like [`RSTAT_NAMES`].
    pub fn reduce_stats(&self) -> Result<[u64; RSTAT_NAMES.len()]> {
        self.maps.reduce_stats()
    }

    /// The approximate-agreement counters of the programs on this
    /// interface (totals over its CPUs), indexed like [`ASTAT_NAMES`].
    pub fn agree_stats(&self) -> Result<[u64; ASTAT_NAMES.len()]> {
        self.maps.agree_stats()
    }

    /// The memory of the maps pinned for this attachment (every shared map
    /// of its programs; the few per-CPU scratch and lock maps the programs
    /// keep to themselves, about 42 KiB, are not pinned and not counted):
    /// how many, and their bytes as the kernel charges them (`memlock` in
    /// each map's fdinfo).
    pub fn map_memory(&self) -> Result<(usize, u64)> {
        pinned_map_memory(&self.dir)
    }

    /// This communicator's kernel broadcast windows, if it got a control
    /// block (the first [`CTL_SLOTS`] communicators of a host do).
    pub fn windows(&self) -> Option<&Windows> {
        self.windows.as_ref()
    }

    /// Unregisters; detaches when no live user is left. Caller holds the lock.
    fn leave_locked(&mut self) {
        let group = self.user.group;
        self.maps.remove_port(self.port_key(), group);
        let _ = self.maps.users.remove(&self.key);
        let live = self.maps.reclaim_stale();
        let group_in_use = self.maps.user_entries().iter().any(|(_, u)| u.group == group);
        if group != 0 && !group_in_use {
            self.maps.remove_group(group);
        }
        // Tear down only the attachment these maps belong to: if it was
        // rebuilt under us, the pins are someone else's now.
        let pinned_id = SharedMaps::open(&self.dir).ok().and_then(|m| m.users_map_id());
        if live == 0 && pinned_id.is_some() && pinned_id == self.maps.users_map_id() {
            tear_down(&self.dir);
            tracing::info!(iface = %self.iface, "last AggBox user left; programs detached");
        }
    }
}

impl Drop for Attachment {
    fn drop(&mut self) {
        match PinLock::take() {
            Ok(_lock) => self.leave_locked(),
            Err(e) => tracing::warn!(error = %e, "could not lock the pins to leave; the next start reclaims"),
        }
    }
}

/// Removes the attachments of the network namespace whose inode is
/// `netns_inode` (for a namespace about to be deleted: whatever its
/// processes left pinned would outlive it). Returns how many it removed.
pub fn remove_netns_pins(netns_inode: u64) -> Result<usize> {
    let root = pin_root()?;
    let Ok(entries) = fs::read_dir(&root) else { return Ok(0) };
    let _lock = PinLock::take()?;
    let prefix = format!("{netns_inode}-");
    let mut removed = 0;
    for entry in entries.flatten() {
        if entry.file_name().to_string_lossy().starts_with(&prefix) {
            tear_down(&entry.path());
            removed += 1;
        }
    }
    Ok(removed)
}

/// A communicator registered on an attachment, as [`list_attachments`] sees it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct UserStatus {
    /// Its process.
    pub pid: u32,
    /// Its UDP port.
    pub port: u16,
    /// Its group (0 until rendezvous completes).
    pub group: u32,
    /// Whether the process is alive (a dead one is reclaimed at the next join).
    pub alive: bool,
}

/// One attachment under the pin root.
#[derive(Clone, Debug)]
pub struct AttachmentStatus {
    /// Its pin directory.
    pub dir: PathBuf,
    /// Its hooks, if its links are pinned.
    pub hooks: Option<Hooks>,
    /// The communicators using it.
    pub users: Vec<UserStatus>,
    /// Its counters.
    pub stats: KernelStats,
    /// Its broadcast counters, indexed like [`BSTAT_NAMES`].
    pub broadcast: [u64; BSTAT_NAMES.len()],
}

/// How many maps are pinned in `dir`, and the bytes the kernel charges for
/// them (`memlock` in each one's fdinfo).
fn pinned_map_memory(dir: &Path) -> Result<(usize, u64)> {
    use std::os::fd::{AsFd, AsRawFd};
    let entries = fs::read_dir(dir).map_err(|e| Error::system(format!("reading {}", dir.display()), e))?;
    let (mut maps, mut bytes) = (0, 0);
    for entry in entries.flatten() {
        // Links are pinned here too; only maps open as maps.
        let Ok(map) = MapData::from_pin(entry.path()) else { continue };
        let info = fs::read_to_string(format!("/proc/self/fdinfo/{}", map.fd().as_fd().as_raw_fd()))
            .map_err(|e| Error::system("reading a map's fdinfo", e))?;
        let memlock = info.lines().find_map(|l| l.strip_prefix("memlock:")?.trim().parse::<u64>().ok());
        if let Some(memlock) = memlock {
            maps += 1;
            bytes += memlock;
        }
    }
    Ok((maps, bytes))
}

/// Every AggBox attachment on this host (in every network namespace).
pub fn list_attachments() -> Result<Vec<AttachmentStatus>> {
    let root = pin_root()?;
    let Ok(entries) = fs::read_dir(&root) else { return Ok(Vec::new()) };
    let mut found = Vec::new();
    for entry in entries.flatten() {
        let dir = entry.path();
        let Ok(maps) = SharedMaps::open(&dir) else { continue };
        let users = maps
            .user_entries()
            .into_iter()
            .map(|(key, user)| UserStatus { pid: key.pid, port: key.port, group: user.group, alive: is_alive(&key, &user) })
            .collect();
        found.push(AttachmentStatus {
            hooks: existing_hooks(&dir),
            users,
            stats: maps.kernel_stats()?,
            broadcast: maps.broadcast_stats()?,
            dir,
        });
    }
    found.sort_by(|a, b| a.dir.cmp(&b.dir));
    Ok(found)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn start_time_of_this_process_is_stable() {
        let me = std::process::id();
        let first = process_start_time(me).unwrap();
        assert_eq!(process_start_time(me), Some(first));
        assert_eq!(process_start_time(u32::MAX), None);
    }

    #[test]
    fn eexist_is_found_through_the_error_chain() {
        #[derive(Debug, thiserror::Error)]
        #[error("`bpf_link_create` failed")]
        struct Wrapper(#[source] std::io::Error);
        let exists = std::io::Error::from_raw_os_error(libc::EEXIST);
        assert!(is_eexist(&exists));
        assert!(is_eexist(&Wrapper(std::io::Error::from_raw_os_error(libc::EEXIST))));
        assert!(!is_eexist(&Wrapper(std::io::Error::from_raw_os_error(libc::EPERM))));
        assert!(!is_eexist(&std::fmt::Error));
    }
}
