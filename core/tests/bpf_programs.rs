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
