//! Each AggBox BPF program, run with BPF_PROG_TEST_RUN on crafted frames:
//! traffic that is not AggBox's passes untouched, valid datagrams pass, and
//! malformed or foreign AggBox datagrams are dropped under the right counter.
//! Frames are built byte by byte here, independently of core's wire code.

use std::net::Ipv4Addr;

use aggbox_core::{
    maps::{Prog, STAT_NAMES},
    rendezvous::{GroupInfo, PeerInfo},
    testrun::{tc, xdp, Harness},
    Datapath,
};

const LOCAL_PORT: u16 = 47_001;
const PEER_PORT: u16 = 47_002;
const GROUP: u32 = 0x0102_0304;
const TOKEN: u64 = 0xfeed_beef_0bad_cafe;
const LOCAL_IP: Ipv4Addr = Ipv4Addr::new(10, 77, 0, 1);
const PEER_IP: Ipv4Addr = Ipv4Addr::new(10, 77, 0, 2);
const STRANGER_IP: Ipv4Addr = Ipv4Addr::new(10, 77, 0, 9);

fn group() -> GroupInfo {
    let peer = |rank: usize, ipv4, port| PeerInfo { rank, ipv4, mac: [2, 0, 0, 0, 0, rank as u8 + 1], port, datapath: Datapath::Kernel, mtu: 1500 };
    GroupInfo { group: GROUP, token: TOKEN, peers: vec![peer(0, LOCAL_IP, LOCAL_PORT), peer(1, PEER_IP, PEER_PORT)] }
}

/// The 40-byte AggBox header as docs/PROTOCOL.md lays it out.
fn aggbox_header(magic: u32, version: u8, kind: u8, group: u32, sender: u16, token: u64) -> Vec<u8> {
    let mut h = Vec::with_capacity(40);
    h.extend_from_slice(&magic.to_le_bytes());
    h.push(version);
    h.push(kind);
    h.extend_from_slice(&0u16.to_le_bytes()); // flags
    h.extend_from_slice(&group.to_le_bytes());
    h.extend_from_slice(&sender.to_le_bytes());
    h.push(0); // dtype
    h.push(0); // op
    h.extend_from_slice(&token.to_le_bytes());
    h.extend_from_slice(&7u32.to_le_bytes()); // seq
    h.extend_from_slice(&[0u8; 12]); // chunk, nchunks, count
    assert_eq!(h.len(), 40);
    h
}

fn good_header() -> Vec<u8> {
    aggbox_header(u32::from_le_bytes(*b"AGBX"), 1, 1, GROUP, 1, TOKEN)
}

fn ethernet(ethertype: u16, payload: &[u8]) -> Vec<u8> {
    let mut f = vec![2, 0, 0, 0, 0, 1, 2, 0, 0, 0, 0, 2];
    f.extend_from_slice(&ethertype.to_be_bytes());
    f.extend_from_slice(payload);
    f
}

fn ipv4(protocol: u8, src: Ipv4Addr, dst: Ipv4Addr, payload: &[u8]) -> Vec<u8> {
    let total = 20 + payload.len() as u16;
    let mut ip = vec![0x45, 0];
    ip.extend_from_slice(&total.to_be_bytes());
    ip.extend_from_slice(&[0, 1, 0x40, 0, 64, protocol, 0, 0]); // id, DF, ttl, proto, csum
    ip.extend_from_slice(&src.octets());
    ip.extend_from_slice(&dst.octets());
    // The header checksum, as RFC 791 defines it.
    let mut sum: u32 = ip.chunks(2).map(|w| u32::from(u16::from_be_bytes([w[0], w[1]]))).sum();
    while sum > 0xffff {
        sum = (sum & 0xffff) + (sum >> 16);
    }
    ip[10..12].copy_from_slice(&(!(sum as u16)).to_be_bytes());
    ip.extend_from_slice(payload);
    ethernet(0x0800, &ip)
}

fn udp(src: Ipv4Addr, sport: u16, dst: Ipv4Addr, dport: u16, payload: &[u8]) -> Vec<u8> {
    let mut u = Vec::new();
    u.extend_from_slice(&sport.to_be_bytes());
    u.extend_from_slice(&dport.to_be_bytes());
    u.extend_from_slice(&(8 + payload.len() as u16).to_be_bytes());
    u.extend_from_slice(&[0, 0]);
    u.extend_from_slice(payload);
    ipv4(17, src, dst, &u)
}

/// An AggBox datagram as it arrives (peer -> us) or leaves (us -> peer).
fn inbound(payload: &[u8]) -> Vec<u8> {
    udp(PEER_IP, PEER_PORT, LOCAL_IP, LOCAL_PORT, payload)
}

fn outbound(payload: &[u8]) -> Vec<u8> {
    // What rank 1 sends in the inbound cases, rank 0 (us) sends here.
    let mut header = payload.to_vec();
    if header.len() >= 14 && header[12..14] == 1u16.to_le_bytes() {
        header[12..14].copy_from_slice(&0u16.to_le_bytes());
    }
    udp(LOCAL_IP, LOCAL_PORT, PEER_IP, PEER_PORT, &header)
}

fn others() -> Vec<(&'static str, Vec<u8>)> {
    let tcp = ipv4(6, PEER_IP, LOCAL_IP, &[0x12, 0x34, 0xb7, 0x99, 0, 0, 0, 1, 0, 0, 0, 0, 0x50, 0x02, 0xff, 0xff, 0, 0, 0, 0]);
    let other_udp = udp(PEER_IP, PEER_PORT, LOCAL_IP, 53, &[0xde, 0xad, 0xbe, 0xef]);
    let arp = ethernet(0x0806, &[0, 1, 8, 0, 6, 4, 0, 1, 2, 0, 0, 0, 0, 2, 10, 77, 0, 2, 0, 0, 0, 0, 0, 0, 10, 77, 0, 1]);
    let ipv6 = ethernet(0x86dd, &[0x60, 0, 0, 0, 0, 8, 17, 64].iter().copied().chain([0u8; 40]).collect::<Vec<_>>());
    // An AggBox-looking payload to an unregistered port is not ours either.
    let unregistered = udp(PEER_IP, PEER_PORT, LOCAL_IP, LOCAL_PORT + 100, &good_header());
    vec![("tcp", tcp), ("other udp", other_udp), ("arp", arp), ("ipv6", ipv6), ("unregistered port", unregistered)]
}

/// (case, payload, counter it must land in).
fn malformed() -> Vec<(&'static str, Vec<u8>, &'static str)> {
    let magic = u32::from_le_bytes(*b"AGBX");
    vec![
        ("truncated header", good_header()[..20].to_vec(), "drop_truncated"),
        ("empty payload", Vec::new(), "drop_truncated"),
        ("bad magic", aggbox_header(0x1234_5678, 1, 1, GROUP, 1, TOKEN), "drop_bad_magic"),
        ("bad version", aggbox_header(magic, 9, 1, GROUP, 1, TOKEN), "drop_bad_version"),
        ("kind 0", aggbox_header(magic, 1, 0, GROUP, 1, TOKEN), "drop_bad_kind"),
        ("kind 200", aggbox_header(magic, 1, 200, GROUP, 1, TOKEN), "drop_bad_kind"),
        // Between the collectives' kinds and key-value reduce's (20..=24), and past them.
        ("kind 17", aggbox_header(magic, 1, 17, GROUP, 1, TOKEN), "drop_bad_kind"),
        ("kind 19", aggbox_header(magic, 1, 19, GROUP, 1, TOKEN), "drop_bad_kind"),
        ("kind 25", aggbox_header(magic, 1, 25, GROUP, 1, TOKEN), "drop_bad_kind"),
        ("unknown group", aggbox_header(magic, 1, 1, GROUP + 1, 1, TOKEN), "drop_unknown_group"),
        ("wrong token", aggbox_header(magic, 1, 1, GROUP, 1, TOKEN ^ 1), "drop_bad_token"),
        ("sender out of range", aggbox_header(magic, 1, 1, GROUP, 2, TOKEN), "drop_not_member"),
    ]
}

fn harness() -> Harness {
    let mut h = Harness::new().expect("load the AggBox programs (run as root)");
    h.register(LOCAL_IP, LOCAL_PORT, &group()).unwrap();
    h
}

fn counter(h: &Harness, prog: Prog, stat: &str) -> u64 {
    assert!(STAT_NAMES.contains(&stat));
    h.stats().unwrap().get(prog, stat)
}

fn check_program(prog: Prog, pass: u32, drop: u32, frame_of: fn(&[u8]) -> Vec<u8>) {
    let h = harness();
    for (case, frame) in others() {
        let out = h.run(prog, &frame).unwrap();
        assert_eq!(out.retval, pass, "{prog:?}: {case} must pass");
        assert_eq!(out.frame, frame, "{prog:?}: {case} must pass unchanged");
    }
    assert_eq!(counter(&h, prog, "passed_other"), others().len() as u64);

    let good = frame_of(&good_header());
    let out = h.run(prog, &good).unwrap();
    assert_eq!(out.retval, pass, "{prog:?}: a valid datagram passes");
    assert_eq!(out.frame, good);
    assert_eq!(counter(&h, prog, "accepted"), 1);

    for (case, payload, stat) in malformed() {
        let before = counter(&h, prog, stat);
        let out = h.run(prog, &frame_of(&payload)).unwrap();
        assert_eq!(out.retval, drop, "{prog:?}: {case} must be dropped");
        assert_eq!(counter(&h, prog, stat), before + 1, "{prog:?}: {case} counts under {stat}");
    }
    assert_eq!(counter(&h, prog, "accepted"), 1, "nothing malformed was accepted");
    let total = others().len() + 1 + malformed().len();
    assert_eq!(counter(&h, prog, "seen"), total as u64);
}

#[test]
fn xdp_ingress_classifies_frames() {
    check_program(Prog::XdpIngress, xdp::PASS, xdp::DROP, inbound);
}

#[test]
fn tc_ingress_classifies_frames() {
    check_program(Prog::TcIngress, tc::OK, tc::SHOT, inbound);
}

#[test]
fn tc_egress_classifies_frames() {
    check_program(Prog::TcEgress, tc::OK, tc::SHOT, outbound);
}

#[test]
fn datagram_from_a_non_member_address_is_dropped() {
    let h = harness();
    // Right group, token and rank, but sent from an address that is not rank 1's.
    let spoofed = udp(STRANGER_IP, PEER_PORT, LOCAL_IP, LOCAL_PORT, &good_header());
    assert_eq!(h.run(Prog::XdpIngress, &spoofed).unwrap().retval, xdp::DROP);
    let wrong_port = udp(PEER_IP, PEER_PORT + 1, LOCAL_IP, LOCAL_PORT, &good_header());
    assert_eq!(h.run(Prog::XdpIngress, &wrong_port).unwrap().retval, xdp::DROP);
    assert_eq!(counter(&h, Prog::XdpIngress, "drop_not_member"), 2);
    assert_eq!(counter(&h, Prog::XdpIngress, "accepted"), 0);
}

#[test]
fn truncated_ip_and_udp_headers_pass_as_not_ours() {
    let h = harness();
    let full = inbound(&good_header());
    // Cut inside the IPv4 header and inside the UDP header: not parseable as
    // AggBox, so it is the stack's business (it will drop them itself).
    for cut in [14 + 10, 14 + 20 + 4] {
        let out = h.run(Prog::XdpIngress, &full[..cut]).unwrap();
        assert_eq!(out.retval, xdp::PASS, "cut at {cut}");
    }
}

// ---- Broadcast (docs/BROADCAST.md, "Kernel datapath") ----------------------

use aggbox_core::maps::{Ctl, RxCtl, BSTAT_NAMES, RX_PHASES, RX_WINDOW};

/// A control block whose receive side for `rx.seq` (its phase) is `rx`.
fn rx_ctl(rx: RxCtl) -> Ctl {
    let mut ctl = Ctl::default();
    ctl.rx[(rx.seq % RX_PHASES) as usize] = rx;
    ctl
}


const BCAST_DATA: u8 = 6;
const BCAST_ACK: u8 = 7;
const BCAST_LANDED: u8 = 9;
const FLAG_GROUP: u16 = 0x0004;
const CTL: u32 = 3;
const P: usize = 1432;

/// A BCAST_DATA header: chunk `chunk` of `nchunks` of broadcast `seq`,
/// `count` u8 elements, from `sender`.
fn bcast_header(kind: u8, sender: u16, seq: u32, chunk: u32, nchunks: u32, count: u32) -> Vec<u8> {
    let mut h = aggbox_header(u32::from_le_bytes(*b"AGBX"), 1, kind, GROUP, sender, TOKEN);
    h[24..28].copy_from_slice(&seq.to_le_bytes());
    h[28..32].copy_from_slice(&chunk.to_le_bytes());
    h[32..36].copy_from_slice(&nchunks.to_le_bytes());
    h[36..40].copy_from_slice(&count.to_le_bytes());
    h
}

/// The one's-complement sum of an IPv4 header, independent of the programs.
fn ipv4_checksum_ok(ip: &[u8]) -> bool {
    let mut sum: u32 = ip.chunks(2).map(|w| u32::from(u16::from_be_bytes([w[0], w[1]]))).sum();
    while sum > 0xffff {
        sum = (sum & 0xffff) + (sum >> 16);
    }
    sum == 0xffff
}

fn bstat(h: &Harness, name: &str) -> u64 {
    h.broadcast_stats().unwrap()[BSTAT_NAMES.iter().position(|n| *n == name).unwrap()]
}

fn kind_of(frame: &[u8]) -> u8 {
    frame[14 + 20 + 8 + 5]
}

#[test]
fn xdp_places_a_chunk_and_answers_with_an_ack() {
    let mut h = Harness::new().unwrap();
    let windows = h.register_with_windows(LOCAL_IP, LOCAL_PORT, &group(), CTL).unwrap();
    let total = P + 100; // two chunks
    // SAFETY: the test owns this control block; nothing else runs on it.
    unsafe {
        windows.ctl().write(rx_ctl(RxCtl {
            seq: 1,
            root: 1,
            rank: 0,
            nchunks: 2,
            target: 2,
            claim: aggbox_core::maps::CLAIM_SET,
            count: total as u32,
            dtype: 0,
            chunk_bytes: P as u32,
            last_bytes: 100,
            credit: RX_WINDOW,
            ..RxCtl::default()
        }));
    }
    let payload0: Vec<u8> = (0..P).map(|i| (i * 7 + 3) as u8).collect();
    let mut datagram = bcast_header(BCAST_DATA, 1, 1, 0, 2, total as u32);
    datagram.extend_from_slice(&payload0);
    let frame = inbound(&datagram);

    let out = h.run(Prog::XdpIngress, &frame).unwrap();
    assert_eq!(out.retval, xdp::TX, "answered in the kernel");
    let ack = &out.frame;
    assert_eq!(ack.len(), 14 + 20 + 8 + 40, "payload cut off");
    assert_eq!(&ack[0..6], &frame[6..12], "back to the sender's MAC");
    assert_eq!(&ack[6..12], &frame[0..6]);
    assert_eq!(&ack[14 + 12..14 + 16], &LOCAL_IP.octets(), "from us");
    assert_eq!(&ack[14 + 16..14 + 20], &PEER_IP.octets(), "to the root");
    assert_eq!(u16::from_be_bytes([ack[16], ack[17]]), 20 + 8 + 40, "IPv4 total length");
    assert!(ipv4_checksum_ok(&ack[14..34]), "IPv4 checksum");
    assert_eq!(u16::from_be_bytes([ack[34], ack[35]]), LOCAL_PORT);
    assert_eq!(u16::from_be_bytes([ack[36], ack[37]]), PEER_PORT);
    assert_eq!(u16::from_be_bytes([ack[38], ack[39]]), 8 + 40, "UDP length");
    assert_eq!(kind_of(ack), BCAST_ACK);
    assert_eq!(u16::from_le_bytes([ack[42 + 12], ack[42 + 13]]), 0, "sender: our rank");
    assert_eq!(u32::from_le_bytes(ack[42 + 28..42 + 32].try_into().unwrap()), 0, "chunk 0");
    // The chunk is in the window, tagged.
    let tag = windows.rx_tag(1, 0).load(std::sync::atomic::Ordering::Acquire);
    assert_eq!(tag, 1u64 << 32);
    let mut placed = vec![0u8; P];
    windows.copy_rx(1, 0, &mut placed);
    assert_eq!(placed, payload0);
    assert_eq!(bstat(&h, "placed"), 1);
    assert_eq!(bstat(&h, "acks_sent"), 1);

    // The same chunk again: ACKed again, not counted again.
    let out = h.run(Prog::XdpIngress, &frame).unwrap();
    assert_eq!(out.retval, xdp::TX);
    assert_eq!(bstat(&h, "duplicates"), 1);
    assert_eq!(bstat(&h, "placed"), 1);

    // The last chunk completes the broadcast: one notice up, no ACK.
    let mut last = bcast_header(BCAST_DATA, 1, 1, 1, 2, total as u32);
    last.extend_from_slice(&[0xaa; 100]);
    let out = h.run(Prog::XdpIngress, &inbound(&last)).unwrap();
    assert_eq!(out.retval, xdp::PASS);
    assert_eq!(kind_of(&out.frame), BCAST_LANDED);
    assert_eq!(u32::from_le_bytes(out.frame[42 + 36..42 + 40].try_into().unwrap()), 2, "landed");
    assert_eq!(out.frame.len(), 14 + 20 + 8 + 40);
    assert!(ipv4_checksum_ok(&out.frame[14..34]));
    let mut placed = vec![0u8; 100];
    windows.copy_rx(1, 1, &mut placed);
    assert_eq!(placed, vec![0xaa; 100]);
    let landed = windows.rx_field(1, std::mem::offset_of!(RxCtl, landed)).load(std::sync::atomic::Ordering::Acquire);
    assert_eq!(landed, 2);
    assert_eq!(bstat(&h, "landed"), 1);
}

#[test]
fn xdp_leaves_to_user_space_what_it_was_not_armed_for() {
    let mut h = Harness::new().unwrap();
    let windows = h.register_with_windows(LOCAL_IP, LOCAL_PORT, &group(), CTL).unwrap();
    // SAFETY: the test owns this control block.
    unsafe {
        windows.ctl().write(rx_ctl(RxCtl {
            seq: 5,
            root: 1,
            nchunks: 1,
            target: 1,
            claim: aggbox_core::maps::CLAIM_SET,
            count: 10,
            chunk_bytes: P as u32,
            last_bytes: 10,
            credit: RX_WINDOW,
            ..RxCtl::default()
        }));
    }
    let cases = [
        ("another broadcast", bcast_header(BCAST_DATA, 1, 4, 0, 1, 10), 10),
        ("another count", bcast_header(BCAST_DATA, 1, 5, 0, 1, 11), 10),
        ("another root", bcast_header(BCAST_DATA, 0, 5, 0, 1, 10), 10),
        ("a chunk out of range", bcast_header(BCAST_DATA, 1, 5, 1, 1, 10), 10),
        ("a short chunk", bcast_header(BCAST_DATA, 1, 5, 0, 1, 10), 9),
    ];
    for (case, mut datagram, len) in cases {
        datagram.extend(std::iter::repeat_n(1u8, len));
        let frame = if case == "another root" { outbound_from_self(&datagram) } else { inbound(&datagram) };
        let out = h.run(Prog::XdpIngress, &frame).unwrap();
        assert_eq!(out.retval, xdp::PASS, "{case}: to user space");
        assert_eq!(out.frame, frame, "{case}: unchanged");
    }
    assert_eq!(bstat(&h, "placed"), 0);
    assert_eq!(bstat(&h, "to_user"), 5);
}

/// A datagram "from rank 0" (our own address) arriving: a valid member.
fn outbound_from_self(payload: &[u8]) -> Vec<u8> {
    udp(LOCAL_IP, LOCAL_PORT, LOCAL_IP, LOCAL_PORT, payload)
}

#[test]
fn xdp_folds_acks_at_the_root_and_lets_one_group_ack_up() {
    let mut h = Harness::new().unwrap();
    // Three ranks: we are rank 0, the root; ranks 1 and 2 receive.
    let mut g = group();
    g.peers.push(PeerInfo { rank: 2, ipv4: STRANGER_IP, mac: [2, 0, 0, 0, 0, 3], port: PEER_PORT, datapath: Datapath::Kernel, mtu: 1500 });
    let windows = h.register_with_windows(LOCAL_IP, LOCAL_PORT, &g, CTL).unwrap();
    // SAFETY: the test owns this control block and slot.
    unsafe {
        windows.ctl().write(Ctl { tx_seq: 9, tx_nchunks: 1, tx_receivers: 2, ..Ctl::default() });
        (*windows.tx_slot(0)).tag = 9u64 << 32;
    }
    let ack_from = |rank: u16, ip: Ipv4Addr| udp(ip, PEER_PORT, LOCAL_IP, LOCAL_PORT, &bcast_header(BCAST_ACK, rank, 9, 0, 1, 0));
    let first = h.run(Prog::XdpIngress, &ack_from(1, PEER_IP)).unwrap();
    assert_eq!(first.retval, xdp::DROP, "folded");
    let again = h.run(Prog::XdpIngress, &ack_from(1, PEER_IP)).unwrap();
    assert_eq!(again.retval, xdp::DROP, "a duplicate changes nothing");
    assert_eq!(bstat(&h, "duplicates"), 1);
    let last = h.run(Prog::XdpIngress, &ack_from(2, STRANGER_IP)).unwrap();
    assert_eq!(last.retval, xdp::PASS, "the group-ACK goes up");
    let hdr = &last.frame[42..];
    assert_eq!(hdr[5], BCAST_ACK);
    assert_eq!(u16::from_le_bytes([hdr[6], hdr[7]]), FLAG_GROUP);
    assert_eq!(u32::from_le_bytes(hdr[36..40].try_into().unwrap()), 1, "one chunk held by all");
    assert_eq!(bstat(&h, "acks_folded"), 2);
    assert_eq!(bstat(&h, "group_acks"), 1);
    // SAFETY: XDP is done with the slot.
    let slot = unsafe { *windows.tx_slot(0) };
    assert_eq!(slot.bits[0], 0b110);
    assert_eq!(slot.count, 2);
    // An ACK of a chunk whose slot is not armed: user space's business.
    let stale = udp(PEER_IP, PEER_PORT, LOCAL_IP, LOCAL_PORT, &bcast_header(BCAST_ACK, 1, 8, 0, 1, 0));
    assert_eq!(h.run(Prog::XdpIngress, &stale).unwrap().retval, xdp::PASS);
}

#[test]
fn xdp_answers_but_never_places_a_chunk_below_the_window() {
    let mut h = Harness::new().unwrap();
    let windows = h.register_with_windows(LOCAL_IP, LOCAL_PORT, &group(), CTL).unwrap();
    let nchunks = 3000u32;
    // SAFETY: the test owns this control block.
    unsafe {
        windows.ctl().write(rx_ctl(RxCtl {
            seq: 2,
            root: 1,
            nchunks,
            target: nchunks,
            claim: aggbox_core::maps::CLAIM_SET,
            count: nchunks * P as u32,
            chunk_bytes: P as u32,
            last_bytes: P as u32,
            credit: RX_WINDOW + 1030, // chunks 0..1029 were copied out
            ..RxCtl::default()
        }));
    }
    // Chunk 5 + 3 windows (in the window: 1030..1542) shares a slot with chunk 5.
    let later_chunk = 5 + 3 * RX_WINDOW;
    let mut later = bcast_header(BCAST_DATA, 1, 2, later_chunk, nchunks, nchunks * P as u32);
    later.extend(std::iter::repeat_n(0x55u8, P));
    assert_eq!(h.run(Prog::XdpIngress, &inbound(&later)).unwrap().retval, xdp::TX);
    // A late repeat of chunk 5 is answered, and the slot keeps the later one.
    let mut stale = bcast_header(BCAST_DATA, 1, 2, 5, nchunks, nchunks * P as u32);
    stale.extend(std::iter::repeat_n(0x11u8, P));
    let out = h.run(Prog::XdpIngress, &inbound(&stale)).unwrap();
    assert_eq!(out.retval, xdp::TX);
    assert_eq!(kind_of(&out.frame), BCAST_ACK);
    assert!(windows.rx_holds(2, later_chunk));
    let mut slot = vec![0u8; P];
    windows.copy_rx(2, 5, &mut slot);
    assert_eq!(slot, vec![0x55u8; P]);
    assert_eq!(bstat(&h, "placed"), 1);
    assert_eq!(bstat(&h, "duplicates"), 1);
}

#[test]
fn a_window_armed_ahead_takes_the_first_chunks_parameters() {
    use aggbox_core::maps::{CLAIM_OPEN, CLAIM_SET};
    let mut h = Harness::new().unwrap();
    let windows = h.register_with_windows(LOCAL_IP, LOCAL_PORT, &group(), CTL).unwrap();
    windows.arm_rx_ahead(4, 0, P as u32);
    let claim = |w: &aggbox_core::window::Windows| {
        w.rx_field(4, std::mem::offset_of!(RxCtl, claim)).load(std::sync::atomic::Ordering::Acquire)
    };
    assert_eq!(claim(&windows), CLAIM_OPEN);
    // Broadcast #4: 3 chunks of u8 from rank 1.
    let count = 2 * P as u32 + 5;
    let mut first = bcast_header(BCAST_DATA, 1, 4, 1, 3, count);
    first.extend(std::iter::repeat_n(0x42u8, P));
    assert_eq!(h.run(Prog::XdpIngress, &inbound(&first)).unwrap().retval, xdp::TX, "placed and answered");
    assert_eq!(claim(&windows), CLAIM_SET);
    // SAFETY: XDP is done with the control block.
    let rx = unsafe { *windows.ctl() }.rx[(4 % RX_PHASES) as usize];
    assert_eq!((rx.root, rx.count, rx.nchunks, rx.last_bytes, rx.target), (1, count, 3, 5, 3));
    assert!(windows.rx_holds(4, 1));
    // A chunk of the same broadcast with another count: user space decides.
    let mut other = bcast_header(BCAST_DATA, 1, 4, 2, 3, count + 1);
    other.extend(std::iter::repeat_n(0x42u8, 6));
    assert_eq!(h.run(Prog::XdpIngress, &inbound(&other)).unwrap().retval, xdp::PASS);
    // The call that agrees is accepted; one that does not learns what came.
    let arm = aggbox_core::window::RxArm {
        seq: 4,
        root: 1,
        rank: 0,
        nchunks: 3,
        count,
        dtype: 0,
        chunk_bytes: P as u32,
        last_bytes: 5,
    };
    assert_eq!(windows.claim_for_call(&arm), Ok(()));
    let wrong = aggbox_core::window::RxArm { count: count - 1, ..arm };
    assert_eq!(windows.claim_for_call(&wrong), Err((1, count, 0)));
}

/// The process never takes the claim of a window armed ahead (a process
/// descheduled while holding it sent every chunk meanwhile to its socket):
/// a call made before any chunk came only publishes itself, and then only
/// a chunk that agrees with it claims the window. A chunk the process
/// placed itself before the claim still counts against the target.
#[test]
fn a_call_made_before_the_first_chunk_decides_which_chunk_claims() {
    use aggbox_core::maps::{CLAIM_OPEN, CLAIM_SET};
    let mut h = Harness::new().unwrap();
    let windows = h.register_with_windows(LOCAL_IP, LOCAL_PORT, &group(), CTL).unwrap();
    let seq = 6;
    windows.arm_rx_ahead(seq, 0, P as u32);
    let claim = |w: &aggbox_core::window::Windows| {
        w.rx_field(seq, std::mem::offset_of!(RxCtl, claim)).load(std::sync::atomic::Ordering::Acquire)
    };
    // The call: 3 chunks of u8 from rank 1.
    let count = 2 * P as u32 + 5;
    let arm = aggbox_core::window::RxArm {
        seq,
        root: 1,
        rank: 0,
        nchunks: 3,
        count,
        dtype: 0,
        chunk_bytes: P as u32,
        last_bytes: 5,
    };
    assert_eq!(windows.claim_for_call(&arm), Ok(()));
    assert_eq!(claim(&windows), CLAIM_OPEN, "the process left the claim to XDP");
    assert!(!windows.rx_claimed(seq));
    // Chunk 0 reached the socket and the process placed it: one fewer for XDP.
    assert!(!windows.placed_by_process(seq), "nothing claimed yet: no target reached");
    // A chunk of another count (a valid layout of it) does not claim.
    let mut other = bcast_header(BCAST_DATA, 1, seq, 1, 3, count + 1);
    other.extend(std::iter::repeat_n(0x42u8, P));
    assert_eq!(h.run(Prog::XdpIngress, &inbound(&other)).unwrap().retval, xdp::PASS, "left to user space");
    assert_eq!(claim(&windows), CLAIM_OPEN);
    assert_eq!(bstat(&h, "placed"), 0);
    // The chunk that agrees claims it and is placed.
    let mut good = bcast_header(BCAST_DATA, 1, seq, 1, 3, count);
    good.extend(std::iter::repeat_n(0x42u8, P));
    assert_eq!(h.run(Prog::XdpIngress, &inbound(&good)).unwrap().retval, xdp::TX, "placed and answered");
    assert_eq!(claim(&windows), CLAIM_SET);
    assert!(windows.rx_claimed(seq) && windows.rx_holds(seq, 1));
    // SAFETY: XDP is done with the control block.
    let rx = unsafe { *windows.ctl() }.rx[(seq % RX_PHASES) as usize];
    assert_eq!((rx.root, rx.count, rx.nchunks, rx.landed, rx.target), (1, count, 3, 1, 2), "3 chunks less the process's");
    // The last chunk completes XDP's target: it goes up as the notice.
    let mut last = bcast_header(BCAST_DATA, 1, seq, 2, 3, count);
    last.extend(std::iter::repeat_n(0x43u8, 5));
    let out = h.run(Prog::XdpIngress, &inbound(&last)).unwrap();
    assert_eq!(out.retval, xdp::PASS);
    assert_eq!(kind_of(&out.frame), BCAST_LANDED);
    assert_eq!(bstat(&h, "placed"), 2);
}

// ---- Reductions (docs/ALLREDUCE.md, "Kernel datapath") ---------------------

const RED_DATA: u8 = 10;
const RED_SUM: u8 = 14;

fn rstat(h: &Harness, name: &str) -> u64 {
    h.reduce_stats().unwrap()[aggbox_core::maps::RSTAT_NAMES.iter().position(|n| *n == name).unwrap()]
}

/// A RED_DATA header of chunk `chunk` of allreduce `seq` (i32 SUM), from
/// `sender`.
fn red_header(sender: u16, seq: u32, chunk: u32, nchunks: u32, count: u32) -> Vec<u8> {
    let mut h = bcast_header(RED_DATA, sender, seq, chunk, nchunks, count);
    h[14] = 1; // dtype i32
    h[15] = 0x10; // allreduce, sum
    h
}

fn i32_bytes(values: &[i32]) -> Vec<u8> {
    values.iter().flat_map(|v| v.to_le_bytes()).collect()
}

#[test]
fn xdp_folds_contributions_at_the_owner_and_completes_once() {
    use aggbox_core::maps::RedCtl;
    const THIRD_IP: Ipv4Addr = Ipv4Addr::new(10, 77, 0, 3);
    const THIRD_PORT: u16 = 47_003;
    let mut h = Harness::new().unwrap();
    let mut g = group();
    g.peers.push(PeerInfo { rank: 2, ipv4: THIRD_IP, mac: [2, 0, 0, 0, 0, 3], port: THIRD_PORT, datapath: Datapath::Kernel, mtu: 1500 });
    let windows = h.register_with_windows(LOCAL_IP, LOCAL_PORT, &g, CTL).unwrap();
    // Allreduce #5 of two chunks of i32 on 3 ranks: this rank (0) owns
    // chunk 0 (runs of 1: chunk % 3), owned index 0.
    let lanes = P / 4;
    let count = 2 * lanes as u32;
    windows.arm_red(&RedCtl {
        seq: 5,
        nchunks: 2,
        count,
        dtype: 1,
        op: 0x10,
        lane: 4,
        ranks: 3,
        run: 1,
        chunk_bytes: P as u32,
        owned_last: u32::MAX,
        ..RedCtl::default() // no fan-out: the RED_SUM path of the other collectives
    });
    let own: Vec<i32> = (0..lanes as i32).map(|i| i * 3 - 1000).collect();
    let c1: Vec<i32> = (0..lanes as i32).map(|i| i32::MAX - i).collect();
    let c2: Vec<i32> = (0..lanes as i32).map(|i| i * i - 7).collect();
    windows.prepare_red(0, 5, 0, 0, &i32_bytes(&own));

    let mut d1 = red_header(1, 5, 0, 2, count);
    d1.extend(i32_bytes(&c1));
    let from1 = inbound(&d1);
    assert_eq!(h.run(Prog::XdpIngress, &from1).unwrap().retval, xdp::DROP, "folded, dropped");
    assert_eq!(h.run(Prog::XdpIngress, &from1).unwrap().retval, xdp::DROP, "a repeat, dropped");
    assert_eq!((rstat(&h, "folded"), rstat(&h, "duplicates"), rstat(&h, "sums")), (1, 1, 0));

    let mut d2 = red_header(2, 5, 0, 2, count);
    d2.extend(i32_bytes(&c2));
    let out = h.run(Prog::XdpIngress, &udp(THIRD_IP, THIRD_PORT, LOCAL_IP, LOCAL_PORT, &d2)).unwrap();
    assert_eq!(out.retval, xdp::PASS, "the completing contribution goes up");
    assert_eq!(kind_of(&out.frame), RED_SUM);
    assert_eq!(out.frame.len(), 14 + 20 + 8 + 40, "payload cut: the sum is in the slot");
    assert!(ipv4_checksum_ok(&out.frame[14..34]));
    let mut sum = vec![0u8; P];
    windows.copy_red(5, 0, &mut sum);
    let want: Vec<i32> = (0..lanes).map(|i| own[i].wrapping_add(c1[i]).wrapping_add(c2[i])).collect();
    assert_eq!(sum, i32_bytes(&want), "the slot holds the wrapping sum");
    assert_eq!((rstat(&h, "folded"), rstat(&h, "sums")), (2, 1));

    // A repeat after completion goes up unchanged: the process answers it.
    let out = h.run(Prog::XdpIngress, &from1).unwrap();
    assert_eq!((out.retval, kind_of(&out.frame), out.frame.len()), (xdp::PASS, RED_DATA, from1.len()));
    // Not this rank's chunk, or another call: user space's to judge.
    let mut other = red_header(1, 5, 1, 2, count);
    other.extend(i32_bytes(&c1));
    assert_eq!(h.run(Prog::XdpIngress, &inbound(&other)).unwrap().retval, xdp::PASS);
    let mut wrong_count = red_header(1, 5, 0, 2, count + 1);
    wrong_count.extend(i32_bytes(&c1));
    assert_eq!(h.run(Prog::XdpIngress, &inbound(&wrong_count)).unwrap().retval, xdp::PASS);
    // A RED_SUM from the wire is dropped: only XDP makes them.
    let mut forged = red_header(1, 5, 0, 2, count);
    forged[5] = RED_SUM;
    assert_eq!(h.run(Prog::XdpIngress, &inbound(&forged)).unwrap().retval, xdp::DROP);
    assert_eq!((rstat(&h, "to_user"), rstat(&h, "errors")), (2, 0));
    assert!(windows.red_holds(0, 5, 0));

    // Reduction #6, armed ahead with #5's parameters (the other phase):
    // rank 1's contribution comes before this rank's call and is folded
    // into the zeroed slot; the call joins with its own; rank 2's completes.
    let ahead = RedCtl { seq: 6, nchunks: 2, count, dtype: 1, op: 0x10, lane: 4, ranks: 3, run: 1, chunk_bytes: P as u32, owned_last: u32::MAX, ..RedCtl::default() };
    windows.arm_red_ahead(&ahead, 1);
    let mut e1 = red_header(1, 6, 0, 2, count);
    e1.extend(i32_bytes(&c1));
    assert_eq!(h.run(Prog::XdpIngress, &inbound(&e1)).unwrap().retval, xdp::DROP, "folded before the call");
    assert!(windows.red_ahead_taken(6, 0) && windows.red_holds(0, 6, 0), "the contribution named the chunk");
    assert!(!windows.join_red_ahead(6, 0, 0, 0, &i32_bytes(&own)), "two of three");
    let mut e2 = red_header(2, 6, 0, 2, count);
    e2.extend(i32_bytes(&c2));
    let out = h.run(Prog::XdpIngress, &udp(THIRD_IP, THIRD_PORT, LOCAL_IP, LOCAL_PORT, &e2)).unwrap();
    assert_eq!((out.retval, kind_of(&out.frame)), (xdp::PASS, RED_SUM));
    windows.copy_red(6, 0, &mut sum);
    assert_eq!(sum, i32_bytes(&want), "the same sum, reached ahead");
    // #5's slot (the other phase) is untouched.
    windows.copy_red(5, 0, &mut sum);
    assert_eq!(sum, i32_bytes(&want));
}

/// The spin-lock variant of the fold (`xdp_ingress_lock.bpf.o`, only for
/// `aggbox bench fold`) still passes the verifier and sums like the
/// shipped one.
#[test]
fn the_atomic_add_fold_variant_loads_and_sums() {
    use aggbox_core::maps::RedCtl;
    const THIRD_IP: Ipv4Addr = Ipv4Addr::new(10, 77, 0, 3);
    const THIRD_PORT: u16 = 47_003;
    let mut h = Harness::with_xdp(aggbox_core::bpf::XDP_INGRESS_ATOMICS).unwrap();
    let mut g = group();
    g.peers.push(PeerInfo { rank: 2, ipv4: THIRD_IP, mac: [2, 0, 0, 0, 0, 3], port: THIRD_PORT, datapath: Datapath::Kernel, mtu: 1500 });
    let windows = h.register_with_windows(LOCAL_IP, LOCAL_PORT, &g, CTL).unwrap();
    let lanes = P / 4;
    let count = 2 * lanes as u32;
    windows.arm_red(&RedCtl { seq: 5, nchunks: 2, count, dtype: 1, op: 0x10, lane: 4, ranks: 3, run: 1, chunk_bytes: P as u32, owned_last: u32::MAX, ..RedCtl::default() });
    let own: Vec<i32> = (0..lanes as i32).map(|i| i * 3 - 1000).collect();
    let c1: Vec<i32> = (0..lanes as i32).map(|i| i32::MAX - i).collect();
    let c2: Vec<i32> = (0..lanes as i32).map(|i| i * i - 7).collect();
    windows.prepare_red(0, 5, 0, 0, &i32_bytes(&own));
    let mut d1 = red_header(1, 5, 0, 2, count);
    d1.extend(i32_bytes(&c1));
    assert_eq!(h.run(Prog::XdpIngress, &inbound(&d1)).unwrap().retval, xdp::DROP, "folded, dropped");
    let mut d2 = red_header(2, 5, 0, 2, count);
    d2.extend(i32_bytes(&c2));
    let out = h.run(Prog::XdpIngress, &udp(THIRD_IP, THIRD_PORT, LOCAL_IP, LOCAL_PORT, &d2)).unwrap();
    assert_eq!((out.retval, kind_of(&out.frame)), (xdp::PASS, RED_SUM));
    let mut sum = vec![0u8; P];
    windows.copy_red(5, 0, &mut sum);
    let want: Vec<i32> = (0..lanes).map(|i| own[i].wrapping_add(c1[i]).wrapping_add(c2[i])).collect();
    assert_eq!(sum, i32_bytes(&want));
    assert_eq!((rstat(&h, "folded"), rstat(&h, "sums"), rstat(&h, "errors")), (2, 1, 0));
}

const RED_RESULT: u8 = 11;
const RED_LANDED: u8 = 15;

/// The flags of a frame's AggBox header.
fn flags_of(frame: &[u8]) -> u16 {
    u16::from_le_bytes([frame[14 + 20 + 8 + 6], frame[14 + 20 + 8 + 7]])
}

/// The 4-byte lanes of a frame's payload.
fn payload_i32(frame: &[u8]) -> Vec<i32> {
    frame[14 + 20 + 8 + 40..].chunks_exact(4).map(|b| i32::from_le_bytes(b.try_into().unwrap())).collect()
}

#[test]
fn xdp_turns_the_completing_contribution_into_the_result_and_places_others_results() {
    use aggbox_core::maps::{RedCtl, FOLD_ADD, FOLD_MAX_S};
    const THIRD_IP: Ipv4Addr = Ipv4Addr::new(10, 77, 0, 3);
    const THIRD_PORT: u16 = 47_003;
    let mut h = Harness::new().unwrap();
    let mut g = group();
    g.peers.push(PeerInfo { rank: 2, ipv4: THIRD_IP, mac: [2, 0, 0, 0, 0, 3], port: THIRD_PORT, datapath: Datapath::Kernel, mtu: 1500 });
    let windows = h.register_with_windows(LOCAL_IP, LOCAL_PORT, &g, CTL).unwrap();
    // Allreduce #7 of two chunks of i32 on 3 ranks, the fan-out path: this
    // rank (0) owns chunk 0; chunk 1 is rank 1's, whose result it gets.
    let lanes = P / 4;
    let count = 2 * lanes as u32;
    let armed = RedCtl {
        seq: 7,
        nchunks: 2,
        count,
        dtype: 1,
        op: 0x10,
        lane: 4,
        fold: FOLD_ADD,
        ranks: 3,
        run: 1,
        chunk_bytes: P as u32,
        owned_last: u32::MAX,
        rank: 0,
        fanout: 1,
        result_last: P as u32,
        root: 0,
        credit: 2,
        notify: 64,
        landed: 0,
        target: 2,
        notified: 0,
        last_bytes: 0,
    };
    windows.arm_red(&armed);
    let own: Vec<i32> = (0..lanes as i32).map(|i| i * 5 - 77).collect();
    let c1: Vec<i32> = (0..lanes as i32).map(|i| i32::MIN + i).collect();
    let c2: Vec<i32> = (0..lanes as i32).map(|i| 3 * i * i).collect();
    let want: Vec<i32> = (0..lanes).map(|i| own[i].wrapping_add(c1[i]).wrapping_add(c2[i])).collect();
    windows.prepare_red(0, 7, 0, 0, &i32_bytes(&own));
    let mut d1 = red_header(1, 7, 0, 2, count);
    d1.extend(i32_bytes(&c1));
    assert_eq!(h.run(Prog::XdpIngress, &inbound(&d1)).unwrap().retval, xdp::DROP);
    let mut d2 = red_header(2, 7, 0, 2, count);
    d2.extend(i32_bytes(&c2));
    let out = h.run(Prog::XdpIngress, &udp(THIRD_IP, THIRD_PORT, LOCAL_IP, LOCAL_PORT, &d2)).unwrap();
    assert_eq!(out.retval, xdp::PASS, "the completing contribution goes up, to TC ingress");
    assert_eq!((kind_of(&out.frame), flags_of(&out.frame)), (RED_RESULT, 0x0002), "a FANOUT result");
    assert_eq!(payload_i32(&out.frame), want, "carrying the wrapping sum");
    assert_eq!(out.frame[14 + 20 + 6..14 + 20 + 8], [0, 0], "UDP checksum none (the payload changed)");
    assert!(windows.red_is_done(7, 0));

    // Rank 1 lost it and sends its contribution again: XDP answers with
    // the result, back where it came from.
    let out = h.run(Prog::XdpIngress, &inbound(&d1)).unwrap();
    assert_eq!(out.retval, xdp::TX);
    assert_eq!((kind_of(&out.frame), flags_of(&out.frame)), (RED_RESULT, 0x0001), "a RETRANSMIT result");
    assert_eq!(payload_i32(&out.frame), want);
    assert_eq!(out.frame[14 + 12..14 + 16], LOCAL_IP.octets(), "from here");
    assert_eq!(out.frame[14 + 16..14 + 20], PEER_IP.octets(), "to rank 1");
    assert!(ipv4_checksum_ok(&out.frame[14..34]));
    assert_eq!(rstat(&h, "answered"), 1);

    // The result of chunk 1 from its owner (rank 1) is placed; it is the
    // second chunk landed of two: it goes up as the one notice.
    let r1: Vec<i32> = (0..lanes as i32).map(|i| 11 * i - 4).collect();
    let mut res = bcast_header(RED_RESULT, 1, 7, 1, 2, count);
    res[14] = 1;
    res[15] = 0x10;
    res.extend(i32_bytes(&r1));
    let out = h.run(Prog::XdpIngress, &inbound(&res)).unwrap();
    assert_eq!((out.retval, kind_of(&out.frame)), (xdp::PASS, RED_LANDED));
    assert_eq!(out.frame.len(), 14 + 20 + 8 + 40, "a header-only notice");
    assert!(windows.res_holds(7, 1));
    let mut got = vec![0u8; P];
    windows.copy_res(7, 1, &mut got);
    assert_eq!(got, i32_bytes(&r1));
    assert_eq!(h.run(Prog::XdpIngress, &inbound(&res)).unwrap().retval, xdp::DROP, "a repeat");
    assert_eq!((rstat(&h, "placed"), rstat(&h, "landed")), (1, 1));
    // A result of chunk 0 from rank 1 (not its owner), or beyond the credit:
    // user space's to judge. A FANOUT or NOTIFY result from the wire, or a
    // RED_LANDED, is dropped: only the kernel makes them.
    let mut wrong = bcast_header(RED_RESULT, 1, 7, 0, 2, count);
    wrong[14] = 1;
    wrong[15] = 0x10;
    wrong.extend(i32_bytes(&r1));
    assert_eq!(h.run(Prog::XdpIngress, &inbound(&wrong)).unwrap().retval, xdp::PASS);
    for (flag, kind) in [(0x0002u16, RED_RESULT), (0x0020, RED_RESULT), (0, RED_LANDED)] {
        let mut forged = res.clone();
        forged[5] = kind;
        forged[6..8].copy_from_slice(&flag.to_le_bytes());
        assert_eq!(h.run(Prog::XdpIngress, &inbound(&forged)).unwrap().retval, xdp::DROP, "forged {kind} {flag:#x}");
    }
    assert_eq!(rstat(&h, "forged"), 3);

    // Reduce-scatter #9 (blocks of one chunk: chunk c is rank c's): this
    // rank gets no result of chunk 1, only its owner's DONE, which XDP
    // marks in the result window and counts as landed.
    windows.arm_red(&RedCtl { seq: 9, op: 0x30, nchunks: 3, landed: 0, target: 3, credit: 3, ..armed });
    let mut done = bcast_header(12, 1, 9, 1, 3, count); // RED_DONE
    done[14] = 1;
    done[15] = 0x30;
    assert_eq!(h.run(Prog::XdpIngress, &inbound(&done)).unwrap().retval, xdp::DROP, "marked, not the last");
    assert!(windows.res_holds(9, 1));
    assert_eq!(h.run(Prog::XdpIngress, &inbound(&done)).unwrap().retval, xdp::DROP, "a repeat");
    assert_eq!(windows.red_landed(9), 1);
    let mut not_owner = bcast_header(12, 1, 9, 2, 3, count);
    not_owner[14] = 1;
    not_owner[15] = 0x30;
    assert_eq!(h.run(Prog::XdpIngress, &inbound(&not_owner)).unwrap().retval, xdp::PASS, "chunk 2 is rank 2's");

    // MAX #8 (the other phase), signed: compare-and-swap folds, exact.
    windows.arm_red(&RedCtl { seq: 8, fold: FOLD_MAX_S, op: 0x12, target: 2, ..armed });
    windows.prepare_red(0, 8, 0, 0, &i32_bytes(&own));
    for (sender, values, ip, port) in [(1u16, &c1, PEER_IP, PEER_PORT), (2, &c2, THIRD_IP, THIRD_PORT)] {
        let mut d = red_header(sender, 8, 0, 2, count);
        d[15] = 0x12;
        d.extend(i32_bytes(values));
        h.run(Prog::XdpIngress, &udp(ip, port, LOCAL_IP, LOCAL_PORT, &d)).unwrap();
    }
    let mut max = vec![0u8; P];
    windows.copy_red(8, 0, &mut max);
    let want: Vec<i32> = (0..lanes).map(|i| own[i].max(c1[i]).max(c2[i])).collect();
    assert_eq!(max, i32_bytes(&want), "the slot holds the maximum");
    assert_eq!(rstat(&h, "errors"), 0);
}

// ---- Approximate agreement (docs/PROTOCOL.md, "Approximate agreement") -----

use aggbox_core::{
    maps::ASTAT_NAMES,
    window::{AgreeArm, AgreeFolded, Windows},
};

const AGREE_VALUE: u8 = 30;
const AGREE_QUORUM: u8 = 31;
const FLAG_ANSWER: u16 = 0x0040;
const FLAG_RETRANSMIT: u16 = 0x0001;
/// Ranks of the agreement tests' group: this host is rank 0.
const AGREE_RANKS: usize = 6;

fn rank_ip(rank: usize) -> Ipv4Addr {
    Ipv4Addr::new(10, 77, 0, rank as u8 + 1)
}

fn rank_port(rank: usize) -> u16 {
    LOCAL_PORT + rank as u16
}

fn agree_group() -> GroupInfo {
    let peers = (0..AGREE_RANKS)
        .map(|rank| PeerInfo {
            rank,
            ipv4: rank_ip(rank),
            mac: [2, 0, 0, 0, 0, rank as u8 + 1],
            port: rank_port(rank),
            datapath: Datapath::Kernel,
            mtu: 1500,
        })
        .collect();
    GroupInfo { group: GROUP, token: TOKEN, peers }
}

/// The first program agreement values meet: XDP ingress on the XDP hooks,
/// TC ingress on the TC hooks. Both run one fold (aggbox_agree.h) and
/// differ in their verdicts.
struct AgreeHook {
    prog: Prog,
    tc: bool,
    /// Up to the process.
    pass: u32,
    /// Consumed.
    drop: u32,
    /// Sent back out as the answer.
    answer: u32,
}

const XDP_FIRST: AgreeHook = AgreeHook { prog: Prog::XdpIngress, tc: false, pass: xdp::PASS, drop: xdp::DROP, answer: xdp::TX };
const TC_FIRST: AgreeHook = AgreeHook { prog: Prog::TcIngress, tc: true, pass: tc::OK, drop: tc::SHOT, answer: tc::REDIRECT };

impl AgreeHook {
    fn harness(&self) -> (Harness, Windows) {
        let mut h = if self.tc { Harness::tc_hooks() } else { Harness::new() }.unwrap();
        let windows = h.register_with_windows(LOCAL_IP, LOCAL_PORT, &agree_group(), CTL).unwrap();
        (h, windows)
    }
}

/// An AGREE_VALUE payload (header and body), as docs/PROTOCOL.md lays it out.
fn agree_payload(sender: u16, seq: u32, phase: u32, last: u32, flags: u16, value: f64, incarnation: u32) -> Vec<u8> {
    let mut p = bcast_header(AGREE_VALUE, sender, seq, phase, last, 0);
    p[6..8].copy_from_slice(&flags.to_le_bytes());
    p[14] = 6; // f64
    p.extend_from_slice(&value.to_bits().to_le_bytes());
    p.extend_from_slice(&incarnation.to_le_bytes());
    p.extend_from_slice(&0u32.to_le_bytes());
    assert_eq!(p.len(), 56);
    p
}

/// The frame of `sender`'s value of `phase` arriving here.
fn agree_from(sender: usize, seq: u32, phase: u32, value: f64) -> Vec<u8> {
    let p = agree_payload(sender as u16, seq, phase, 9, 0, value, 100 + sender as u32);
    udp(rank_ip(sender), rank_port(sender), LOCAL_IP, LOCAL_PORT, &p)
}

fn astat(h: &Harness, name: &str) -> u64 {
    h.agree_stats().unwrap()[ASTAT_NAMES.iter().position(|n| *n == name).unwrap()]
}

fn astats(h: &Harness) -> Vec<(&'static str, u64)> {
    let stats = h.agree_stats().unwrap();
    ASTAT_NAMES.iter().copied().zip(stats).filter(|(_, v)| *v != 0).collect()
}

/// Plain min and max, −0 below +0 (f64::total_cmp, which is the float order
/// on everything but NaN).
fn plain_min_max(values: &[f64]) -> (f64, f64) {
    let min = *values.iter().min_by(|a, b| a.total_cmp(b)).unwrap();
    let max = *values.iter().max_by(|a, b| a.total_cmp(b)).unwrap();
    (min, max)
}

fn arm(windows: &Windows, seq: u32, phase: u32, quorum: u32, value: f64) {
    windows.arm_agree(&AgreeArm { seq, phase, last: 9, quorum, rank: 0, value, incarnation: 7 });
}

fn folds_a_phase_and_lets_one_quorum_notice_up(at: &AgreeHook) {
    let (h, windows) = at.harness();
    let own = -3.5;
    arm(&windows, 11, 2, 4, own); // n = 6, f = 2: a quorum of 4, own included
    let fold = windows.agree_fold();
    assert_eq!((fold.seq, fold.phase, fold.count, fold.quorum, fold.notified), (11, 2, 1, 4, false));
    assert_eq!(fold.senders, [1, 0, 0, 0]);
    assert_eq!((fold.min.to_bits(), fold.max.to_bits()), (own.to_bits(), own.to_bits()));

    let v1 = 1e300;
    assert_eq!(h.run(at.prog, &agree_from(1, 11, 2, v1)).unwrap().retval, at.drop, "folded");
    assert_eq!(h.run(at.prog, &agree_from(1, 11, 2, v1)).unwrap().retval, at.drop, "a repeat");
    assert_eq!(windows.agree_fold().count, 2, "the repeat is not counted");
    let v2 = -0.0;
    assert_eq!(h.run(at.prog, &agree_from(2, 11, 2, v2)).unwrap().retval, at.drop);
    assert_eq!(windows.agree_fold().count, 3);
    assert!(!windows.agree_fold().notified);

    // The quorum-th distinct sender: its value goes up as the notice.
    let v3 = -f64::MAX;
    let frame = agree_from(3, 11, 2, v3);
    let out = h.run(at.prog, &frame).unwrap();
    assert_eq!(out.retval, at.pass, "the one wake-up of the phase");
    let mut want = frame.clone();
    want[42 + 5] = AGREE_QUORUM;
    assert_eq!(out.frame, want, "kind AGREE_QUORUM, header and body otherwise kept (UDP checksum 0)");
    assert!(windows.agree_fold().notified);

    // Past the quorum: folded, never a second notice; repeats dropped.
    let v4 = 0.0;
    let v5 = 7.25e-310; // subnormal
    assert_eq!(h.run(at.prog, &agree_from(4, 11, 2, v4)).unwrap().retval, at.drop);
    assert_eq!(h.run(at.prog, &agree_from(3, 11, 2, v3)).unwrap().retval, at.drop);
    assert_eq!(h.run(at.prog, &agree_from(5, 11, 2, v5)).unwrap().retval, at.drop);

    let fold = windows.agree_fold();
    assert_eq!((fold.count, fold.notified), (6, true));
    assert_eq!(fold.senders, [0b11_1111, 0, 0, 0]);
    let (min, max) = plain_min_max(&[own, v1, v2, v3, v4, v5]);
    assert_eq!((fold.min.to_bits(), fold.max.to_bits()), (min.to_bits(), max.to_bits()));
    assert_eq!((fold.min, fold.max), (-f64::MAX, 1e300));
    assert_eq!(astats(&h), vec![("folded", 4), ("quorums", 1), ("duplicates", 2)]);

    // The next phase starts again from this rank's own value alone.
    arm(&windows, 11, 3, 4, 0.0);
    let fold = windows.agree_fold();
    assert_eq!((fold.phase, fold.count, fold.notified, fold.senders), (3, 1, false, [1, 0, 0, 0]));
    assert_eq!((fold.min.to_bits(), fold.max.to_bits()), (0.0f64.to_bits(), 0.0f64.to_bits()));
    // Zeros of both signs: −0 is the minimum, +0 the maximum.
    assert_eq!(h.run(at.prog, &agree_from(1, 11, 3, -0.0)).unwrap().retval, at.drop);
    let fold = windows.agree_fold();
    assert_eq!((fold.min.to_bits(), fold.max.to_bits()), ((-0.0f64).to_bits(), 0.0f64.to_bits()));
    // Negative values order by magnitude the other way.
    for (sender, v) in [(2, -1e-5), (3, -2.5e6), (4, -2.4e6)] {
        h.run(at.prog, &agree_from(sender, 11, 3, v)).unwrap();
    }
    let fold = windows.agree_fold();
    let (min, max) = plain_min_max(&[0.0, -0.0, -1e-5, -2.5e6, -2.4e6]);
    assert_eq!((fold.min.to_bits(), fold.max.to_bits()), (min.to_bits(), max.to_bits()));
    assert_eq!((fold.min, fold.count), (-2.5e6, 5));
    assert_eq!(astat(&h, "quorums"), 2, "phase 3 has its own notice");
}

fn answers_a_rank_that_lags_and_drops_stale_answers(at: &AgreeHook) {
    let (h, windows) = at.harness();
    let own = 42.125;
    windows.arm_agree(&AgreeArm { seq: 11, phase: 5, last: 9, quorum: 4, rank: 0, value: own, incarnation: 77 });
    // Rank 1 still sends phase 3 (with trailing bytes the answer must not keep).
    let mut late = agree_payload(1, 11, 3, 9, 0x0001, -8.0, 3);
    late.extend_from_slice(&[0xee; 24]);
    let frame = udp(rank_ip(1), rank_port(1), LOCAL_IP, LOCAL_PORT, &late);
    let out = h.run(at.prog, &frame).unwrap();
    assert_eq!(out.retval, at.answer, "answered in the kernel");
    // The answer, built here independently: this rank's value of phase 5,
    // from rank 0 to rank 1, ends swapped, cut to header + body.
    let mut answer = agree_payload(0, 11, 5, 9, FLAG_ANSWER, own, 77);
    answer[14] = 6;
    let mut want = udp(LOCAL_IP, LOCAL_PORT, rank_ip(1), rank_port(1), &answer);
    let (dst, src) = (frame[0..6].to_vec(), frame[6..12].to_vec());
    want[0..6].copy_from_slice(&src);
    want[6..12].copy_from_slice(&dst);
    assert_eq!(out.frame.len(), 14 + 20 + 8 + 40 + 16);
    assert_eq!(out.frame, want, "exact answer bytes");
    assert!(ipv4_checksum_ok(&out.frame[14..34]), "IPv4 checksum");
    assert_eq!(u16::from_be_bytes([out.frame[16], out.frame[17]]), 20 + 8 + 56, "IPv4 total length");
    assert_eq!(u16::from_be_bytes([out.frame[38], out.frame[39]]), 8 + 56, "UDP length");
    assert_eq!(flags_of(&out.frame), FLAG_ANSWER);
    assert_eq!(u16::from_le_bytes([out.frame[42 + 12], out.frame[42 + 13]]), 0, "sender: this rank");
    assert_eq!(u32::from_le_bytes(out.frame[42 + 28..42 + 32].try_into().unwrap()), 5, "phase");
    assert_eq!(u32::from_le_bytes(out.frame[42 + 32..42 + 36].try_into().unwrap()), 9, "last phase");
    assert_eq!(f64::from_bits(u64::from_le_bytes(out.frame[82..90].try_into().unwrap())), own);
    assert_eq!(u32::from_le_bytes(out.frame[90..94].try_into().unwrap()), 77, "incarnation");
    assert_eq!(windows.agree_fold().count, 1, "a lagging value is not folded");

    // An answer of an earlier phase (this rank is ahead of its sender's
    // view of it): stale, dropped.
    let stale = agree_payload(2, 11, 4, 9, FLAG_ANSWER, 1.0, 1);
    let out = h.run(at.prog, &udp(rank_ip(2), rank_port(2), LOCAL_IP, LOCAL_PORT, &stale)).unwrap();
    assert_eq!(out.retval, at.drop);
    // An answer of the armed phase is a value of that phase: folded.
    let answer5 = agree_payload(2, 11, 5, 9, FLAG_ANSWER, 50.0, 1);
    let out = h.run(at.prog, &udp(rank_ip(2), rank_port(2), LOCAL_IP, LOCAL_PORT, &answer5)).unwrap();
    assert_eq!(out.retval, at.drop);
    assert_eq!((windows.agree_fold().count, windows.agree_fold().max), (2, 50.0));
    // Of a later phase: up to the process, unchanged.
    let ahead = agree_from(3, 11, 6, 1.5);
    let out = h.run(at.prog, &ahead).unwrap();
    assert_eq!((out.retval, &out.frame), (at.pass, &ahead));
    assert_eq!(astats(&h), vec![("folded", 1), ("ahead", 1), ("answered", 1), ("stale", 1)]);

    // Decided: the last phase with an unreachable quorum. XDP records final
    // values without a notice and answers laggers with the final value.
    let decided = 41.0;
    windows.arm_agree(&AgreeArm { seq: 11, phase: 9, last: 9, quorum: u32::MAX, rank: 0, value: decided, incarnation: 78 });
    for sender in 1..AGREE_RANKS {
        assert_eq!(h.run(at.prog, &agree_from(sender, 11, 9, 40.0 + sender as f64 / 8.0)).unwrap().retval, at.drop);
    }
    let fold = windows.agree_fold();
    assert_eq!((fold.count, fold.notified, fold.senders[0]), (AGREE_RANKS as u32, false, 0b11_1111));
    let out = h.run(at.prog, &agree_from(4, 11, 2, 0.0)).unwrap();
    assert_eq!(out.retval, at.answer);
    assert_eq!(u32::from_le_bytes(out.frame[42 + 28..42 + 32].try_into().unwrap()), 9, "the final phase");
    assert_eq!(f64::from_bits(u64::from_le_bytes(out.frame[82..90].try_into().unwrap())), decided);
    assert_eq!(u32::from_le_bytes(out.frame[90..94].try_into().unwrap()), 78);
    assert_eq!(&out.frame[14 + 16..14 + 20], &rank_ip(4).octets(), "to rank 4");
    assert_eq!(astat(&h, "quorums"), 0);

    // Decided, a final value repeated (RETRANSMIT) by a rank that decided
    // too: it has not heard that this one did, so it is answered with this
    // rank's final value; a first copy or an answer is only recorded.
    let repeat = agree_payload(5, 11, 9, 9, FLAG_RETRANSMIT, 40.625, 3);
    let out = h.run(at.prog, &udp(rank_ip(5), rank_port(5), LOCAL_IP, LOCAL_PORT, &repeat)).unwrap();
    assert_eq!(out.retval, at.answer, "a repeated final value is answered");
    assert_eq!(flags_of(&out.frame), FLAG_ANSWER);
    assert_eq!(u32::from_le_bytes(out.frame[42 + 28..42 + 32].try_into().unwrap()), 9);
    assert_eq!(f64::from_bits(u64::from_le_bytes(out.frame[82..90].try_into().unwrap())), decided);
    assert_eq!(&out.frame[14 + 16..14 + 20], &rank_ip(5).octets(), "to rank 5");
    let answered = agree_payload(5, 11, 9, 9, FLAG_RETRANSMIT | FLAG_ANSWER, 40.625, 3);
    let out = h.run(at.prog, &udp(rank_ip(5), rank_port(5), LOCAL_IP, LOCAL_PORT, &answered)).unwrap();
    assert_eq!(out.retval, at.drop, "an answer is not answered");
    assert_eq!(windows.agree_fold().count, AGREE_RANKS as u32, "nobody counted twice");
}

fn leaves_other_agreements_to_the_process_and_drops_what_is_wrong(at: &AgreeHook) {
    let (h, windows) = at.harness();
    // Not armed: everything goes up unchanged.
    let v = agree_from(1, 11, 0, 2.0);
    assert_eq!(h.run(at.prog, &v).unwrap(), aggbox_core::testrun::TestRun { retval: at.pass, frame: v.clone() });
    arm(&windows, 11, 0, 4, 1.0);
    // Another agreement: the process decides.
    let other = agree_from(1, 12, 0, 2.0);
    assert_eq!(h.run(at.prog, &other).unwrap(), aggbox_core::testrun::TestRun { retval: at.pass, frame: other.clone() });
    assert_eq!(astat(&h, "passed"), 2);
    // This agreement in another number of phases (a rank with another
    // epsilon or bounds): not folded, up to the process, which reports it.
    let mismatched = udp(rank_ip(1), rank_port(1), LOCAL_IP, LOCAL_PORT, &agree_payload(1, 11, 0, 12, 0, 2.0, 1));
    assert_eq!(h.run(at.prog, &mismatched).unwrap(), aggbox_core::testrun::TestRun { retval: at.pass, frame: mismatched.clone() });
    assert_eq!(astat(&h, "passed"), 3);
    // An AGREE_QUORUM from the wire: forged (only the first program makes them).
    let mut forged = agree_payload(1, 11, 0, 9, 0, 2.0, 1);
    forged[5] = AGREE_QUORUM;
    let out = h.run(at.prog, &udp(rank_ip(1), rank_port(1), LOCAL_IP, LOCAL_PORT, &forged)).unwrap();
    assert_eq!(out.retval, at.drop);
    // Bodies too short: the header alone, and one byte short.
    let full = agree_payload(2, 11, 0, 9, 0, 2.0, 1);
    for cut in [40, 55] {
        let out = h.run(at.prog, &udp(rank_ip(2), rank_port(2), LOCAL_IP, LOCAL_PORT, &full[..cut])).unwrap();
        assert_eq!(out.retval, at.drop, "{cut} bytes");
    }
    assert_eq!(windows.agree_fold().count, 1, "nothing folded");
    assert_eq!(astats(&h), vec![("malformed", 2), ("forged", 1), ("passed", 3)]);
    // Disarmed: up again.
    windows.disarm_agree();
    let v = agree_from(1, 11, 0, 2.0);
    assert_eq!(h.run(at.prog, &v).unwrap().retval, at.pass);
    assert_eq!(windows.agree_fold().seq, 0);
    assert_eq!(astat(&h, "passed"), 4);
}

fn the_process_folds_passed_up_values_with_the_same_atomics(at: &AgreeHook) {
    let (h, windows) = at.harness();
    arm(&windows, 21, 4, 4, 10.0);
    // Values that reached the socket (before the arming, or contended).
    assert_eq!(windows.fold_agree(21, 4, 1, -20.0), AgreeFolded::Folded);
    assert_eq!(windows.fold_agree(21, 4, 1, -20.0), AgreeFolded::Duplicate);
    assert_eq!(windows.fold_agree(21, 3, 2, 99.0), AgreeFolded::NotArmed, "another phase");
    assert_eq!(windows.fold_agree(22, 4, 2, 99.0), AgreeFolded::NotArmed, "another agreement");
    assert_eq!(windows.agree_fold().count, 2);
    // XDP and the process fold into the same block.
    assert_eq!(h.run(at.prog, &agree_from(2, 21, 4, 30.0)).unwrap().retval, at.drop);
    assert_eq!(h.run(at.prog, &agree_from(1, 21, 4, -20.0)).unwrap().retval, at.drop, "the process folded rank 1");
    assert_eq!(astat(&h, "duplicates"), 1);
    assert_eq!(windows.fold_agree(21, 4, 2, 30.0), AgreeFolded::Duplicate, "XDP folded rank 2");
    // The process's fold takes the count to the quorum: it wins the notice …
    assert_eq!(windows.fold_agree(21, 4, 3, 5.0), AgreeFolded::Quorum);
    assert!(windows.agree_fold().notified);
    // … so XDP sends none.
    assert_eq!(h.run(at.prog, &agree_from(4, 21, 4, 1e9)).unwrap().retval, at.drop);
    assert_eq!(windows.fold_agree(21, 4, 5, -1e-9), AgreeFolded::Folded);
    let fold = windows.agree_fold();
    let (min, max) = plain_min_max(&[10.0, -20.0, 30.0, 5.0, 1e9, -1e-9]);
    assert_eq!((fold.count, fold.senders[0], fold.min, fold.max), (6, 0b11_1111, min, max));
    assert_eq!(astats(&h), vec![("folded", 2), ("duplicates", 1)]);
    // Re-arming (NO_PHASE for a moment): nothing folds into it meanwhile.
    windows.disarm_agree();
    assert_eq!(windows.fold_agree(21, 4, 1, 0.0), AgreeFolded::NotArmed);
}

/// Five senders' values run on both CPUs at once, each many times over:
/// whatever the races (a value that loses too many compare-and-swaps is
/// left to the process, and its next repeat is folded), the fold ends exact
/// and the notice went up once.
fn concurrent_folds_end_exact_with_one_notice(at: &AgreeHook) {
    const REPEAT: u32 = 3000;
    let (h, windows) = at.harness();
    arm(&windows, 31, 0, AGREE_RANKS as u32, 0.5);
    let values: Vec<f64> = vec![0.5, -7.0, 1e10, -0.0, 3.25, -1e-300];
    let frames: Vec<Vec<u8>> = (1..AGREE_RANKS).map(|s| agree_from(s, 31, 0, values[s])).collect();
    let fd = h.prog_fd(at.prog).unwrap();
    std::thread::scope(|scope| {
        for frame in &frames {
            scope.spawn(move || aggbox_core::testrun::test_run_timed(fd, frame, REPEAT).unwrap());
        }
    });
    let fold = windows.agree_fold();
    let (min, max) = plain_min_max(&values);
    assert_eq!((fold.count, fold.senders[0], fold.notified), (AGREE_RANKS as u32, 0b11_1111, true));
    assert_eq!((fold.min.to_bits(), fold.max.to_bits()), (min.to_bits(), max.to_bits()));
    let s = |name| astat(&h, name);
    assert_eq!((s("folded"), s("quorums")), (4, 1), "{:?}", astats(&h));
    // Every run is accounted for. (A test run repeats on the frame as the
    // program left it: after the notice, that sender's frame is a QUORUM.)
    let total = (frames.len() as u32 * REPEAT) as u64;
    assert_eq!(s("folded") + s("quorums") + s("duplicates") + s("contended") + s("forged"), total, "{:?}", astats(&h));
}

#[test]
fn xdp_folds_a_phase_and_lets_one_quorum_notice_up() {
    folds_a_phase_and_lets_one_quorum_notice_up(&XDP_FIRST);
}

#[test]
fn tc_folds_a_phase_and_lets_one_quorum_notice_up() {
    folds_a_phase_and_lets_one_quorum_notice_up(&TC_FIRST);
}

#[test]
fn xdp_answers_a_rank_that_lags_and_drops_stale_answers() {
    answers_a_rank_that_lags_and_drops_stale_answers(&XDP_FIRST);
}

#[test]
fn tc_answers_a_rank_that_lags_and_drops_stale_answers() {
    answers_a_rank_that_lags_and_drops_stale_answers(&TC_FIRST);
}

#[test]
fn xdp_leaves_other_agreements_to_the_process_and_drops_what_is_wrong() {
    leaves_other_agreements_to_the_process_and_drops_what_is_wrong(&XDP_FIRST);
}

#[test]
fn tc_leaves_other_agreements_to_the_process_and_drops_what_is_wrong() {
    leaves_other_agreements_to_the_process_and_drops_what_is_wrong(&TC_FIRST);
}

#[test]
fn xdp_the_process_folds_passed_up_values_with_the_same_atomics() {
    the_process_folds_passed_up_values_with_the_same_atomics(&XDP_FIRST);
}

#[test]
fn tc_the_process_folds_passed_up_values_with_the_same_atomics() {
    the_process_folds_passed_up_values_with_the_same_atomics(&TC_FIRST);
}

#[test]
fn xdp_concurrent_folds_end_exact_with_one_notice() {
    concurrent_folds_end_exact_with_one_notice(&XDP_FIRST);
}

#[test]
fn tc_concurrent_folds_end_exact_with_one_notice() {
    concurrent_folds_end_exact_with_one_notice(&TC_FIRST);
}

// ---- The TC hooks: TC ingress first, super-chunks -------------------------------------

const FLAG_ANSWERED: u16 = 0x0010;
const FLAG_RANGE: u16 = 0x0080;
/// A small chunk, so that a super-chunk of several fits a test run (one page).
const SMALL: usize = 200;

fn tc_harness() -> (Harness, aggbox_core::window::Windows) {
    let mut h = Harness::tc_hooks().expect("load the AggBox programs on the TC hooks (run as root)");
    let windows = h.register_with_windows(LOCAL_IP, LOCAL_PORT, &group(), CTL).unwrap();
    (h, windows)
}

/// Arms broadcast 4 from rank 1: `nchunks` chunks of SMALL bytes, the last
/// of `last` bytes, every chunk landed before the process is told.
fn arm_small(windows: &aggbox_core::window::Windows, nchunks: u32, last: u32) -> u32 {
    let total = (nchunks - 1) * SMALL as u32 + last;
    // SAFETY: the test owns this control block; nothing else runs on it.
    unsafe {
        windows.ctl().write(rx_ctl(RxCtl {
            seq: 4,
            root: 1,
            rank: 0,
            nchunks,
            target: nchunks,
            claim: aggbox_core::maps::CLAIM_SET,
            count: total,
            dtype: 0,
            chunk_bytes: SMALL as u32,
            last_bytes: last,
            credit: RX_WINDOW,
            ..RxCtl::default()
        }));
    }
    total
}

/// The payload byte `i` of chunk `chunk`: a plain function of both.
fn byte_of(chunk: u32, i: usize) -> u8 {
    (chunk as usize * 31 + i * 7 + 1) as u8
}

/// Chunks `first..first + lens.len()` of broadcast 4 (`total` bytes in
/// `nchunks` chunks) as one UDP GSO super-packet: each segment a whole
/// datagram, header and payload, of `lens[i]` payload bytes.
fn super_chunk(first: u32, lens: &[usize], nchunks: u32, total: u32) -> Vec<u8> {
    let mut payload = Vec::new();
    for (i, &len) in lens.iter().enumerate() {
        let chunk = first + i as u32;
        payload.extend_from_slice(&bcast_header(BCAST_DATA, 1, 4, chunk, nchunks, total));
        payload.extend((0..len).map(|b| byte_of(chunk, b)));
    }
    inbound(&payload)
}

fn placed_ok(windows: &aggbox_core::window::Windows, chunk: u32, len: usize) -> bool {
    let tag = windows.rx_tag(4, chunk).load(std::sync::atomic::Ordering::Acquire);
    let mut placed = vec![0u8; len];
    windows.copy_rx(4, chunk, &mut placed);
    tag == (4u64 << 32 | u64::from(chunk)) && placed.iter().enumerate().all(|(i, &b)| b == byte_of(chunk, i))
}

fn hdr_u32(frame: &[u8], at: usize) -> u32 {
    u32::from_le_bytes(frame[42 + at..42 + at + 4].try_into().unwrap())
}

#[test]
fn tc_places_a_super_chunk_and_answers_it_with_one_range_ack() {
    let (h, windows) = tc_harness();
    let total = arm_small(&windows, 8, 77);
    let stride = (40 + SMALL) as u32;

    // Chunks 0..4 in one skb of four segments: placed, one ACK back out.
    let frame = super_chunk(0, &[SMALL; 4], 8, total);
    let out = h.run_gso(Prog::TcIngress, &frame, 4, stride).unwrap();
    assert_eq!(out.run.retval, tc::REDIRECT, "answered from TC");
    assert_eq!(out.gso_segs, 0, "the reply is one plain datagram");
    let ack = &out.run.frame;
    assert_eq!(ack.len(), 14 + 20 + 8 + 40, "payload cut off");
    assert_eq!(&ack[0..6], &frame[6..12], "back to the sender's MAC");
    assert_eq!(&ack[14 + 12..14 + 16], &LOCAL_IP.octets(), "from us");
    assert_eq!(&ack[14 + 16..14 + 20], &PEER_IP.octets(), "to the root");
    assert!(ipv4_checksum_ok(&ack[14..34]), "IPv4 checksum");
    assert_eq!(u16::from_be_bytes([ack[38], ack[39]]), 8 + 40, "UDP length");
    assert_eq!(kind_of(ack), BCAST_ACK);
    assert_eq!(flags_of(ack), FLAG_RANGE);
    assert_eq!((hdr_u32(ack, 28), hdr_u32(ack, 36)), (0, 4), "chunks 0..4");
    assert_eq!(u16::from_le_bytes([ack[42 + 12], ack[42 + 13]]), 0, "sender: our rank");
    for chunk in 0..4 {
        assert!(placed_ok(&windows, chunk, SMALL), "chunk {chunk}");
    }
    assert!(!placed_ok(&windows, 4, SMALL), "nothing beyond the super-chunk");
    assert_eq!((bstat(&h, "placed"), bstat(&h, "superchunks"), bstat(&h, "acks_sent")), (4, 1, 1));

    // The same again (its ACK was lost): ACKed again, nothing counted twice.
    let out = h.run_gso(Prog::TcIngress, &frame, 4, stride).unwrap();
    assert_eq!(out.run.retval, tc::REDIRECT);
    assert_eq!((hdr_u32(&out.run.frame, 28), hdr_u32(&out.run.frame, 36)), (0, 4));
    assert_eq!((bstat(&h, "placed"), bstat(&h, "duplicates")), (4, 4));

    // Chunks 4..8, the last one short: the broadcast is complete, so the
    // skb goes up as the landed notice (its ACK went out as a copy).
    let frame = super_chunk(4, &[SMALL, SMALL, SMALL, 77], 8, total);
    let out = h.run_gso(Prog::TcIngress, &frame, 4, stride).unwrap();
    assert_eq!(out.run.retval, tc::OK, "the notice goes up");
    let notice = &out.run.frame;
    assert_eq!(kind_of(notice), BCAST_LANDED);
    assert_eq!(flags_of(notice), FLAG_ANSWERED, "its ACK is sent");
    assert_eq!((hdr_u32(notice, 28), hdr_u32(notice, 36)), (7, 8), "up to chunk 7; 8 landed");
    assert!(ipv4_checksum_ok(&notice[14..34]));
    for chunk in 4..7 {
        assert!(placed_ok(&windows, chunk, SMALL), "chunk {chunk}");
    }
    assert!(placed_ok(&windows, 7, 77), "the short last chunk");
    assert_eq!((bstat(&h, "placed"), bstat(&h, "landed")), (8, 1));

    // A plain datagram (no GSO) is a walk of one segment.
    let total = arm_small(&windows, 2, 10);
    let one = super_chunk(1, &[10], 2, total);
    let out = h.run_gso(Prog::TcIngress, &one, 0, 0).unwrap();
    assert_eq!(out.run.retval, tc::REDIRECT);
    assert_eq!(flags_of(&out.run.frame), 0, "one chunk: no range");
    assert_eq!(hdr_u32(&out.run.frame, 28), 1);
    assert!(placed_ok(&windows, 1, 10));
}

#[test]
fn tc_drops_and_counts_a_super_chunk_that_disagrees_with_itself() {
    let (h, windows) = tc_harness();
    let total = arm_small(&windows, 8, 77);
    let stride = (40 + SMALL) as u32;
    let good = super_chunk(0, &[SMALL; 4], 8, total);
    let header_at = |seg: usize| 42 + seg * stride as usize;

    let mut wrong_chunk = good.clone();
    wrong_chunk[header_at(2) + 28..header_at(2) + 32].copy_from_slice(&7u32.to_le_bytes());
    let mut wrong_seq = good.clone();
    wrong_seq[header_at(3) + 24..header_at(3) + 28].copy_from_slice(&5u32.to_le_bytes());
    let mut wrong_kind = good.clone();
    wrong_kind[header_at(1) + 5] = BCAST_ACK;
    // The UDP length disagrees with the skb's.
    let mut wrong_udp_len = good.clone();
    wrong_udp_len[38..40].copy_from_slice(&100u16.to_be_bytes());
    // A short segment that is not the broadcast's last chunk.
    let short_not_last = super_chunk(0, &[SMALL, SMALL, 50], 8, total);
    let cases: Vec<(&str, Vec<u8>, u32, u32)> = vec![
        ("a segment's chunk out of line", wrong_chunk, 4, stride),
        ("a segment of another broadcast", wrong_seq, 4, stride),
        ("a segment of another kind", wrong_kind, 4, stride),
        ("UDP length and skb disagree", wrong_udp_len, 4, stride),
        ("stride is not header + chunk", good.clone(), 4, stride + 8),
        ("more segments than the skb holds", good.clone(), 6, stride),
        ("fewer segments than the skb holds", good.clone(), 3, stride),
        ("a stride smaller than a header", good.clone(), 4, 20),
        ("a short segment that is not the last chunk", short_not_last, 3, stride),
    ];
    for (i, (case, frame, segs, size)) in cases.iter().enumerate() {
        let out = h.run_gso(Prog::TcIngress, frame, *segs, *size).unwrap();
        assert_eq!(out.run.retval, tc::SHOT, "{case}");
        assert_eq!(bstat(&h, "bad_segments"), i as u64 + 1, "{case}: counted");
        assert_eq!(bstat(&h, "placed"), 0, "{case}: nothing placed");
        for chunk in 0..8 {
            assert_eq!(windows.rx_tag(4, chunk).load(std::sync::atomic::Ordering::Acquire), 0, "{case}: slot {chunk} untouched");
        }
    }
    // What the kernel was not armed for goes up whole: user space places it.
    let other = {
        let mut f = good.clone();
        for seg in 0..4 {
            f[header_at(seg) + 24..header_at(seg) + 28].copy_from_slice(&5u32.to_le_bytes());
        }
        f
    };
    assert_eq!(h.run_gso(Prog::TcIngress, &other, 4, stride).unwrap().run.retval, tc::OK);
    assert_eq!(bstat(&h, "to_user"), 1);
    // A landed notice arriving from the network is never genuine.
    let landed = inbound(&bcast_header(BCAST_LANDED, 1, 4, 0, 8, total));
    assert_eq!(h.run(Prog::TcIngress, &landed).unwrap().retval, tc::SHOT);
}

#[test]
fn tc_folds_range_acks_at_the_root_and_lets_one_group_ack_up() {
    let mut h = Harness::tc_hooks().unwrap();
    let mut g = group();
    g.peers.push(PeerInfo { rank: 2, ipv4: STRANGER_IP, mac: [2, 0, 0, 0, 0, 3], port: PEER_PORT, datapath: Datapath::Kernel, mtu: 1500 });
    let windows = h.register_with_windows(LOCAL_IP, LOCAL_PORT, &g, CTL).unwrap();
    // SAFETY: the test owns this control block and its slots.
    unsafe {
        windows.ctl().write(Ctl { tx_seq: 9, tx_nchunks: 3, tx_receivers: 2, ..Ctl::default() });
        for chunk in 0..3 {
            (*windows.tx_slot(chunk)).tag = 9u64 << 32 | u64::from(chunk);
        }
    }
    let range_ack = |rank: u16, ip: Ipv4Addr, first: u32, n: u32| {
        let mut hdr = bcast_header(BCAST_ACK, rank, 9, first, 3, n);
        hdr[6..8].copy_from_slice(&FLAG_RANGE.to_le_bytes());
        udp(ip, PEER_PORT, LOCAL_IP, LOCAL_PORT, &hdr)
    };
    assert_eq!(h.run(Prog::TcIngress, &range_ack(1, PEER_IP, 0, 3)).unwrap().retval, tc::SHOT, "folded");
    assert_eq!(h.run(Prog::TcIngress, &range_ack(2, STRANGER_IP, 0, 2)).unwrap().retval, tc::SHOT, "folded");
    assert_eq!(bstat(&h, "acks_folded"), 5);
    // Rank 2's last chunk completes the broadcast: one group-ACK up.
    let last = h.run(Prog::TcIngress, &range_ack(2, STRANGER_IP, 2, 1)).unwrap();
    assert_eq!(last.retval, tc::OK, "the group-ACK goes up");
    assert_eq!(kind_of(&last.frame), BCAST_ACK);
    assert_eq!(flags_of(&last.frame), FLAG_GROUP);
    assert_eq!(hdr_u32(&last.frame, 36), 3, "three chunks held by all");
    for chunk in 0..3 {
        // SAFETY: the program is done with the slots.
        let slot = unsafe { *windows.tx_slot(chunk) };
        assert_eq!((slot.bits[0], slot.count), (0b110, 2), "chunk {chunk}");
    }
    // A range reaching past the broadcast: user space's business.
    assert_eq!(h.run(Prog::TcIngress, &range_ack(1, PEER_IP, 1, 3)).unwrap().retval, tc::OK);
    assert_eq!(bstat(&h, "group_acks"), 1);
}

// ---- The TC hooks: reductions on super-chunks ---------------------------------------

/// Lanes of a SMALL chunk of i32.
const SMALL_LANES: usize = SMALL / 4;

/// Contribution (or result) lanes of chunk `chunk` from `rank`: a plain
/// function of both, with values that wrap when summed.
fn lanes_of(rank: usize, chunk: u32) -> Vec<i32> {
    (0..SMALL_LANES as i32).map(|i| (i32::MAX - 3 * i).wrapping_mul(rank as i32 + 1) ^ (chunk as i32 * 7919)).collect()
}

/// Chunks `first..first + n` of `kind` from `sender` for reduction `seq`
/// (i32 SUM allreduce, `nchunks` chunks of SMALL bytes) as one UDP GSO
/// super-packet, each segment carrying `lanes_of(sender, chunk)`.
fn red_super_chunk(kind: u8, sender: u16, seq: u32, first: u32, n: u32, nchunks: u32) -> Vec<u8> {
    let mut payload = Vec::new();
    for chunk in first..first + n {
        let mut hdr = bcast_header(kind, sender, seq, chunk, nchunks, nchunks * SMALL_LANES as u32);
        hdr[14] = 1; // i32
        hdr[15] = 0x10; // allreduce, sum
        payload.extend(hdr);
        payload.extend(i32_bytes(&lanes_of(sender as usize, chunk)));
    }
    payload
}

/// A 3-rank group (this host is rank 0) on the TC hooks, and reduction
/// `seq` armed: 8 chunks of SMALL bytes in runs of 4, so this rank owns
/// chunks 0..4 (owned 0..4, each slot starting from its own lanes) and
/// rank 1 owns 4..8; `fanout` as the process sets it for an allreduce.
fn tc_red_harness(seq: u32, fanout: u32) -> (Harness, aggbox_core::window::Windows) {
    use aggbox_core::maps::{RedCtl, FOLD_ADD};
    let mut h = Harness::tc_hooks().expect("load the AggBox programs on the TC hooks (run as root)");
    let mut g = group();
    g.peers.push(PeerInfo { rank: 2, ipv4: THIRD_IP, mac: [2, 0, 0, 0, 0, 3], port: THIRD_PORT, datapath: Datapath::Kernel, mtu: 1500 });
    let windows = h.register_with_windows(LOCAL_IP, LOCAL_PORT, &g, CTL).unwrap();
    for owned in 0..4 {
        windows.prepare_red(owned, seq, owned, 0, &i32_bytes(&lanes_of(0, owned)));
    }
    windows.arm_red(&RedCtl {
        seq,
        nchunks: 8,
        count: 8 * SMALL_LANES as u32,
        dtype: 1,
        op: 0x10,
        lane: 4,
        fold: FOLD_ADD,
        ranks: 3,
        run: 4,
        chunk_bytes: SMALL as u32,
        last_bytes: 0,
        owned_last: u32::MAX,
        rank: 0,
        fanout,
        result_last: SMALL as u32,
        root: 0,
        credit: 8,
        notify: 64,
        landed: 0,
        target: 8,
        notified: 0,
    });
    (h, windows)
}

const THIRD_IP: Ipv4Addr = Ipv4Addr::new(10, 77, 0, 3);
const THIRD_PORT: u16 = 47_003;

/// The sum of the three ranks' lanes of chunk `chunk`, by a plain loop.
fn sum_of(chunk: u32) -> Vec<i32> {
    (0..SMALL_LANES).map(|i| (0..3).fold(0i32, |acc, rank| acc.wrapping_add(lanes_of(rank, chunk)[i]))).collect()
}

#[test]
fn tc_folds_a_super_chunk_of_contributions_segment_by_segment() {
    let (h, windows) = tc_red_harness(5, 0);
    let stride = (40 + SMALL) as u32;
    let from1 = inbound(&red_super_chunk(RED_DATA, 1, 5, 0, 4, 8));
    let out = h.run_gso(Prog::TcIngress, &from1, 4, stride).unwrap();
    assert_eq!(out.run.retval, tc::SHOT, "folded: nothing reaches the socket");
    assert_eq!(rstat(&h, "folded"), 4, "one per segment");
    let out = h.run_gso(Prog::TcIngress, &from1, 4, stride).unwrap();
    assert_eq!(out.run.retval, tc::SHOT, "a repeat");
    assert_eq!((rstat(&h, "folded"), rstat(&h, "duplicates")), (4, 4));

    // What disagrees with itself is dropped and counted, nothing folded.
    let from2 = udp(THIRD_IP, THIRD_PORT, LOCAL_IP, LOCAL_PORT, &red_super_chunk(RED_DATA, 2, 5, 0, 4, 8));
    let header_at = |seg: usize| 42 + seg * stride as usize;
    let mut wrong_chunk = from2.clone();
    wrong_chunk[header_at(2) + 28..header_at(2) + 32].copy_from_slice(&3u32.to_le_bytes());
    let mut wrong_sender = from2.clone();
    wrong_sender[header_at(1) + 12] = 1;
    let cases: Vec<(&str, &[u8], u32, u32)> = vec![
        ("a segment's chunk out of line", &wrong_chunk, 4, stride),
        ("a segment from another sender", &wrong_sender, 4, stride),
        ("stride is not header + chunk", &from2, 4, stride + 4),
        ("more segments than the skb holds", &from2, 5, stride),
        ("a stride smaller than a header", &from2, 4, 20),
    ];
    for (i, (case, frame, segs, size)) in cases.iter().enumerate() {
        let out = h.run_gso(Prog::TcIngress, frame, *segs, *size).unwrap();
        assert_eq!(out.run.retval, tc::SHOT, "{case}");
        assert_eq!((rstat(&h, "bad_segments"), rstat(&h, "folded")), (i as u64 + 1, 4), "{case}: counted, not folded");
    }
    // Chunks of rank 1's run, or of another call: the process's to judge.
    let not_mine = inbound(&red_super_chunk(RED_DATA, 1, 5, 4, 4, 8));
    assert_eq!(h.run_gso(Prog::TcIngress, &not_mine, 4, stride).unwrap().run.retval, tc::OK);
    let other_call = inbound(&red_super_chunk(RED_DATA, 1, 7, 0, 4, 8));
    assert_eq!(h.run_gso(Prog::TcIngress, &other_call, 4, stride).unwrap().run.retval, tc::OK);
    assert_eq!(rstat(&h, "to_user"), 2);

    // Rank 2's completes all four; without the fan-out it goes up whole,
    // and the slots say the process sends the results.
    let out = h.run_gso(Prog::TcIngress, &from2, 4, stride).unwrap();
    assert_eq!(out.run.retval, tc::OK);
    assert_eq!(out.run.frame, from2, "unchanged");
    assert_eq!((rstat(&h, "folded"), rstat(&h, "sums")), (8, 1));
    for chunk in 0..4 {
        let mut sum = vec![0u8; SMALL];
        windows.copy_red(5, chunk, &mut sum);
        assert_eq!(sum, i32_bytes(&sum_of(chunk)), "chunk {chunk}: the wrapping sum");
        assert!(windows.red_is_done(5, chunk) && windows.red_left_to_process(5, chunk), "chunk {chunk}");
    }
    // A RED_SUM or RED_LANDED from the wire is never genuine.
    let mut forged = red_super_chunk(RED_DATA, 1, 5, 0, 1, 8);
    forged[5] = RED_SUM;
    assert_eq!(h.run(Prog::TcIngress, &inbound(&forged)).unwrap().retval, tc::SHOT);
    assert_eq!(rstat(&h, "forged"), 1);
    forged[5] = RED_LANDED;
    assert_eq!(h.run(Prog::TcIngress, &inbound(&forged)).unwrap().retval, tc::SHOT);
}

#[test]
fn tc_turns_the_completing_super_chunk_into_results_and_places_others() {
    let (h, windows) = tc_red_harness(9, 1);
    let stride = (40 + SMALL) as u32;
    let from1 = inbound(&red_super_chunk(RED_DATA, 1, 9, 0, 4, 8));
    assert_eq!(h.run_gso(Prog::TcIngress, &from1, 4, stride).unwrap().run.retval, tc::SHOT);
    let from2 = udp(THIRD_IP, THIRD_PORT, LOCAL_IP, LOCAL_PORT, &red_super_chunk(RED_DATA, 2, 9, 0, 4, 8));
    let out = h.run_gso(Prog::TcIngress, &from2, 4, stride).unwrap();
    assert_eq!(out.run.retval, tc::SHOT, "sent as copies; nothing goes up before the last chunk");
    // The skb became the four results, from this rank, one per segment.
    let frame = &out.run.frame;
    assert_eq!(frame.len(), from2.len());
    assert_eq!(&frame[14 + 12..14 + 16], &LOCAL_IP.octets(), "from here");
    for seg in 0..4 {
        let at = 42 + seg * stride as usize;
        assert_eq!(frame[at + 5], RED_RESULT, "segment {seg}");
        assert_eq!(u16::from_le_bytes([frame[at + 12], frame[at + 13]]), 0, "segment {seg}: sender this rank");
        let lanes: Vec<i32> = frame[at + 40..at + 40 + SMALL].chunks_exact(4).map(|b| i32::from_le_bytes(b.try_into().unwrap())).collect();
        assert_eq!(lanes, sum_of(seg as u32), "segment {seg}: the sum");
        assert!(windows.red_is_done(9, seg as u32) && !windows.red_left_to_process(9, seg as u32));
    }
    // (The copies to the two others, bpf_clone_redirect, need a real
    // interface: tests/tests/allreduce.rs counts them, k_red_fanned_out.)

    // Rank 1's results of its run: placed, and the last of the 8 chunks
    // this rank waits for, so the skb goes up as the one notice.
    let results = inbound(&red_super_chunk(RED_RESULT, 1, 9, 4, 4, 8));
    let out = h.run_gso(Prog::TcIngress, &results, 4, stride).unwrap();
    assert_eq!((out.run.retval, kind_of(&out.run.frame)), (tc::OK, RED_LANDED));
    assert_eq!(out.run.frame.len(), 14 + 20 + 8 + 40, "a header-only notice");
    assert_eq!(hdr_u32(&out.run.frame, 36), 8, "8 landed");
    for chunk in 4..8 {
        assert!(windows.res_holds(9, chunk), "chunk {chunk}");
        let mut got = vec![0u8; SMALL];
        windows.copy_res(9, chunk, &mut got);
        assert_eq!(got, i32_bytes(&lanes_of(1, chunk)), "chunk {chunk}");
    }
    assert_eq!((rstat(&h, "placed"), rstat(&h, "landed")), (4, 1));
    // Again (a repeat): dropped, nothing placed twice. From the wrong owner,
    // or a short segment: the process's, or dropped as bad.
    assert_eq!(h.run_gso(Prog::TcIngress, &results, 4, stride).unwrap().run.retval, tc::SHOT);
    assert_eq!((rstat(&h, "placed"), rstat(&h, "duplicates")), (4, 4));
    let wrong_owner = udp(THIRD_IP, THIRD_PORT, LOCAL_IP, LOCAL_PORT, &red_super_chunk(RED_RESULT, 2, 9, 4, 4, 8));
    assert_eq!(h.run_gso(Prog::TcIngress, &wrong_owner, 4, stride).unwrap().run.retval, tc::OK);
    assert_eq!(h.run_gso(Prog::TcIngress, &results, 4, stride - 8).unwrap().run.retval, tc::SHOT);
    assert_eq!(rstat(&h, "bad_segments"), 1);
}

// ---- Barrier (ebpf/aggbox_barrier.h) ----------------------------------------

use aggbox_core::window::Arrival;

const BARRIER_ARRIVE: u8 = 1;
const BARRIER_RELEASE: u8 = 2;
const BARRIER_DONE: u8 = 16;

/// `sender`'s BARRIER_ARRIVE of barrier `seq`, arriving at rank 0.
fn arrive_from(sender: usize, seq: u32) -> Vec<u8> {
    udp(rank_ip(sender), rank_port(sender), LOCAL_IP, LOCAL_PORT, &bcast_header(BARRIER_ARRIVE, sender as u16, seq, 0, 0, 0))
}

fn barrier_stats(h: &Harness) -> Vec<(&'static str, u64)> {
    let stats = h.broadcast_stats().unwrap();
    BSTAT_NAMES.iter().copied().zip(stats).filter(|(n, v)| n.starts_with("barrier_") && *v != 0).collect()
}

/// The (source, destination) IPv4 addresses and UDP ports of a frame.
fn ends(frame: &[u8]) -> ((Ipv4Addr, u16), (Ipv4Addr, u16)) {
    let ip = |at: usize| Ipv4Addr::new(frame[at], frame[at + 1], frame[at + 2], frame[at + 3]);
    let port = |at: usize| u16::from_be_bytes([frame[at], frame[at + 1]]);
    ((ip(14 + 12), port(34)), (ip(14 + 16), port(36)))
}

fn sender_of(frame: &[u8]) -> u16 {
    u16::from_le_bytes([frame[42 + 12], frame[42 + 13]])
}

/// TC ingress on either hooks counts arrivals at rank 0; the completing
/// one goes up as the one notice (its releases cloned out), a repeat of the
/// barrier just completed is answered, and everything else goes up.
fn counts_arrivals_and_lets_one_notice_up(tc_hooks: bool) {
    let mut h = if tc_hooks { Harness::tc_hooks() } else { Harness::new() }.unwrap();
    let windows = h.register_with_windows(LOCAL_IP, LOCAL_PORT, &agree_group(), CTL).unwrap();
    let n = AGREE_RANKS;
    let run = |frame: &[u8]| h.run(Prog::TcIngress, frame).unwrap();

    // Not armed: up to the process.
    assert_eq!(run(&arrive_from(1, 1)).retval, tc::OK);
    windows.arm_barrier(n as u32);
    assert_eq!(windows.arrive(1, 0), Arrival::Counted, "rank 0 itself");
    for sender in 1..n - 1 {
        assert_eq!(run(&arrive_from(sender, 1)).retval, tc::SHOT, "rank {sender}: counted");
    }
    assert_eq!(run(&arrive_from(2, 1)).retval, tc::SHOT, "a repeat");
    assert!((0..n - 1).all(|r| windows.barrier_arrived(1, r)) && !windows.barrier_arrived(1, n - 1));
    assert_eq!(windows.barrier_open(), 1);

    // The last one: its releases go out, and it goes up as BARRIER_DONE
    // from its sender, flagged: every release went.
    let out = run(&arrive_from(n - 1, 1));
    assert_eq!(out.retval, tc::OK);
    assert_eq!((kind_of(&out.frame), sender_of(&out.frame), flags_of(&out.frame)), (BARRIER_DONE, n as u16 - 1, FLAG_ANSWERED));
    assert_eq!(ends(&out.frame), ((rank_ip(n - 1), rank_port(n - 1)), (LOCAL_IP, LOCAL_PORT)));
    assert_eq!(out.frame.len(), 14 + 20 + 8 + 40);
    assert!(ipv4_checksum_ok(&out.frame[14..34]));
    assert_eq!(windows.barrier_open(), 2, "the next barrier is open");
    assert!((0..n).all(|r| !windows.barrier_arrived(2, r)), "with nobody in it");

    // Rank 3 lost its release and asks again: answered with it.
    let out = run(&arrive_from(3, 1));
    assert_eq!(out.retval, tc::REDIRECT);
    assert_eq!((kind_of(&out.frame), sender_of(&out.frame), hdr_u32(&out.frame, 24)), (BARRIER_RELEASE, 0, 1));
    assert_eq!(ends(&out.frame), ((LOCAL_IP, LOCAL_PORT), (rank_ip(3), rank_port(3))));
    assert!(ipv4_checksum_ok(&out.frame[14..34]));

    // The next barrier: counted; a later or an older one: up.
    assert_eq!(run(&arrive_from(1, 2)).retval, tc::SHOT);
    assert_eq!(run(&arrive_from(1, 3)).retval, tc::OK);
    assert_eq!(run(&arrive_from(1, 0)).retval, tc::OK);
    // Rank 0 gives up on barrier 2: later arrivals go up, and who had
    // arrived stays readable.
    assert!(windows.abort_barrier(2));
    assert_eq!(run(&arrive_from(2, 2)).retval, tc::OK);
    assert!(windows.barrier_arrived(2, 1) && !windows.barrier_arrived(2, 2));
    assert_eq!(windows.arrive(2, 0), Arrival::NotOpen);
    assert!(!windows.abort_barrier(1), "barrier 1 had completed");

    // A BARRIER_DONE from the wire is dropped.
    let forged = udp(rank_ip(1), rank_port(1), LOCAL_IP, LOCAL_PORT, &bcast_header(BARRIER_DONE, 1, 2, 0, 0, 0));
    assert_eq!(run(&forged).retval, tc::SHOT);
    assert_eq!(
        barrier_stats(&h),
        vec![
            ("barrier_folded", n as u64 - 2 + 1),
            ("barrier_released", 1),
            ("barrier_answered", 1),
            ("barrier_duplicates", 1),
            ("barrier_to_user", 4),
            ("barrier_forged", 1),
        ]
    );
}

/// When rank 0 enters last, its own count completes the barrier; arrivals
/// TC passed up are counted by the process with the same atomics.
fn the_process_completes_what_it_enters_last(tc_hooks: bool) {
    let mut h = if tc_hooks { Harness::tc_hooks() } else { Harness::new() }.unwrap();
    let windows = h.register_with_windows(LOCAL_IP, LOCAL_PORT, &agree_group(), CTL).unwrap();
    let n = AGREE_RANKS;
    windows.arm_barrier(n as u32);
    for seq in 1..=3u32 {
        for sender in 1..n - 1 {
            assert_eq!(h.run(Prog::TcIngress, &arrive_from(sender, seq)).unwrap().retval, tc::SHOT);
        }
        // One arrival reached the process (as if TC had passed it up).
        assert_eq!(windows.arrive(seq, n - 1), Arrival::Counted);
        assert_eq!(windows.arrive(seq, n - 1), Arrival::Repeat);
        assert_eq!(windows.arrive(seq + 1, 1), Arrival::NotOpen, "not open yet");
        assert_eq!(windows.arrive(seq, 0), Arrival::Completed, "barrier {seq}");
        assert_eq!(windows.barrier_open(), seq + 1);
    }
    assert_eq!(bstat(&h, "barrier_released"), 0, "the process released them all");
    assert_eq!(bstat(&h, "barrier_folded"), 3 * (n as u64 - 2));
}

/// Many CPUs' worth of arrivals at once (threads of the process and test
/// runs of TC together): every barrier completes exactly once.
fn concurrent_arrivals_complete_each_barrier_once(tc_hooks: bool) {
    let mut h = if tc_hooks { Harness::tc_hooks() } else { Harness::new() }.unwrap();
    let windows = h.register_with_windows(LOCAL_IP, LOCAL_PORT, &agree_group(), CTL).unwrap();
    let n = AGREE_RANKS;
    windows.arm_barrier(n as u32);
    let rounds = 200u32;
    let mut completed_by_process = 0;
    let mut notices = 0;
    for seq in 1..=rounds {
        let results: Vec<Arrival> = std::thread::scope(|s| {
            let tc = s.spawn(|| {
                (1..n - 2)
                    .map(|sender| h.run(Prog::TcIngress, &arrive_from(sender, seq)).unwrap())
                    .filter(|out| out.retval == tc::OK && kind_of(&out.frame) == BARRIER_DONE)
                    .count()
            });
            let process: Vec<Arrival> = [n - 2, n - 1, 0].iter().map(|&r| windows.arrive(seq, r)).collect();
            notices += tc.join().unwrap();
            process
        });
        completed_by_process += results.iter().filter(|a| **a == Arrival::Completed).count();
        assert_eq!(windows.barrier_open(), seq + 1, "barrier {seq}");
    }
    assert_eq!(completed_by_process + notices, rounds as usize, "each barrier completed once");
    assert_eq!(bstat(&h, "barrier_released") as usize, notices);
}

#[test]
fn tc_counts_barrier_arrivals_and_lets_one_notice_up() {
    counts_arrivals_and_lets_one_notice_up(true);
}

#[test]
fn tc_counts_barrier_arrivals_behind_xdp_too() {
    counts_arrivals_and_lets_one_notice_up(false);
}

#[test]
fn the_process_completes_a_barrier_it_enters_last() {
    the_process_completes_what_it_enters_last(true);
}

#[test]
fn concurrent_barrier_arrivals_complete_each_barrier_once() {
    concurrent_arrivals_complete_each_barrier_once(true);
}

/// The verifier's work for each program as an attachment loads it (TC
/// ingress with `aggbox_tc_hooks` set; XDP ingress, loaded only on the XDP
/// hooks, has no such switch). Every joining rank pays it under the machine-wide join lock, so a program
/// whose verification grows several-fold fails here, not as a slow join
/// (state explosion: a key-value fast path once took TC ingress from
/// 244,852 to 967,696 instructions, near the kernel's limit of a million,
/// and eight ranks' join from 8.7 s to 41 s, past the rendezvous timeout).
#[test]
fn each_program_verifies_within_its_budget() {
    // Kernel 6.18, clang 19, when this was written: XDP ingress 88,986,
    // TC ingress 244,852, TC egress 926.
    const BUDGET: u32 = 400_000;
    let h = Harness::tc_hooks().expect("load the AggBox programs on the TC hooks (run as root)");
    for (prog, name) in [(Prog::XdpIngress, "XDP ingress"), (Prog::TcIngress, "TC ingress"), (Prog::TcEgress, "TC egress")] {
        let insns = h.verified_insns(prog).unwrap();
        eprintln!("{name}: {insns} instructions verified");
        assert!(insns < BUDGET, "{name}: {insns} instructions verified, budget {BUDGET}");
    }
}
