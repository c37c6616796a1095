//! The TC egress fan-out on real interfaces: a chunk a kernel root sends
//! once, flagged FANOUT, reaches every other member of an 8-host cluster
//! exactly once, byte for byte, addressed to each; the root's counters show
//! the clones.

use std::{
    net::Ipv4Addr,
    time::{Duration, Instant},
};

use aggbox_core::{
    cluster::Cluster,
    loader::{Attachment, HooksChoice},
    maps::{Ctl, RxCtl, BSTAT_NAMES, RX_PHASES, RX_WINDOW},
    netif,
    rendezvous::{GroupInfo, PeerInfo},
    transport::Transport,
    wire::{Header, Kind, FLAG_FANOUT, HDR_LEN},
    Datapath,
};

/// A control block whose receive side for `rx.seq` (its phase) is `rx`.
fn rx_ctl(rx: RxCtl) -> Ctl {
    let mut ctl = Ctl::default();
    ctl.rx[(rx.seq % RX_PHASES) as usize] = rx;
    ctl
}

const HOSTS: usize = 8;
const PORT: u16 = 47_100;

/// A group of every host of `cluster`, and on every host a socket and the
/// programs with the group registered (as a communicator would), on the
/// XDP hooks this cluster's bridge is made for.
fn kernel_group(cluster: &Cluster, id: u32) -> (GroupInfo, Vec<(Transport, Attachment)>) {
    let peers: Vec<PeerInfo> = cluster
        .hosts()
        .iter()
        .map(|h| PeerInfo { rank: h.index, ipv4: h.ipv4, mac: h.mac, port: PORT, datapath: Datapath::Kernel, mtu: 1500 })
        .collect();
    let group = GroupInfo { group: id, token: 0x1234_5678_9abc_def0 ^ u64::from(id), peers };
    let hosts = (0..HOSTS)
        .map(|i| {
            let group = group.clone();
            cluster
                .run_in(i, move || {
                    let iface = netif::choose(Some("eth0"), Ipv4Addr::UNSPECIFIED).unwrap();
                    let transport = Transport::bind(iface.ipv4, PORT).unwrap();
                    let mut attachment = Attachment::acquire_on(&iface, PORT, HooksChoice::Xdp).unwrap();
                    attachment.register_group(&group).unwrap();
                    (transport, attachment)
                })
                .unwrap()
        })
        .collect();
    (group, hosts)
}

#[test]
fn a_fanout_chunk_reaches_every_member_once() {
    let cluster = Cluster::temporary(HOSTS).unwrap();
    let (group, hosts) = kernel_group(&cluster, 0x00fa_0017);
    let peers = &group.peers;

    // Rank 0 sends one chunk, once, to rank 1, flagged FANOUT.
    let payload: Vec<u8> = (0..1000u32).map(|i| (i * 13 + 1) as u8).collect();
    let mut header = Header::new(Kind::BcastData, group.group, group.token, 0, 1);
    header.flags = FLAG_FANOUT;
    header.nchunks = 1;
    header.count = payload.len() as u32;
    let mut datagram = vec![0u8; HDR_LEN];
    header.write_to(&mut datagram);
    datagram.extend_from_slice(&payload);
    hosts[0].0.send(&datagram, peers[1].addr()).unwrap();

    let mut buf = vec![0u8; 4096];
    for (rank, (transport, _)) in hosts.iter().enumerate().skip(1) {
        let got = transport.recv(&mut buf, Instant::now() + Duration::from_secs(5)).unwrap();
        let (len, from) = got.unwrap_or_else(|| panic!("rank {rank} got no copy"));
        assert_eq!(from, peers[0].addr(), "rank {rank}: from the root");
        assert_eq!(&buf[..len], &datagram[..], "rank {rank}: the chunk, byte for byte");
        // Exactly one copy.
        let again = transport.recv(&mut buf, Instant::now() + Duration::from_millis(50)).unwrap();
        assert!(again.is_none(), "rank {rank} got a second copy");
    }
    let cloned = hosts[0].1.broadcast_stats().unwrap()[BSTAT_NAMES.iter().position(|n| *n == "cloned").unwrap()];
    assert_eq!(cloned, HOSTS as u64 - 1, "the original goes to rank 1, clones to the other six");
    // The root got none of it back.
    assert!(hosts[0].0.recv(&mut buf, Instant::now() + Duration::from_millis(50)).unwrap().is_none());
}

#[test]
fn receivers_place_and_answer_in_the_kernel_and_the_root_folds() {
    use std::sync::atomic::Ordering;

    let cluster = Cluster::temporary(HOSTS).unwrap();
    let (group, hosts) = kernel_group(&cluster, 0x00fa_0018);
    let peers = &group.peers;
    const P: u32 = 1432;
    let (seq, nchunks, total) = (7u32, 2u32, P + 10);
    // Receivers arm their windows; the root arms its send window for chunk 0.
    for (rank, (_, attachment)) in hosts.iter().enumerate() {
        let windows = attachment.windows().expect("a control block");
        let ctl = if rank == 0 {
            Ctl { tx_seq: seq, tx_nchunks: nchunks, tx_receivers: HOSTS as u32 - 1, tx_notify: 1, ..Ctl::default() }
        } else {
            rx_ctl(RxCtl {
                seq,
                root: 0,
                rank: rank as u32,
                nchunks,
                target: nchunks,
                claim: aggbox_core::maps::CLAIM_SET,
                count: total,
                chunk_bytes: P,
                last_bytes: 10,
                credit: RX_WINDOW,
                ..RxCtl::default()
            })
        };
        // SAFETY: this test is the only user of these control blocks.
        unsafe { windows.ctl().write(ctl) };
    }
    // SAFETY: as above.
    unsafe { (*hosts[0].1.windows().unwrap().tx_slot(0)).tag = (u64::from(seq)) << 32 };

    let payload: Vec<u8> = (0..P).map(|i| (i * 31 + 7) as u8).collect();
    let mut header = Header::new(Kind::BcastData, group.group, group.token, 0, seq);
    header.flags = FLAG_FANOUT;
    header.nchunks = nchunks;
    header.count = total;
    let mut datagram = vec![0u8; HDR_LEN];
    header.write_to(&mut datagram);
    datagram.extend_from_slice(&payload);
    hosts[0].0.send(&datagram, peers[1].addr()).unwrap();

    // The root's one wake-up: the group-ACK, when all seven hold chunk 0.
    let mut buf = vec![0u8; 4096];
    let (len, _) = hosts[0].0.recv(&mut buf, Instant::now() + Duration::from_secs(5)).unwrap().expect("group-ACK");
    let (ack, kind) = Header::read_from(&buf[..len]).unwrap();
    assert_eq!(kind, Kind::BcastAck);
    assert_eq!(ack.flags, aggbox_core::wire::FLAG_GROUP);
    assert_eq!((ack.seq, ack.count), (seq, 1));
    let slot = unsafe { *hosts[0].1.windows().unwrap().tx_slot(0) };
    assert_eq!(slot.count, HOSTS as u32 - 1);
    assert_eq!(slot.bits[0], 0b1111_1110, "ranks 1..7");
    for (rank, (transport, attachment)) in hosts.iter().enumerate().skip(1) {
        let windows = attachment.windows().unwrap();
        assert_eq!(windows.rx_tag(seq, 0).load(Ordering::Acquire), u64::from(seq) << 32, "rank {rank}: placed");
        let mut placed = vec![0u8; P as usize];
        windows.copy_rx(seq, 0, &mut placed);
        assert_eq!(placed, payload, "rank {rank}: byte for byte");
        // Nothing reached the receiver's socket: XDP answered for it.
        assert!(transport.recv(&mut buf, Instant::now() + Duration::from_millis(20)).unwrap().is_none(), "rank {rank}");
        let stats = attachment.broadcast_stats().unwrap();
        let stat = |name: &str| stats[BSTAT_NAMES.iter().position(|n| *n == name).unwrap()];
        assert_eq!((stat("placed"), stat("acks_sent"), stat("to_user")), (1, 1, 0), "rank {rank}");
    }
    let stats = hosts[0].1.broadcast_stats().unwrap();
    let stat = |name: &str| stats[BSTAT_NAMES.iter().position(|n| *n == name).unwrap()];
    assert_eq!((stat("cloned"), stat("acks_folded"), stat("group_acks")), (7, 7, 1));

    // The last chunk completes the broadcast: each receiver's XDP passes a
    // landed notice up, and TC ingress answers the chunk on the way, so the
    // root's group-ACK needs no receiving process.
    hosts[0].1.windows().unwrap().prepare_tx(seq, 1);
    let mut header = Header::new(Kind::BcastData, group.group, group.token, 0, seq);
    header.flags = FLAG_FANOUT;
    header.chunk = 1;
    header.nchunks = nchunks;
    header.count = total;
    let mut last = vec![0u8; HDR_LEN];
    header.write_to(&mut last);
    last.extend_from_slice(&[0x5a; 10]);
    hosts[0].0.send(&last, peers[1].addr()).unwrap();
    let (len, _) = hosts[0].0.recv(&mut buf, Instant::now() + Duration::from_secs(5)).unwrap().expect("group-ACK");
    let (ack, _) = Header::read_from(&buf[..len]).unwrap();
    assert_eq!((ack.flags, ack.count), (aggbox_core::wire::FLAG_GROUP, 2), "both chunks held by all");
    for (rank, (transport, attachment)) in hosts.iter().enumerate().skip(1) {
        let (len, _) = transport.recv(&mut buf, Instant::now() + Duration::from_secs(5)).unwrap().expect("notice");
        let (notice, kind) = Header::read_from(&buf[..len]).unwrap();
        assert_eq!(kind, Kind::BcastLanded, "rank {rank}");
        assert_eq!(notice.flags, aggbox_core::wire::FLAG_ANSWERED, "rank {rank}: answered by the kernel");
        assert_eq!((notice.seq, notice.chunk, notice.count, notice.sender), (seq, 1, 2, 0), "rank {rank}");
        let mut placed = vec![0u8; 10];
        attachment.windows().unwrap().copy_rx(seq, 1, &mut placed);
        assert_eq!(placed, vec![0x5a; 10], "rank {rank}");
    }
}

/// Approximate agreement on real interfaces: XDP folds a phase's values at
/// a rank and wakes its socket once, with an AGREE_QUORUM, when the quorum
/// is in (through TC ingress, which lets it up); a rank that lags is
/// answered by XDP_TX and its answer reaches that rank's socket.
#[test]
fn agreement_values_fold_notify_and_answer_on_real_interfaces() {
    use aggbox_core::{
        maps::ASTAT_NAMES,
        window::{AgreeArm, AgreeFold},
        wire::{AgreeBody, FLAG_ANSWER},
    };
    let cluster = Cluster::temporary(HOSTS).unwrap();
    let (group, hosts) = kernel_group(&cluster, 0x00fa_0019);
    let peers = &group.peers;
    let (seq, last) = (5u32, 4u32);
    let value_of = |sender: u16, phase: u32, value: f64, flags: u16| {
        let mut header = Header::new(Kind::AgreeValue, group.group, group.token, sender, seq);
        header.chunk = phase;
        header.nchunks = last;
        header.flags = flags;
        let mut datagram = vec![0u8; HDR_LEN];
        header.write_to(&mut datagram);
        datagram.extend_from_slice(&AgreeBody { value: value.to_bits(), incarnation: 1, reserved: 0 }.to_bytes());
        datagram
    };
    let windows = hosts[0].1.windows().expect("a control block");
    windows.arm_agree(&AgreeArm { seq, phase: 1, last, quorum: 3, rank: 0, value: 0.25, incarnation: 9 });
    let fold = |w: &aggbox_core::window::Windows| -> AgreeFold { w.agree_fold() };

    // Rank 1's value is folded and dropped; nothing reaches rank 0's socket.
    hosts[1].0.send(&value_of(1, 1, -4.0, 0), peers[0].addr()).unwrap();
    let deadline = Instant::now() + Duration::from_secs(5);
    while fold(windows).count < 2 {
        assert!(Instant::now() < deadline, "rank 1's value was not folded");
        std::thread::sleep(Duration::from_millis(1));
    }
    let mut buf = vec![0u8; 4096];
    assert!(hosts[0].0.recv(&mut buf, Instant::now() + Duration::from_millis(50)).unwrap().is_none());
    // Rank 2's completes the quorum: the one notice, carrying its value.
    let from2 = value_of(2, 1, 8.5, 0);
    hosts[2].0.send(&from2, peers[0].addr()).unwrap();
    let (len, from) = hosts[0].0.recv(&mut buf, Instant::now() + Duration::from_secs(5)).unwrap().expect("the quorum notice");
    assert_eq!(from, peers[2].addr());
    let (header, kind) = Header::read_from(&buf[..len]).unwrap();
    assert_eq!((kind, header.sender, header.chunk, len), (Kind::AgreeQuorum, 2, 1, from2.len()));
    assert_eq!(&buf[HDR_LEN..len], &from2[HDR_LEN..], "the body kept");
    let f = fold(windows);
    assert_eq!((f.count, f.notified, f.min, f.max, f.senders[0]), (3, true, -4.0, 8.5, 0b111));

    // Rank 3 lags (phase 0): XDP answers it with rank 0's value of phase 1.
    hosts[3].0.send(&value_of(3, 0, 100.0, 0), peers[0].addr()).unwrap();
    let (len, from) = hosts[3].0.recv(&mut buf, Instant::now() + Duration::from_secs(5)).unwrap().expect("the answer");
    assert_eq!(from, peers[0].addr(), "from rank 0");
    let (header, kind) = Header::read_from(&buf[..len]).unwrap();
    assert_eq!((kind, header.sender, header.chunk, header.nchunks, header.flags), (Kind::AgreeValue, 0, 1, last, FLAG_ANSWER));
    let body = AgreeBody::from_bytes(&buf[HDR_LEN..len]).unwrap();
    assert_eq!((f64::from_bits(body.value), body.incarnation, len), (0.25, 9, HDR_LEN + 16));
    // Nothing more at rank 0's socket; its host's counters say what XDP did.
    assert!(hosts[0].0.recv(&mut buf, Instant::now() + Duration::from_millis(50)).unwrap().is_none());
    let stats = hosts[0].1.agree_stats().unwrap();
    let stat = |name: &str| stats[ASTAT_NAMES.iter().position(|n| *n == name).unwrap()];
    assert_eq!((stat("folded"), stat("quorums"), stat("answered")), (1, 1, 1), "{stats:?}");
    windows.disarm_agree();
}
