//! The virtual cluster and its faults, on real network namespaces (run as
//! root). Every test removes what it made, also when it fails: a `Cluster`
//! removes itself on drop, during unwinding too, and kept clusters are
//! guarded by [`DownOnDrop`].

use std::{
    net::{Ipv4Addr, SocketAddr, UdpSocket},
    os::fd::AsRawFd,
    panic::{self, AssertUnwindSafe},
    path::Path,
    process::Command,
    sync::{
        atomic::{AtomicBool, Ordering},
        Arc,
    },
    thread,
    time::Duration,
};

use aggbox_core::{
    cluster::{self, Cluster, ClusterSpec, PIN_ROOT},
    fault::FaultSpec,
    netif::format_mac,
};

/// The UDP port the tests receive on, in every host.
const PORT: u16 = 47_000;
/// How long a receiver waits for a datagram before it gives up.
const TIMEOUT: Duration = Duration::from_secs(5);
/// The MTU near the most native XDP on veth takes without `xdp.frags`.
const JUMBO_MTU: u32 = 3500;
/// IPv4 and UDP headers, without options.
const IPV4_UDP_HEADERS: usize = 28;

/// The names `ip netns list` shows that belong to cluster `prefix`.
fn netns_of(prefix: &str) -> Vec<String> {
    let output = Command::new("ip")
        .args(["netns", "list"])
        .output()
        .expect("ip netns list");
    assert!(output.status.success(), "ip netns list: {output:?}");
    let own = format!("{prefix}-");
    String::from_utf8_lossy(&output.stdout)
        .lines()
        .filter_map(|line| line.split_whitespace().next())
        .filter(|name| name.starts_with(&own))
        .map(str::to_string)
        .collect()
}

/// Standard output of a command that must succeed.
fn stdout_of(mut command: Command) -> String {
    let output = command.output().expect("run a command");
    assert!(output.status.success(), "{command:?}: {output:?}");
    String::from_utf8_lossy(&output.stdout).into_owned()
}

/// Removes cluster `.0` when dropped, for clusters that were kept.
struct DownOnDrop(String);

impl Drop for DownOnDrop {
    fn drop(&mut self) {
        let _ = cluster::down(&self.0);
    }
}

fn bind(cluster: &Cluster, host: usize, port: u16) -> UdpSocket {
    let addr = SocketAddr::from((cluster.host(host).ipv4, port));
    cluster
        .run_in(host, || UdpSocket::bind(addr))
        .expect("enter the host")
        .expect("bind")
}

#[test]
fn datagram_goes_from_host_to_host_and_drop_removes_all() {
    let cluster = Cluster::temporary(3).unwrap();
    let prefix = cluster.prefix().to_string();
    let mut expected: Vec<String> = (0..3).map(|i| format!("{prefix}-h{i}")).collect();
    expected.push(format!("{prefix}-sw"));
    let mut shown = netns_of(&prefix);
    shown.sort();
    expected.sort();
    assert_eq!(shown, expected);

    for (i, host) in cluster.hosts().iter().enumerate() {
        assert_eq!(host.index, i);
        assert_eq!(host.ipv4, Ipv4Addr::new(10, 77, 0, i as u8 + 1));
        assert_eq!(host.iface, "eth0");
        assert!(host.port_native_xdp, "native XDP on {} at MTU 1500", host.port);
        assert_eq!(port_xdp_mode(&cluster, i), "xdp");
        let mut command = cluster.command(i, "ip");
        command.args(["-o", "-4", "addr", "show", "dev", "eth0"]);
        assert!(stdout_of(command).contains(&format!(" {}/24 ", host.ipv4)));
        let mut command = cluster.command(i, "ip");
        command.args(["-o", "link", "show", "dev", "eth0"]);
        let link = stdout_of(command);
        assert!(
            link.contains(&format!("link/ether {} ", format_mac(&host.mac))),
            "{link}"
        );
        assert!(link.contains(" mtu 1500 ") && link.contains("state UP"), "{link}");
    }
    let macs: std::collections::BTreeSet<[u8; 6]> = cluster.hosts().iter().map(|h| h.mac).collect();
    assert_eq!(macs.len(), 3);
    assert!(
        cluster.hosts().iter().all(|h| h.mac[0] & 0b11 == 0b10),
        "locally administered unicast"
    );

    let receiver = bind(&cluster, 2, PORT);
    receiver.set_read_timeout(Some(TIMEOUT)).unwrap();
    let sender = bind(&cluster, 0, 0);
    let message = b"hello from host 0";
    sender.send_to(message, (cluster.host(2).ipv4, PORT)).unwrap();
    let mut buf = [0u8; 64];
    let (len, from) = receiver.recv_from(&mut buf).unwrap();
    assert_eq!(&buf[..len], message);
    assert_eq!(from, sender.local_addr().unwrap());
    assert_eq!(from.ip(), cluster.host(0).ipv4);

    drop((sender, receiver));
    drop(cluster);
    assert_eq!(netns_of(&prefix), Vec::<String>::new());
}

#[test]
fn jumbo_mtu_keeps_native_xdp_and_carries_full_datagrams() {
    let cluster = Cluster::temporary_with_mtu(2, JUMBO_MTU).unwrap();
    for host in cluster.hosts() {
        assert!(host.port_native_xdp, "{host:?}");
        assert_eq!(port_xdp_mode(&cluster, host.index), "xdp");
    }
    let receiver = bind(&cluster, 1, PORT);
    receiver.set_read_timeout(Some(TIMEOUT)).unwrap();
    let sender = bind(&cluster, 0, 0);
    // Forbid fragmentation, so that the MTU decides what may be sent.
    let pmtudisc_do: libc::c_int = libc::IP_PMTUDISC_DO;
    // SAFETY: setsockopt with an int option on an open socket.
    let rc = unsafe {
        libc::setsockopt(
            sender.as_raw_fd(),
            libc::IPPROTO_IP,
            libc::IP_MTU_DISCOVER,
            (&pmtudisc_do as *const libc::c_int).cast(),
            std::mem::size_of::<libc::c_int>() as libc::socklen_t,
        )
    };
    assert_eq!(rc, 0);
    let largest = JUMBO_MTU as usize - IPV4_UDP_HEADERS;
    let payload: Vec<u8> = (0..largest).map(|i| i as u8).collect();
    let to = (cluster.host(1).ipv4, PORT);
    let too_big = sender.send_to(&[0u8; JUMBO_MTU as usize], to).unwrap_err();
    assert_eq!(too_big.raw_os_error(), Some(libc::EMSGSIZE));
    sender.send_to(&payload, to).unwrap();
    let mut buf = vec![0u8; JUMBO_MTU as usize];
    let (len, from) = receiver.recv_from(&mut buf).unwrap();
    assert_eq!(&buf[..len], &payload[..]);
    assert_eq!(from.ip(), cluster.host(0).ipv4);
}

#[test]
fn cluster_dropped_during_a_panic_removes_all() {
    let mut prefix = None;
    let outcome = panic::catch_unwind(AssertUnwindSafe(|| {
        let cluster = Cluster::temporary(2).unwrap();
        prefix = Some(cluster.prefix().to_string());
        assert_eq!(netns_of(cluster.prefix()).len(), 3);
        panic!("a test failing with a cluster up");
    }));
    assert!(outcome.is_err());
    let prefix = prefix.expect("the cluster was made");
    assert_eq!(netns_of(&prefix), Vec::<String>::new());
}

#[test]
fn leftovers_of_a_killed_process_are_swept() {
    // A pid that was alive and is no more.
    let mut child = Command::new("true").spawn().unwrap();
    let dead_pid = child.id();
    child.wait().unwrap();
    let leftover = format!("abt{dead_pid}x0");
    let _guard = DownOnDrop(leftover.clone());
    for suffix in ["sw", "h0"] {
        let status = Command::new("ip")
            .args(["netns", "add", &format!("{leftover}-{suffix}")])
            .status()
            .unwrap();
        assert!(status.success());
    }
    // (Not counted here: run in parallel, another test's cluster may sweep them already.)
    let cluster = Cluster::temporary(1).unwrap();
    assert_eq!(netns_of(&leftover), Vec::<String>::new());
    assert_eq!(netns_of(cluster.prefix()).len(), 2);
}

/// Gives a socket a receive buffer big enough for every test datagram.
fn grow_receive_buffer(socket: &UdpSocket, bytes: libc::c_int) {
    // SAFETY: setsockopt with an int option on an open socket.
    let rc = unsafe {
        libc::setsockopt(
            socket.as_raw_fd(),
            libc::SOL_SOCKET,
            libc::SO_RCVBUFFORCE,
            (&bytes as *const libc::c_int).cast(),
            std::mem::size_of::<libc::c_int>() as libc::socklen_t,
        )
    };
    assert_eq!(rc, 0, "SO_RCVBUFFORCE: {}", std::io::Error::last_os_error());
}

/// Numbered datagrams the fault tests send.
const DATAGRAMS: u32 = 5000;
/// Datagrams sent between two pauses of the sender.
const BURST: u32 = 50;
/// The sender's pause after each burst.
const PAUSE: Duration = Duration::from_millis(1);
/// How long the receiver waits for stragglers once the sender is done.
const QUIET: Duration = Duration::from_millis(500);
/// Receive buffer of the fault tests' receivers: room for every datagram.
const RECEIVE_BUFFER: libc::c_int = 16 << 20;
/// A datagram of the fault tests is its number, big-endian.
const SEQ_BYTES: usize = 4;

/// Sends [`DATAGRAMS`] datagrams numbered from 0, in bursts, from `sender`
/// (a socket of host 0) to UDP port `port` of host 1, and returns the numbers
/// host 1 received there, in the order they arrived.
fn send_numbered(cluster: &Cluster, sender: &UdpSocket, port: u16) -> Vec<u32> {
    let receiver = bind(cluster, 1, port);
    grow_receive_buffer(&receiver, RECEIVE_BUFFER);
    receiver.set_read_timeout(Some(QUIET)).unwrap();
    let sending = Arc::new(AtomicBool::new(true));

    let reader = {
        let sending = Arc::clone(&sending);
        thread::spawn(move || {
            let mut arrivals = Vec::with_capacity(DATAGRAMS as usize);
            let mut buf = [0u8; 64];
            loop {
                match receiver.recv(&mut buf) {
                    Ok(len) => {
                        assert_eq!(len, SEQ_BYTES);
                        arrivals.push(u32::from_be_bytes(buf[..SEQ_BYTES].try_into().unwrap()));
                    }
                    Err(e) if matches!(e.kind(), std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut) => {
                        if !sending.load(Ordering::SeqCst) {
                            return arrivals;
                        }
                    }
                    Err(e) => panic!("recv: {e}"),
                }
            }
        })
    };
    let to = (cluster.host(1).ipv4, port);
    for seq in 0..DATAGRAMS {
        sender.send_to(&seq.to_be_bytes(), to).unwrap();
        if seq % BURST == BURST - 1 {
            thread::sleep(PAUSE);
        }
    }
    sending.store(false, Ordering::SeqCst);
    reader.join().unwrap()
}

/// How many copies of each number arrived.
fn copies_of(arrivals: &[u32]) -> Vec<u32> {
    let mut copies = vec![0u32; DATAGRAMS as usize];
    for &seq in arrivals {
        copies[seq as usize] += 1;
    }
    copies
}

/// How many arrivals came after one with a higher number.
fn overtaken(arrivals: &[u32]) -> usize {
    let mut highest = None;
    let mut late = 0;
    for &seq in arrivals {
        if highest.is_some_and(|highest| seq < highest) {
            late += 1;
        }
        highest = highest.max(Some(seq));
    }
    late
}

/// The qdiscs `tc` shows at the bridge-side port of `host`.
fn port_qdiscs(cluster: &Cluster, host: usize) -> String {
    let mut command = Command::new("tc");
    command.args([
        "-n",
        &cluster.switch_netns(),
        "qdisc",
        "show",
        "dev",
        &cluster.host(host).port,
    ]);
    stdout_of(command)
}

#[test]
fn faults_drop_and_duplicate_what_they_count() {
    let mut cluster = Cluster::temporary(2).unwrap();
    cluster.inject_faults(FaultSpec::percent(10.0, 2.0)).unwrap();
    // Neither drop nor duplicate needs a qdisc.
    assert!(!port_qdiscs(&cluster, 1).contains("htb"));

    let sender = bind(&cluster, 0, 0);
    let arrivals = send_numbered(&cluster, &sender, PORT);
    let sent = u64::from(DATAGRAMS);
    let copies = copies_of(&arrivals);

    let received = arrivals.len() as u64;
    let distinct = copies.iter().filter(|&&c| c > 0).count() as u64;
    assert!(copies.iter().all(|&c| c <= 2), "a datagram came more than twice");

    let stats = cluster.fault_stats().unwrap();
    assert_eq!(stats.len(), 2);
    assert_eq!(stats[0].seen, 0, "nothing was sent to host 0: {:?}", stats[0]);
    let to_host1 = stats[1];
    eprintln!("sent {sent}, received {received} ({distinct} distinct), faults at host 1: {to_host1:?}");
    assert_eq!(to_host1.seen, sent, "{to_host1:?}");
    assert_eq!(
        received,
        to_host1.seen - to_host1.dropped + to_host1.duplicated,
        "{to_host1:?}"
    );
    assert_eq!(received, to_host1.delivered());
    assert_eq!(distinct, sent - to_host1.dropped, "{to_host1:?}");
    assert_eq!(received - distinct, to_host1.duplicated, "{to_host1:?}");
    assert!(to_host1.dropped > 0 && to_host1.duplicated > 0, "{to_host1:?}");
    assert_eq!(to_host1.delayed, 0, "{to_host1:?}");
    let dropped_fraction = to_host1.dropped as f64 / sent as f64;
    assert!((0.06..=0.14).contains(&dropped_fraction), "dropped {dropped_fraction}");

    // Without faults every datagram arrives once, and is still counted.
    cluster.inject_faults(FaultSpec::NONE).unwrap();
    let receiver = bind(&cluster, 1, PORT + 1);
    receiver.set_read_timeout(Some(TIMEOUT)).unwrap();
    sender.send_to(b"once", (cluster.host(1).ipv4, PORT + 1)).unwrap();
    let mut buf = [0u8; 8];
    assert_eq!(receiver.recv(&mut buf).unwrap(), 4);
    receiver.set_read_timeout(Some(QUIET)).unwrap();
    assert!(receiver.recv(&mut buf).is_err(), "a second copy arrived");
    assert_eq!(
        cluster.fault_stats().unwrap()[1],
        aggbox_core::fault::FaultStats {
            seen: 1,
            dropped: 0,
            duplicated: 0,
            delayed: 0,
        }
    );
    cluster.clear_faults();
    assert!(cluster.fault_stats().is_err());
}

#[test]
fn faults_reorder_without_loss_and_leave_no_qdisc() {
    const REORDER_PERCENT: f64 = 10.0;
    let mut cluster = Cluster::temporary(2).unwrap();
    let prefix = cluster.prefix().to_string();
    cluster
        .inject_faults(FaultSpec::percent(0.0, 0.0).reorder(REORDER_PERCENT))
        .unwrap();
    for host in 0..2 {
        let qdiscs = port_qdiscs(&cluster, host);
        assert!(qdiscs.contains("qdisc htb ab0f: root"), "{qdiscs}");
    }

    // Reordered only: every datagram arrives once, some after later ones.
    let sender = bind(&cluster, 0, 0);
    let arrivals = send_numbered(&cluster, &sender, PORT);
    let sent = u64::from(DATAGRAMS);
    let stats = cluster.fault_stats().unwrap();
    let to_host1 = stats[1];
    let late = overtaken(&arrivals);
    eprintln!(
        "reorder only: sent {sent}, received {}, {late} overtaken; faults at host 1: {to_host1:?}",
        arrivals.len()
    );
    assert_eq!(stats[0], Default::default(), "nothing was sent to host 0");
    assert_eq!(arrivals.len() as u64, sent, "{to_host1:?}");
    assert!(
        copies_of(&arrivals).iter().all(|&c| c == 1),
        "a datagram was lost or duplicated"
    );
    assert!(late > 0, "nothing arrived out of order: {to_host1:?}");
    assert_eq!(to_host1.seen, sent, "{to_host1:?}");
    assert_eq!((to_host1.dropped, to_host1.duplicated), (0, 0), "{to_host1:?}");
    assert_eq!(to_host1.delivered(), sent);
    let delayed_fraction = to_host1.delayed as f64 / sent as f64;
    assert!((0.06..=0.14).contains(&delayed_fraction), "delayed {delayed_fraction}");

    // Dropped, duplicated and reordered: the counters still say what arrived.
    cluster
        .inject_faults(FaultSpec::percent(10.0, 2.0).reorder(REORDER_PERCENT))
        .unwrap();
    let arrivals = send_numbered(&cluster, &sender, PORT + 1);
    let to_host1 = cluster.fault_stats().unwrap()[1];
    let copies = copies_of(&arrivals);
    let (received, distinct) = (arrivals.len() as u64, copies.iter().filter(|&&c| c > 0).count() as u64);
    let late = overtaken(&arrivals);
    eprintln!("all faults: sent {sent}, received {received} ({distinct} distinct), {late} overtaken; {to_host1:?}");
    assert_eq!(to_host1.seen, sent, "{to_host1:?}");
    assert_eq!(received, to_host1.delivered(), "{to_host1:?}");
    assert_eq!(distinct, sent - to_host1.dropped, "{to_host1:?}");
    assert_eq!(received - distinct, to_host1.duplicated, "{to_host1:?}");
    assert!(copies.iter().all(|&c| c <= 2), "a datagram came more than twice");
    assert!(
        to_host1.dropped > 0 && to_host1.duplicated > 0 && to_host1.delayed > 0,
        "{to_host1:?}"
    );
    assert!(late > 0, "nothing arrived out of order: {to_host1:?}");

    // Clearing the faults removes the qdisc; so does dropping the cluster.
    cluster.clear_faults();
    for host in 0..2 {
        let qdiscs = port_qdiscs(&cluster, host);
        assert!(!qdiscs.contains("htb"), "{qdiscs}");
    }
    cluster.inject_faults(FaultSpec::NONE.reorder(REORDER_PERCENT)).unwrap();
    assert!(port_qdiscs(&cluster, 1).contains("htb"));
    // Faults that do not reorder take the qdisc away.
    cluster.inject_faults(FaultSpec::percent(1.0, 0.0)).unwrap();
    assert!(!port_qdiscs(&cluster, 1).contains("htb"));
    cluster.inject_faults(FaultSpec::NONE.reorder(REORDER_PERCENT)).unwrap();
    drop((sender, cluster));
    assert_eq!(netns_of(&prefix), Vec::<String>::new());
}

#[test]
fn reordering_cluster_dropped_during_a_panic_removes_all() {
    let mut prefix = None;
    let outcome = panic::catch_unwind(AssertUnwindSafe(|| {
        let mut cluster = Cluster::temporary(2).unwrap();
        prefix = Some(cluster.prefix().to_string());
        cluster
            .inject_faults(FaultSpec::percent(1.0, 1.0).reorder(5.0))
            .unwrap();
        assert!(port_qdiscs(&cluster, 0).contains("htb"));
        panic!("a test failing with reordering faults injected");
    }));
    assert!(outcome.is_err());
    let prefix = prefix.expect("the cluster was made");
    assert_eq!(netns_of(&prefix), Vec::<String>::new());
}

#[test]
fn kept_cluster_outlives_its_value_until_down() {
    let prefix = format!("abk{}", std::process::id());
    let _guard = DownOnDrop(prefix.clone());
    let mut cluster = Cluster::up(ClusterSpec::new(&prefix, 2).with_mtu(JUMBO_MTU)).unwrap();
    cluster
        .inject_faults(FaultSpec::percent(1.0, 1.0).reorder(1.0))
        .unwrap();

    // A second cluster of the same prefix is refused and leaves the first alone.
    assert!(Cluster::up(ClusterSpec::new(&prefix, 1)).is_err());
    assert_eq!(netns_of(&prefix).len(), 3);

    assert_eq!(cluster.keep().unwrap(), prefix);
    assert_eq!(netns_of(&prefix).len(), 3);
    let pins = Path::new(PIN_ROOT).join(&prefix);
    let mut pinned: Vec<String> = std::fs::read_dir(&pins)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    pinned.sort();
    assert_eq!(pinned, ["fault-port0", "fault-port1", "xdp-port0", "xdp-port1"]);
    // The programs are still attached, held by their pins alone.
    let switch = format!("{prefix}-sw");
    for port in ["port0", "port1"] {
        let mut xdp = Command::new("ip");
        xdp.args(["-n", &switch, "-d", "link", "show", "dev", port]);
        assert!(stdout_of(xdp).contains("prog/xdp"), "XDP gone from {port}");
        let mut qdiscs = Command::new("tc");
        qdiscs.args(["-n", &switch, "qdisc", "show", "dev", port]);
        assert!(stdout_of(qdiscs).contains("htb"), "slow path gone from {port}");
    }

    assert_eq!(cluster::down(&prefix).unwrap(), 3);
    assert_eq!(netns_of(&prefix), Vec::<String>::new());
    assert!(!pins.exists());
    // The root goes once it is empty; clusters of tests running beside this
    // one may still pin under it, so only its being free of ours is asserted.
    if let Ok(others) = std::fs::read_dir(PIN_ROOT) {
        let names: Vec<_> = others.map(|e| e.unwrap().file_name()).collect();
        assert!(!names.iter().any(|n| *n == *prefix), "{names:?}");
    }
    assert_eq!(cluster::down(&prefix).unwrap(), 0);
}

/// The XDP mode `ip` shows on the bridge-side port of `host`: "xdp" (driver)
/// or "xdpgeneric".
fn port_xdp_mode(cluster: &Cluster, host: usize) -> String {
    let mut command = Command::new("ip");
    command.args([
        "-n",
        &cluster.switch_netns(),
        "-o",
        "link",
        "show",
        "dev",
        &cluster.host(host).port,
    ]);
    let link = stdout_of(command);
    let mode = link.split_whitespace().find(|word| word.starts_with("xdp"));
    mode.unwrap_or_else(|| panic!("no XDP on {}: {link}", cluster.host(host).port))
        .to_string()
}

#[test]
fn mtu_too_big_for_native_xdp_falls_back_to_generic() {
    const MTU: u32 = 9000;
    let cluster = Cluster::temporary_with_mtu(2, MTU).unwrap();
    for host in cluster.hosts() {
        assert!(!host.port_native_xdp);
        assert_eq!(port_xdp_mode(&cluster, host.index), "xdpgeneric");
    }
    let receiver = bind(&cluster, 1, PORT);
    receiver.set_read_timeout(Some(TIMEOUT)).unwrap();
    let payload = vec![7u8; MTU as usize - IPV4_UDP_HEADERS];
    bind(&cluster, 0, 0)
        .send_to(&payload, (cluster.host(1).ipv4, PORT))
        .unwrap();
    let mut buf = vec![0u8; MTU as usize];
    assert_eq!(receiver.recv(&mut buf).unwrap(), payload.len());
    assert_eq!(&buf[..payload.len()], &payload[..]);
}

/// What `ethtool -k` says of feature `name` on `eth0` of `host` ("on",
/// "off", "off [fixed]", ...).
fn eth0_feature(cluster: &Cluster, host: usize, name: &str) -> String {
    let mut command = cluster.command(host, "ethtool");
    command.args(["-k", "eth0"]);
    let features = stdout_of(command);
    features
        .lines()
        .find_map(|line| line.trim().strip_prefix(name)?.strip_prefix(':'))
        .unwrap_or_else(|| panic!("no {name} in ethtool -k eth0: {features}"))
        .trim()
        .to_string()
}

#[test]
fn plain_cluster_has_no_program_and_carries_udp_both_ways() {
    let prefix = format!("fbplain{}", std::process::id());
    let _guard = DownOnDrop(prefix.clone());
    let mut cluster = Cluster::up(ClusterSpec::new(&prefix, 2).with_plain(true)).unwrap();
    assert!(cluster.is_plain());
    for host in cluster.hosts() {
        assert!(!host.port_native_xdp, "{host:?}");
        // The same view of the port as port_xdp_mode's, which finds no XDP.
        let mut command = Command::new("ip");
        command.args(["-n", &cluster.switch_netns(), "-o", "-d", "link", "show", "dev", &host.port]);
        let link = stdout_of(command);
        assert!(!link.split_whitespace().any(|word| word.starts_with("xdp")), "XDP on {}: {link}", host.port);
        assert!(!link.contains("prog/xdp"), "XDP on {}: {link}", host.port);
        let mut command = Command::new("tc");
        command.args(["-n", &cluster.switch_netns(), "filter", "show", "dev", &host.port, "egress"]);
        assert_eq!(stdout_of(command).trim(), "", "a TC program on {}", host.port);
        // With no XDP on its peer, a host's veth keeps TSO.
        assert_eq!(eth0_feature(&cluster, host.index, "tcp-segmentation-offload"), "on");
    }
    // Faults are TC programs on the ports, which leave GSO on: a plain
    // cluster takes them, and is plain again once they are cleared.
    cluster.inject_faults(FaultSpec::NONE).unwrap();
    assert_eq!(eth0_feature(&cluster, 0, "tcp-segmentation-offload"), "on", "a TC program leaves TSO on");
    cluster.clear_faults();
    assert!(cluster.fault_stats().is_err());
    for host in cluster.hosts() {
        let mut command = Command::new("tc");
        command.args(["-n", &cluster.switch_netns(), "filter", "show", "dev", &host.port, "egress"]);
        assert_eq!(stdout_of(command).trim(), "", "a TC program left on {}", host.port);
    }

    // A datagram from host 0 to host 1, and its echo back.
    let receiver = bind(&cluster, 1, PORT);
    receiver.set_read_timeout(Some(TIMEOUT)).unwrap();
    let sender = bind(&cluster, 0, 0);
    sender.set_read_timeout(Some(TIMEOUT)).unwrap();
    let message = b"plain hello";
    sender.send_to(message, (cluster.host(1).ipv4, PORT)).unwrap();
    let mut buf = [0u8; 64];
    let (len, from) = receiver.recv_from(&mut buf).unwrap();
    assert_eq!(&buf[..len], message);
    assert_eq!(from.ip(), cluster.host(0).ipv4);
    receiver.send_to(&buf[..len], from).unwrap();
    let (len, from) = sender.recv_from(&mut buf).unwrap();
    assert_eq!(&buf[..len], message);
    assert_eq!(from, receiver.local_addr().unwrap());

    drop((sender, receiver, cluster));
    assert_eq!(netns_of(&prefix), Vec::<String>::new());
}

#[test]
fn aggbox_cluster_turns_tso_off_on_its_hosts() {
    // The reason plain clusters exist: the bare XDP program on the bridge
    // port takes TSO from the host's veth.
    let cluster = Cluster::temporary(1).unwrap();
    assert!(!cluster.is_plain());
    assert!(eth0_feature(&cluster, 0, "tcp-segmentation-offload").starts_with("off"));
}

#[test]
fn kept_plain_cluster_is_removed_by_down() {
    let prefix = format!("fbkeep{}", std::process::id());
    let _guard = DownOnDrop(prefix.clone());
    let cluster = Cluster::up(ClusterSpec::new(&prefix, 2).with_plain(true)).unwrap();
    assert_eq!(cluster.keep().unwrap(), prefix);
    assert_eq!(netns_of(&prefix).len(), 3);
    let pins = Path::new(PIN_ROOT).join(&prefix);
    assert_eq!(std::fs::read_dir(&pins).unwrap().count(), 0, "a plain cluster pins nothing");
    assert_eq!(cluster::down(&prefix).unwrap(), 3);
    assert_eq!(netns_of(&prefix), Vec::<String>::new());
    assert!(!pins.exists());
}
