//! The virtual cluster: N hosts on one machine, for tests, demos and
//! benchmarks.
//!
//! Each host is a network namespace `<prefix>-h<i>` with one interface,
//! `eth0`, addressed 10.77.0.(i+1)/24 with a MAC that embeds that address.
//! Its veth peer `port<i>` is a port of the bridge `br0`, which lives in a
//! namespace of its own, `<prefix>-sw`, so the root namespace is never
//! touched. A bare XDP program is attached to every bridge-side port: a veth
//! only accepts the `XDP_TX` frames of its peer when an XDP program runs on
//! it. Faults ([`crate::fault`]) are injected at TC egress of those ports,
//! which every frame delivered to a host passes once.
//!
//! A *plain* cluster ([`ClusterSpec::with_plain`]) has no XDP program on
//! any interface: the network users have (Docker's, Kubernetes pods', most
//! VMs'), and the one TCP peers such as Open MPI run on. An XDP program on a
//! veth turns TSO/GSO off on its peer, so on a cluster with the bare XDP
//! program the hosts' TCP and UDP GSO super-packets are cut into MTU-sized
//! frames; on a plain one they are not. AggBox's `XDP_TX` replies (the XDP
//! hooks) are not delivered between the hosts of a plain cluster: there its
//! hosts run on the TC hooks (`loader::Hooks`), which the default `auto`
//! picks on a veth. Faults are TC programs on the ports, which do not turn
//! GSO off: they can be injected on both kinds (on a plain cluster a fault
//! hits a whole super-packet, on the other a single segment).
//!
//! [`Cluster::command`] starts the processes of a cluster with the bare XDP
//! program on the XDP hooks (`AGGBOX_HOOKS=xdp`, which a caller may
//! override): that is what the program is there for.
//!
//! Namespaces and links are made with `ip`; BPF programs are attached from a
//! thread that has entered the switch namespace (`setns` moves only the
//! calling thread). Dropping a [`Cluster`] removes its namespaces, which
//! removes the veths, the bridge and the programs attached to them.
//! [`Cluster::keep`] leaves a cluster up after the process exits (its BPF links
//! pinned under [`PIN_ROOT`]), and [`down`] removes it later.

use std::{
    collections::BTreeSet,
    ffi::CString,
    fs, io,
    net::Ipv4Addr,
    os::fd::AsRawFd,
    path::{Path, PathBuf},
    process::Command,
    sync::{
        atomic::{AtomicUsize, Ordering},
        OnceLock,
    },
    thread,
};

use aya::{
    programs::{links::FdLink, xdp::XdpLinkId, Xdp, XdpMode},
    Ebpf,
};

use crate::{
    bpf,
    fault::{bpf_error, FaultInjector, FaultSpec, FaultStats},
    netif::format_mac,
    Error, Result,
};

/// The MTU of a cluster unless its spec says otherwise.
pub const DEFAULT_MTU: u32 = 1500;
/// The most hosts a cluster can have (one /24, less the network and
/// broadcast addresses).
pub const MAX_HOSTS: usize = 254;
/// The subnet of every cluster's hosts.
pub const SUBNET: Ipv4Addr = Ipv4Addr::new(10, 77, 0, 0);
/// The prefix length of [`SUBNET`].
pub const SUBNET_PREFIX_LEN: u8 = 24;
/// The name of each host's interface, inside its namespace.
pub const IFACE: &str = "eth0";
/// Where [`Cluster::keep`] pins the BPF links of a cluster, one directory per
/// prefix.
pub const PIN_ROOT: &str = "/sys/fs/bpf/aggbox-cluster";

/// The smallest MTU IPv4 allows.
const MIN_MTU: u32 = 68;
/// The largest MTU a veth takes.
const MAX_MTU: u32 = 65535;
/// Prefixes are at most this long, so that names stay readable.
const MAX_PREFIX_LEN: usize = 32;
/// The bridge, inside the switch namespace.
const BRIDGE: &str = "br0";
/// Bridge-side veth of host i: `port<i>`, inside the switch namespace.
const PORT: &str = "port";
/// Namespace of the switch: `<prefix>-sw`.
const SWITCH_SUFFIX: &str = "sw";
/// Namespace of host i: `<prefix>-h<i>`.
const HOST_SUFFIX: &str = "h";
/// Where `ip netns` keeps its named namespaces.
const NETNS_DIR: &str = "/run/netns";
/// Where the bpffs is mounted.
const BPFFS: &str = "/sys/fs/bpf";
/// Temporary prefixes are `abt<pid>x<counter>`.
const TEMPORARY_PREFIX: &str = "abt";
/// Separates the pid from the counter in a temporary prefix.
const TEMPORARY_SEPARATOR: char = 'x';
/// First byte of every host MAC: locally administered, unicast.
const MAC_LOCAL_UNICAST: u8 = 0x02;
/// Where `ip` may be, first match wins; else it is looked up in `PATH`.
const IP_CANDIDATES: [&str; 4] = ["/usr/sbin/ip", "/sbin/ip", "/usr/bin/ip", "/bin/ip"];

/// What cluster to make.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ClusterSpec {
    /// How many hosts, 1 to [`MAX_HOSTS`].
    pub hosts: usize,
    /// Start of every namespace name: letters, digits, `_` and `-`, starting
    /// with a letter or digit, at most 32 characters.
    pub prefix: String,
    /// The MTU of every link.
    pub mtu: u32,
    /// No program on any interface, not even the bare XDP program on the
    /// bridge ports (see the module's docs); faults are refused.
    pub plain: bool,
}

impl ClusterSpec {
    /// `hosts` hosts named after `prefix`, with the [`DEFAULT_MTU`].
    pub fn new(prefix: impl Into<String>, hosts: usize) -> Self {
        ClusterSpec {
            hosts,
            prefix: prefix.into(),
            mtu: DEFAULT_MTU,
            plain: false,
        }
    }

    /// The same spec with another MTU.
    pub fn with_mtu(self, mtu: u32) -> Self {
        ClusterSpec { mtu, ..self }
    }

    /// The same spec, plain (no program on any interface) or not.
    pub fn with_plain(self, plain: bool) -> Self {
        ClusterSpec { plain, ..self }
    }

    /// Checks the host count, the prefix and the MTU.
    pub fn validate(&self) -> Result<()> {
        if !(1..=MAX_HOSTS).contains(&self.hosts) {
            return Err(Error::InvalidArgument(format!(
                "a cluster has 1 to {MAX_HOSTS} hosts, not {}",
                self.hosts
            )));
        }
        if !(MIN_MTU..=MAX_MTU).contains(&self.mtu) {
            return Err(Error::InvalidArgument(format!(
                "MTU {} is not in {MIN_MTU}..={MAX_MTU}",
                self.mtu
            )));
        }
        validate_prefix(&self.prefix)
    }
}

/// One host of a cluster.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Host {
    /// Its index in the cluster, from 0.
    pub index: usize,
    /// Its network namespace (a name for `ip netns`).
    pub netns: String,
    /// Its interface, inside the namespace ([`IFACE`]).
    pub iface: String,
    /// The address of that interface.
    pub ipv4: Ipv4Addr,
    /// The hardware address of that interface.
    pub mac: [u8; 6],
    /// Its bridge-side veth, inside the switch namespace.
    pub port: String,
    /// Whether the bare XDP program on `port` runs in driver (native) mode.
    /// If not (it fell back to generic mode, e.g. because the MTU is too big
    /// for native XDP on veth, or the cluster is plain and `port` has no
    /// program), `XDP_TX` from this host is not delivered.
    pub port_native_xdp: bool,
}

/// The address of host `index` of any cluster: 10.77.0.(index+1).
pub fn host_ipv4(index: usize) -> Ipv4Addr {
    Ipv4Addr::from(u32::from(SUBNET) + index as u32 + 1)
}

/// The MAC of host `index` of any cluster: locally administered, ending with
/// the host's IPv4 address (`02:00:0a:4d:00:01` for host 0).
pub fn host_mac(index: usize) -> [u8; 6] {
    let [a, b, c, d] = host_ipv4(index).octets();
    [MAC_LOCAL_UNICAST, 0, a, b, c, d]
}

/// The namespace of the switch of cluster `prefix`.
fn switch_netns(prefix: &str) -> String {
    format!("{prefix}-{SWITCH_SUFFIX}")
}

/// The namespace of host `index` of cluster `prefix`.
fn host_netns(prefix: &str, index: usize) -> String {
    format!("{prefix}-{HOST_SUFFIX}{index}")
}

/// Whether namespace `name` is one of cluster `prefix`.
fn belongs(prefix: &str, name: &str) -> bool {
    let Some(rest) = name.strip_prefix(prefix).and_then(|rest| rest.strip_prefix('-')) else {
        return false;
    };
    rest == SWITCH_SUFFIX
        || rest
            .strip_prefix(HOST_SUFFIX)
            .is_some_and(|index| !index.is_empty() && index.bytes().all(|b| b.is_ascii_digit()))
}

fn validate_prefix(prefix: &str) -> Result<()> {
    let starts_well = prefix.chars().next().is_some_and(|c| c.is_ascii_alphanumeric());
    let chars_ok = prefix
        .chars()
        .all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '-');
    if starts_well && chars_ok && prefix.len() <= MAX_PREFIX_LEN {
        Ok(())
    } else {
        Err(Error::InvalidArgument(format!(
            "cluster prefix {prefix:?}: use 1 to {MAX_PREFIX_LEN} letters, digits, '_' or '-', starting with a letter or digit"
        )))
    }
}

/// The directory of the pinned links of cluster `prefix`.
fn pin_dir(prefix: &str) -> PathBuf {
    Path::new(PIN_ROOT).join(prefix)
}

/// Every named network namespace.
fn list_netns() -> Result<Vec<String>> {
    let entries = match fs::read_dir(NETNS_DIR) {
        Ok(entries) => entries,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(Vec::new()),
        Err(e) => return Err(Error::system(format!("listing {NETNS_DIR}"), e)),
    };
    let mut names = Vec::new();
    for entry in entries {
        let entry = entry.map_err(|e| Error::system(format!("listing {NETNS_DIR}"), e))?;
        names.push(entry.file_name().to_string_lossy().into_owned());
    }
    names.sort();
    Ok(names)
}

/// The namespaces of cluster `prefix`.
fn namespaces_of(prefix: &str) -> Result<Vec<String>> {
    Ok(list_netns()?.into_iter().filter(|name| belongs(prefix, name)).collect())
}

/// The `ip` binary of iproute2.
fn ip_binary() -> &'static str {
    static IP: OnceLock<&'static str> = OnceLock::new();
    IP.get_or_init(|| {
        IP_CANDIDATES
            .into_iter()
            .find(|path| Path::new(path).exists())
            .unwrap_or("ip")
    })
}

/// Runs `ip <args>`, failing with its stderr.
fn ip(args: &[&str]) -> Result<()> {
    let context = format!("ip {}", args.join(" "));
    let output = Command::new(ip_binary())
        .args(args)
        .output()
        .map_err(|e| Error::system(&context, e))?;
    if output.status.success() {
        return Ok(());
    }
    let stderr = String::from_utf8_lossy(&output.stderr).trim().to_string();
    Err(Error::system(
        context,
        io::Error::other(format!("{} ({})", stderr, output.status)),
    ))
}

/// Deletes a namespace, and first whatever AggBox attachments its
/// processes left pinned (a killed rank cannot unpin them itself).
fn delete_netns(name: &str) -> Result<()> {
    if let Ok(meta) = fs::metadata(Path::new(NETNS_DIR).join(name)) {
        use std::os::unix::fs::MetadataExt;
        if let Err(e) = crate::loader::remove_netns_pins(meta.ino()) {
            tracing::warn!(netns = %name, error = %e, "could not remove the AggBox pins of a namespace");
        }
    }
    ip(&["netns", "delete", name])
}

/// Runs `f` on a new thread inside network namespace `netns` and returns
/// what it returns; a panic in `f` is resumed on the calling thread.
fn in_netns<T: Send>(netns: &str, f: impl FnOnce() -> T + Send) -> Result<T> {
    let path = Path::new(NETNS_DIR).join(netns);
    let file = fs::File::open(&path).map_err(|e| Error::system(format!("opening {}", path.display()), e))?;
    thread::scope(|scope| {
        let handle = thread::Builder::new()
            .name(format!("netns {netns}"))
            .spawn_scoped(scope, move || {
                // SAFETY: setns on an open namespace file; it moves only this
                // thread, which ends when `f` returns.
                if unsafe { libc::setns(file.as_raw_fd(), libc::CLONE_NEWNET) } != 0 {
                    return Err(Error::system(
                        format!("entering network namespace {netns}"),
                        io::Error::last_os_error(),
                    ));
                }
                drop(file);
                Ok(f())
            })
            .map_err(|e| Error::system("starting a thread", e))?;
        handle.join().unwrap_or_else(|panic| std::panic::resume_unwind(panic))
    })
}

/// Makes sure a bpffs is mounted at [`BPFFS`].
fn ensure_bpffs() -> Result<()> {
    let path = CString::new(BPFFS).expect("no NUL in a constant");
    // SAFETY: statfs fills a zeroed struct for a NUL-terminated path.
    let mut fs_info: libc::statfs = unsafe { std::mem::zeroed() };
    if unsafe { libc::statfs(path.as_ptr(), &mut fs_info) } == 0 && fs_info.f_type as u32 == libc::BPF_FS_MAGIC as u32 {
        return Ok(());
    }
    let kind = CString::new("bpf").expect("no NUL in a constant");
    // SAFETY: mount with NUL-terminated strings and no data.
    if unsafe { libc::mount(kind.as_ptr(), path.as_ptr(), kind.as_ptr(), 0, std::ptr::null()) } != 0 {
        return Err(Error::system(
            format!("mount -t bpf bpf {BPFFS}"),
            io::Error::last_os_error(),
        ));
    }
    Ok(())
}

/// Removes the pins of cluster `prefix`, and [`PIN_ROOT`] once it is empty.
fn remove_pins(prefix: &str) -> Result<()> {
    let dir = pin_dir(prefix);
    match fs::remove_dir_all(&dir) {
        Ok(()) => {}
        Err(e) if e.kind() == io::ErrorKind::NotFound => {}
        Err(e) => return Err(Error::system(format!("removing {}", dir.display()), e)),
    }
    // Fails when other clusters are kept, or when there is no such directory.
    let _ = fs::remove_dir(PIN_ROOT);
    Ok(())
}

/// Removes every namespace of cluster `prefix` and its pinned links (those of
/// [`Cluster::keep`]); returns how many namespaces it removed.
pub fn down(prefix: &str) -> Result<usize> {
    validate_prefix(prefix)?;
    let names = namespaces_of(prefix)?;
    let mut first_error = None;
    for name in &names {
        if let Err(e) = delete_netns(name) {
            first_error.get_or_insert(e);
        }
    }
    if let Err(e) = remove_pins(prefix) {
        first_error.get_or_insert(e);
    }
    match first_error {
        Some(e) => Err(e),
        None => Ok(names.len()),
    }
}

/// The prefix and pid of a temporary cluster's namespace `name`.
fn temporary_owner(name: &str) -> Option<(&str, libc::pid_t)> {
    let (prefix, _) = name.split_once('-')?;
    let (pid, counter) = prefix.strip_prefix(TEMPORARY_PREFIX)?.split_once(TEMPORARY_SEPARATOR)?;
    let digits = |text: &str| !text.is_empty() && text.bytes().all(|b| b.is_ascii_digit());
    if !digits(pid) || !digits(counter) {
        return None;
    }
    Some((prefix, pid.parse().ok()?))
}

fn process_alive(pid: libc::pid_t) -> bool {
    // SAFETY: signal 0 only checks that the process exists.
    let exists = unsafe { libc::kill(pid, 0) } == 0;
    exists || io::Error::last_os_error().raw_os_error() == Some(libc::EPERM)
}

/// Removes the temporary clusters of processes that are gone (killed before
/// their clusters were dropped).
fn sweep_dead_temporaries() {
    let Ok(names) = list_netns() else { return };
    let dead: BTreeSet<&str> = names
        .iter()
        .filter_map(|name| temporary_owner(name))
        .filter(|&(_, pid)| !process_alive(pid))
        .map(|(prefix, _)| prefix)
        .collect();
    for prefix in dead {
        match down(prefix) {
            Ok(removed) => tracing::info!(prefix, removed, "removed a leftover temporary cluster"),
            Err(e) => tracing::warn!(prefix, error = %e, "could not remove a leftover temporary cluster"),
        }
    }
}

/// The bare XDP program and its links on the bridge-side ports.
struct PortXdp {
    ebpf: Ebpf,
    links: Vec<XdpLinkId>,
}

/// A virtual cluster; dropping it removes it (unless it was [kept](Cluster::keep)).
pub struct Cluster {
    prefix: String,
    mtu: u32,
    plain: bool,
    hosts: Vec<Host>,
    /// The namespaces made so far, removed on drop.
    created: Vec<String>,
    xdp: Option<PortXdp>,
    /// One per host when faults are injected, else none.
    faults: Vec<FaultInjector>,
    kept: bool,
}

impl std::fmt::Debug for Cluster {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Cluster")
            .field("prefix", &self.prefix)
            .field("mtu", &self.mtu)
            .field("plain", &self.plain)
            .field("hosts", &self.hosts)
            .field("faults_injected", &!self.faults.is_empty())
            .finish()
    }
}

/// Counter of the temporary clusters of this process.
static TEMPORARIES: AtomicUsize = AtomicUsize::new(0);

impl Cluster {
    /// Makes the cluster `spec` describes. Refuses if namespaces (or pins) of
    /// its prefix exist already; if a step fails, removes what it made.
    pub fn up(spec: ClusterSpec) -> Result<Cluster> {
        spec.validate()?;
        let prefix = spec.prefix;
        let existing = namespaces_of(&prefix)?;
        if !existing.is_empty() || pin_dir(&prefix).exists() {
            return Err(Error::InvalidArgument(format!(
                "a cluster {prefix:?} exists already (namespaces: {}); remove it with `aggbox cluster down {prefix}`",
                existing.join(", ")
            )));
        }
        // From here on an early return drops `cluster`, which removes what
        // was made.
        let mut cluster = Cluster {
            prefix,
            mtu: spec.mtu,
            plain: spec.plain,
            hosts: Vec::new(),
            created: Vec::new(),
            xdp: None,
            faults: Vec::new(),
            kept: false,
        };
        cluster.make_switch()?;
        for index in 0..spec.hosts {
            cluster.add_host(index)?;
        }
        if !spec.plain {
            cluster.attach_port_xdp()?;
        }
        tracing::debug!(prefix = %cluster.prefix, hosts = spec.hosts, mtu = spec.mtu, plain = spec.plain, "cluster up");
        Ok(cluster)
    }

    /// A cluster of `hosts` hosts with the [`DEFAULT_MTU`] under a prefix of
    /// its own (`abt<pid>x<n>`). Removes first the temporary clusters that
    /// processes killed earlier left behind.
    pub fn temporary(hosts: usize) -> Result<Cluster> {
        Self::temporary_with_mtu(hosts, DEFAULT_MTU)
    }

    /// [`Cluster::temporary`] with another MTU.
    pub fn temporary_with_mtu(hosts: usize, mtu: u32) -> Result<Cluster> {
        Self::temporary_of(hosts, mtu, false)
    }

    /// A [plain](ClusterSpec::with_plain) [`Cluster::temporary_with_mtu`]: no
    /// program on any interface.
    pub fn temporary_plain(hosts: usize, mtu: u32) -> Result<Cluster> {
        Self::temporary_of(hosts, mtu, true)
    }

    fn temporary_of(hosts: usize, mtu: u32, plain: bool) -> Result<Cluster> {
        sweep_dead_temporaries();
        let pid = std::process::id();
        let prefix = loop {
            let counter = TEMPORARIES.fetch_add(1, Ordering::Relaxed);
            let prefix = format!("{TEMPORARY_PREFIX}{pid}{TEMPORARY_SEPARATOR}{counter}");
            // Skip what a dead process with the same pid may have left.
            if namespaces_of(&prefix)?.is_empty() && !pin_dir(&prefix).exists() {
                break prefix;
            }
        };
        Self::up(ClusterSpec { hosts, prefix, mtu, plain })
    }

    fn add_netns(&mut self, name: String) -> Result<()> {
        ip(&["netns", "add", &name])?;
        self.created.push(name);
        Ok(())
    }

    fn make_switch(&mut self) -> Result<()> {
        let switch = switch_netns(&self.prefix);
        self.add_netns(switch.clone())?;
        let mtu = self.mtu.to_string();
        ip(&["-n", &switch, "link", "add", BRIDGE, "mtu", &mtu, "type", "bridge"])?;
        ip(&["-n", &switch, "link", "set", BRIDGE, "up"])
    }

    fn add_host(&mut self, index: usize) -> Result<()> {
        let switch = switch_netns(&self.prefix);
        let netns = host_netns(&self.prefix, index);
        self.add_netns(netns.clone())?;
        let (port, ipv4, mac) = (format!("{PORT}{index}"), host_ipv4(index), host_mac(index));
        let (mtu, mac_text, address) = (
            self.mtu.to_string(),
            format_mac(&mac),
            format!("{ipv4}/{SUBNET_PREFIX_LEN}"),
        );
        #[rustfmt::skip]
        ip(&["-n", &switch, "link", "add", &port, "mtu", &mtu, "type", "veth",
             "peer", "name", IFACE, "address", &mac_text, "mtu", &mtu, "netns", &netns])?;
        ip(&["-n", &switch, "link", "set", &port, "master", BRIDGE, "up"])?;
        ip(&["-n", &netns, "addr", "add", &address, "dev", IFACE])?;
        ip(&["-n", &netns, "link", "set", IFACE, "up"])?;
        ip(&["-n", &netns, "link", "set", "lo", "up"])?;
        self.hosts.push(Host {
            index,
            netns,
            iface: IFACE.into(),
            ipv4,
            mac,
            port,
            port_native_xdp: false,
        });
        Ok(())
    }

    /// Attaches the bare XDP program to every bridge-side port, in driver
    /// mode where the MTU allows it, else in generic mode.
    fn attach_port_xdp(&mut self) -> Result<()> {
        let ports: Vec<String> = self.hosts.iter().map(|host| host.port.clone()).collect();
        let (xdp, native) = in_netns(&switch_netns(&self.prefix), move || -> Result<(PortXdp, Vec<bool>)> {
            let mut ebpf = Ebpf::load(bpf::XDP_PASS).map_err(|e| bpf_error("loading the XDP pass object", e))?;
            let program: &mut Xdp = ebpf
                .program_mut(bpf::programs::XDP_PASS)
                .ok_or_else(|| Error::Internal(format!("no program {} in its object", bpf::programs::XDP_PASS)))?
                .try_into()
                .map_err(|e| bpf_error("the XDP pass program", e))?;
            program
                .load()
                .map_err(|e| bpf_error("loading the XDP pass program", e))?;
            let (mut links, mut native) = (Vec::new(), Vec::new());
            for port in &ports {
                let (link, is_native) = match program.attach(port, XdpMode::Driver) {
                    Ok(link) => (link, true),
                    Err(driver_error) => {
                        tracing::warn!(port, error = %driver_error, "native XDP refused; using generic XDP");
                        let link = program
                            .attach(port, XdpMode::Skb)
                            .map_err(|e| bpf_error(format!("attaching XDP to {port} (native: {driver_error})"), e))?;
                        (link, false)
                    }
                };
                links.push(link);
                native.push(is_native);
            }
            Ok((PortXdp { ebpf, links }, native))
        })??;
        for (host, is_native) in self.hosts.iter_mut().zip(native) {
            host.port_native_xdp = is_native;
        }
        self.xdp = Some(xdp);
        Ok(())
    }

    /// The prefix of its namespaces.
    pub fn prefix(&self) -> &str {
        &self.prefix
    }

    /// The MTU of its links.
    pub fn mtu(&self) -> u32 {
        self.mtu
    }

    /// Whether it is [plain](ClusterSpec::with_plain): no program on any
    /// interface.
    pub fn is_plain(&self) -> bool {
        self.plain
    }

    /// The namespace of its bridge.
    pub fn switch_netns(&self) -> String {
        switch_netns(&self.prefix)
    }

    /// Its hosts, by index.
    pub fn hosts(&self) -> &[Host] {
        &self.hosts
    }

    /// Host `index`.
    ///
    /// # Panics
    ///
    /// If there is no such host.
    pub fn host(&self, index: usize) -> &Host {
        &self.hosts[index]
    }

    /// A command that runs `program` inside host `index`
    /// (`ip netns exec <netns> <program>`); add its arguments. On a cluster
    /// with the bare XDP program on its ports it sets `AGGBOX_HOOKS=xdp`
    /// unless this process has `AGGBOX_HOOKS` (the caller may override it).
    ///
    /// # Panics
    ///
    /// If there is no such host.
    pub fn command(&self, index: usize, program: impl AsRef<std::ffi::OsStr>) -> Command {
        let mut command = Command::new(ip_binary());
        command.args(["netns", "exec", &self.host(index).netns]).arg(program);
        if !self.plain && std::env::var_os("AGGBOX_HOOKS").is_none() {
            command.env("AGGBOX_HOOKS", "xdp");
        }
        command
    }

    /// Runs `f` on a thread inside host `index`'s network namespace and
    /// returns its result. Sockets `f` opens belong to that host for their
    /// whole life, so `f` may return them for use from any thread. A panic in
    /// `f` is resumed here.
    ///
    /// # Panics
    ///
    /// If there is no such host.
    pub fn run_in<T: Send>(&self, index: usize, f: impl FnOnce() -> T + Send) -> Result<T> {
        in_netns(&self.host(index).netns, f)
    }

    /// Replaces the faults on the frames delivered to every host with `spec`
    /// ([`FaultSpec::NONE`] only counts them). A spec that reorders also puts
    /// the slow-path HTB qdisc of [`crate::fault`] at the root of every
    /// bridge-side port; one that does not leaves the ports without a qdisc.
    pub fn inject_faults(&mut self, spec: FaultSpec) -> Result<()> {
        spec.validate()?;
        // Two fault programs on one port would compound.
        self.clear_faults();
        let ports: Vec<String> = self.hosts.iter().map(|host| host.port.clone()).collect();
        self.faults = in_netns(&self.switch_netns(), move || {
            ports
                .iter()
                .map(|port| FaultInjector::attach(port, &spec))
                .collect::<Result<Vec<_>>>()
        })??;
        Ok(())
    }

    /// Removes the faults, if any: detaches the fault programs and removes
    /// their slow-path qdiscs (frames still waiting there are lost).
    pub fn clear_faults(&mut self) {
        self.faults.clear();
    }

    /// What the faults did to the frames delivered to each host, by host
    /// index.
    pub fn fault_stats(&self) -> Result<Vec<FaultStats>> {
        if self.faults.is_empty() {
            return Err(Error::InvalidArgument(format!(
                "no faults are injected in cluster {}",
                self.prefix
            )));
        }
        self.faults.iter().map(FaultInjector::stats).collect()
    }

    /// Leaves the cluster up after this process exits: pins its BPF links
    /// (none on a plain cluster, whose directory stays empty)
    /// under `PIN_ROOT/<prefix>/` (mounting the bpffs if needed) and does not
    /// remove it on drop. [`down`] removes it. Returns its prefix. If pinning
    /// fails, the cluster is removed.
    pub fn keep(mut self) -> Result<String> {
        ensure_bpffs()?;
        let dir = pin_dir(&self.prefix);
        fs::create_dir_all(&dir).map_err(|e| Error::system(format!("creating {}", dir.display()), e))?;
        if let Some(PortXdp { ebpf, links }) = self.xdp.as_mut() {
            let program: &mut Xdp = ebpf
                .program_mut(bpf::programs::XDP_PASS)
                .ok_or_else(|| Error::Internal("XDP pass program vanished".into()))?
                .try_into()
                .map_err(|e| bpf_error("the XDP pass program", e))?;
            for (link, host) in links.drain(..).zip(&self.hosts) {
                let link = program
                    .take_link(link)
                    .map_err(|e| bpf_error("taking an XDP link", e))?;
                let link = FdLink::try_from(link)
                    .map_err(|e| bpf_error(format!("the XDP link on {} is not a bpf_link", host.port), e))?;
                let path = dir.join(format!("xdp-{}", host.port));
                link.pin(&path)
                    .map_err(|e| bpf_error(format!("pinning {}", path.display()), e))?;
            }
        }
        for (fault, host) in std::mem::take(&mut self.faults).into_iter().zip(&self.hosts) {
            fault.pin(&dir.join(format!("fault-{}", host.port)))?;
        }
        self.kept = true;
        Ok(self.prefix.clone())
    }
}

impl Drop for Cluster {
    fn drop(&mut self) {
        if self.kept {
            return;
        }
        // Before the namespaces go: each injector removes its qdisc in the
        // switch namespace.
        self.clear_faults();
        self.xdp = None;
        for name in self.created.iter().rev() {
            if let Err(e) = delete_netns(name) {
                tracing::warn!(netns = %name, error = %e, "could not remove a namespace of the cluster");
            }
        }
        if let Err(e) = remove_pins(&self.prefix) {
            tracing::warn!(prefix = %self.prefix, error = %e, "could not remove the cluster's pins");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_belong_to_their_prefix_only() {
        assert!(belongs("abt1x1", "abt1x1-sw"));
        assert!(belongs("abt1x1", "abt1x1-h0"));
        assert!(belongs("abt1x1", "abt1x1-h12"));
        assert!(!belongs("abt1x1", "abt1x10-h0"));
        assert!(!belongs("abt1x1", "abt1x1-h"));
        assert!(!belongs("abt1x1", "abt1x1-h1-h0"));
        assert!(!belongs("abt1x1", "abt1x1-x"));
        assert_eq!(host_netns("c", 3), "c-h3");
        assert!(belongs("c", &host_netns("c", 3)));
        assert!(belongs("c", &switch_netns("c")));
    }

    #[test]
    fn temporary_names_give_their_pid() {
        assert_eq!(temporary_owner("abt42x7-h3"), Some(("abt42x7", 42)));
        assert_eq!(temporary_owner("abt42x7-sw"), Some(("abt42x7", 42)));
        assert_eq!(temporary_owner("abt42x-sw"), None);
        assert_eq!(temporary_owner("abtx7-sw"), None);
        assert_eq!(temporary_owner("abc42x7-sw"), None);
        assert_eq!(temporary_owner("abt42x7"), None);
        assert_eq!(temporary_owner("abt+42x7-sw"), None);
    }

    #[test]
    fn a_cluster_can_be_shared_between_threads() {
        fn shareable<T: Send + Sync>() {}
        shareable::<Cluster>();
    }

    #[test]
    fn addresses_are_per_host() {
        assert_eq!(host_ipv4(0), Ipv4Addr::new(10, 77, 0, 1));
        assert_eq!(host_ipv4(MAX_HOSTS - 1), Ipv4Addr::new(10, 77, 0, 254));
        assert_eq!(host_mac(0), [0x02, 0, 10, 77, 0, 1]);
        assert_ne!(host_mac(1), host_mac(2));
    }

    #[test]
    fn specs_are_checked() {
        assert!(ClusterSpec::new("ok-1_a", 3).validate().is_ok());
        assert!(ClusterSpec::new("ok", 3).with_mtu(3500).validate().is_ok());
        assert!(ClusterSpec::new("ok", 0).validate().is_err());
        assert!(ClusterSpec::new("ok", MAX_HOSTS + 1).validate().is_err());
        assert!(ClusterSpec::new("", 1).validate().is_err());
        assert!(ClusterSpec::new("-x", 1).validate().is_err());
        assert!(ClusterSpec::new("a/b", 1).validate().is_err());
        assert!(ClusterSpec::new("ok", 1).with_mtu(MIN_MTU - 1).validate().is_err());
        assert!(ClusterSpec::new("ok", 3).with_plain(true).validate().is_ok());
    }

    #[test]
    fn specs_are_not_plain_unless_asked() {
        let spec = ClusterSpec::new("ok", 2);
        assert!(!spec.plain);
        assert!(spec.clone().with_plain(true).plain);
        assert!(!spec.with_plain(true).with_mtu(9000).with_plain(false).plain);
    }
}
