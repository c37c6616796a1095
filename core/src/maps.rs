//! Rust mirrors of the values in the shared BPF maps (`ebpf/aggbox_maps.h`),
//! with a test that each layout matches the C definition.

/// Map names, as in `ebpf/aggbox_maps.h` (at most 15 characters).
pub mod names {
    /// Local UDP port -> group.
    pub const PORTS: &str = "ab_ports";
    /// Group id -> token and size.
    pub const GROUPS: &str = "ab_groups";
    /// (group, rank) -> address.
    pub const MEMBERS: &str = "ab_members";
    /// (pid, port) -> process using the attachment.
    pub const USERS: &str = "ab_users";
    /// Per-CPU counters.
    pub const STATS: &str = "ab_stats";
    /// Per-CPU broadcast counters.
    pub const BSTATS: &str = "ab_bstats";
    /// Broadcast control blocks (mmapable).
    pub const CTL: &str = "ab_ctl";
    /// Broadcast receive windows (mmapable).
    pub const RXWIN: &str = "ab_rxwin";
    /// Broadcast send windows (mmapable).
    pub const TXWIN: &str = "ab_txwin";
    /// Reduction slots of owned chunks (mmapable).
    pub const REDWIN: &str = "ab_redwin";
    /// Per-CPU reduction counters.
    pub const RSTATS: &str = "ab_rstats";
    /// The reduction fold stage, for tail calls.
    pub const REDPROGS: &str = "ab_redprogs";
    /// Reduction result windows (mmapable).
    pub const REDRES: &str = "ab_redres";
    /// Key-value reduce: each communicator's kernel table (array of maps).
    pub const KVTABS: &str = "ab_kvtabs";
    /// Key-value reduce: each communicator's open-addressing array table
    /// (array of maps), when it folds into one.
    pub const KVARRS: &str = "ab_kvarrs";
    /// Key-value reduce: each communicator's arming.
    pub const KVCTL: &str = "ab_kvctl";
    /// Key-value reduce: each (communicator, mapper)'s window of batch numbers.
    pub const KVWIN: &str = "ab_kvwin";
    /// Key-value reduce: what the kernel counted per (communicator, mapper).
    pub const KVCOUNT: &str = "ab_kvcount";
    /// Per-CPU key-value counters.
    pub const KVSTATS: &str = "ab_kvstats";
    /// Approximate agreement: each communicator's phase fold (mmapable).
    pub const AGREE: &str = "ab_agree";
    /// Per-CPU agreement counters.
    pub const ASTATS: &str = "ab_astats";
    /// Every pinned map.
    pub const ALL: [&str; 21] = [
        PORTS, GROUPS, MEMBERS, USERS, STATS, BSTATS, CTL, RXWIN, TXWIN, REDWIN, RSTATS, REDPROGS, REDRES, KVTABS,
        KVCTL, KVWIN, KVCOUNT, KVSTATS, KVARRS, AGREE, ASTATS,
    ];
}

/// `struct aggbox_port_key`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
#[repr(C)]
pub struct PortKey {
    /// The communicator's IPv4 address, network byte order.
    pub ipv4: u32,
    /// Its UDP port, host byte order.
    pub port: u16,
    /// Zero.
    pub reserved: u16,
}

/// `struct aggbox_port`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[repr(C)]
pub struct PortValue {
    /// The group this port's communicator serves.
    pub group: u32,
    /// Its control block in `ab_ctl`, or [`NO_CTL`].
    pub ctl: u32,
}

/// `AGGBOX_NO_CTL`: a communicator without kernel broadcast windows.
pub const NO_CTL: u32 = u32::MAX;
/// `AGGBOX_CTL_SLOTS`: communicators per host with kernel broadcast windows.
pub const CTL_SLOTS: u32 = 8;
/// `AGGBOX_RX_SLOTS`: chunks in one communicator's receive windows.
pub const RX_SLOTS: u32 = 1024;
/// `AGGBOX_RX_PHASES`: broadcasts a receiver has in flight, in
/// `Ctl::rx[seq % RX_PHASES]` and that phase's part of the window.
pub const RX_PHASES: u32 = 2;
/// `AGGBOX_RX_WINDOW`: chunks in one broadcast's receive window.
pub const RX_WINDOW: u32 = RX_SLOTS / RX_PHASES;
/// `AGGBOX_TX_SLOTS`: chunks in one communicator's send window.
pub const TX_SLOTS: u32 = 512;
/// `AGGBOX_TAG_BUSY`: set in a receive slot's tag while XDP copies into it.
pub const TAG_BUSY: u64 = 0x8000_0000;

/// `struct aggbox_rxslot`: one chunk of a receive window.
#[derive(Clone, Copy)]
#[repr(C)]
pub struct RxSlot {
    /// `seq << 32 | chunk` of what it holds ([`TAG_BUSY`] while being written).
    pub tag: u64,
    /// The chunk's bytes.
    pub data: [u8; crate::wire::CHUNK_MAX],
}

/// `struct aggbox_txslot`: which receivers hold one chunk of a send window.
#[derive(Clone, Copy, Debug, Default)]
#[repr(C)]
pub struct TxSlot {
    /// `seq << 32 | chunk` of the chunk it tracks.
    pub tag: u64,
    /// One bit per rank.
    pub bits: [u64; crate::wire::MAX_RANKS / 64],
    /// How many receivers hold it.
    pub count: u32,
    /// Zero.
    pub reserved: u32,
}

/// `AGGBOX_RED_SLOTS`: owned chunks a communicator sums in the kernel at once.
pub const RED_SLOTS: u32 = 256;
/// `AGGBOX_RED_SEG`: lanes one run of the fold stage adds.
pub const RED_SEG: u32 = 128;

/// `struct aggbox_redslot`: one owned chunk being summed by XDP.
#[derive(Clone, Copy, Debug)]
#[repr(C)]
pub struct RedSlot {
    /// `seq << 32 | chunk` of the chunk it sums; 0: not prepared.
    pub tag: u64,
    /// Contributors folded, one bit per rank.
    pub bits: [u64; crate::wire::MAX_RANKS / 64],
    /// How many.
    pub count: u32,
    /// 1 once complete.
    pub done: u32,
    /// CPUs folding into it (the process waits for 0 before reusing it).
    pub inflight: u32,
    /// Zero.
    pub reserved: u32,
    /// The sum, in little-endian integer lanes.
    pub acc: [u64; crate::wire::CHUNK_MAX / 8],
}

/// `struct aggbox_redctl`: the reduction whose owned chunks XDP folds.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[repr(C)]
pub struct RedCtl {
    /// The reduction armed (0: none).
    pub seq: u32,
    /// Its chunks.
    pub nchunks: u32,
    /// Elements of the whole vector.
    pub count: u32,
    /// The header's dtype.
    pub dtype: u8,
    /// The header's op byte.
    pub op: u8,
    /// Bytes of an integer lane: 4 or 8.
    pub lane: u8,
    /// How lanes combine: a `FOLD_*` value.
    pub fold: u8,
    /// Contributions a chunk needs, the owner's own included.
    pub ranks: u32,
    /// Chunks an owner takes in a row: chunk `c` is rank `(c / run) %
    /// ranks`'s (reduce-scatter: a block).
    pub run: u32,
    /// Bytes of a chunk.
    pub chunk_bytes: u32,
    /// Bytes of the short chunk (owned index `owned_last`).
    pub last_bytes: u32,
    /// The owned index of the short chunk (`u32::MAX`: none of this rank's).
    pub owned_last: u32,
    /// This communicator's rank: the sender of the results it fans out.
    pub rank: u32,
    /// 1: XDP fans completed chunks out and places others' results (allreduce).
    pub fanout: u32,
    /// Bytes of the vector's last chunk.
    pub result_last: u32,
    /// Reduce: the rank that gets the results.
    pub root: u32,
    /// Results of chunks below this may be placed.
    pub credit: u32,
    /// Notify the process every this many chunks landed.
    pub notify: u32,
    /// Owned chunks XDP completed and results it placed (XDP adds).
    pub landed: u32,
    /// Chunks XDP must land: `nchunks` less those the process handled.
    pub target: u32,
    /// Set once the completion notice went up.
    pub notified: u32,
}

/// `AGGBOX_FOLD_ADD`: lanes add, wrapping.
pub const FOLD_ADD: u8 = 0;
/// `AGGBOX_FOLD_MIN_S`: signed minimum.
pub const FOLD_MIN_S: u8 = 1;
/// `AGGBOX_FOLD_MIN_U`: unsigned minimum.
pub const FOLD_MIN_U: u8 = 2;
/// `AGGBOX_FOLD_MAX_S`: signed maximum.
pub const FOLD_MAX_S: u8 = 3;
/// `AGGBOX_FOLD_MAX_U`: unsigned maximum.
pub const FOLD_MAX_U: u8 = 4;
/// `AGGBOX_RES_SLOTS`: result slots of a communicator (both phases), and the
/// chunks a contributor keeps in flight on the kernel datapath.
pub const RES_SLOTS: u32 = 256;

/// `AGGBOX_RED_PHASES`: reductions in flight at an owner, `Ctl::red[seq % 2]`.
pub const RED_PHASES: u32 = 2;
/// `AGGBOX_RED_AHEAD`: the chunk part of the tag of a slot armed ahead.
pub const RED_AHEAD: u32 = u32::MAX;
/// `AGGBOX_RED_DONE_PROCESS`: a slot's `done` when the kernel completed the
/// chunk but left sending its results to the process (TC hooks).
pub const RED_DONE_PROCESS: u32 = 2;

/// Bytes the kernel windows of one host take (every mmapable map, sized
/// at build time for [`CTL_SLOTS`] communicators): broadcast control
/// blocks, receive and send windows, and reduction slots.
pub fn window_memory() -> [(&'static str, usize); 6] {
    let elem = |size: usize| size.div_ceil(8) * 8;
    let ctl = CTL_SLOTS as usize;
    [
        ("control blocks", ctl * elem(size_of::<Ctl>())),
        ("broadcast receive windows", ctl * RX_SLOTS as usize * elem(size_of::<RxSlot>())),
        ("broadcast send windows", ctl * TX_SLOTS as usize * elem(size_of::<TxSlot>())),
        ("reduction slots", ctl * (RED_PHASES * RED_SLOTS) as usize * elem(size_of::<RedSlot>())),
        ("reduction result windows", ctl * RES_SLOTS as usize * elem(size_of::<RxSlot>())),
        ("agreement folds", ctl * elem(size_of::<AgreeCtl>())),
    ]
}

/// `AGGBOX_AGREE_NO_PHASE`: `AgreeCtl::phase` while the process re-arms.
pub const AGREE_NO_PHASE: u32 = u32::MAX;
/// `AGGBOX_AGREE_TRIES`: compare-and-swap attempts XDP makes on a key.
pub const AGREE_TRIES: u32 = 8;

/// `struct aggbox_agreectl`: one communicator's approximate-agreement
/// phase fold (`ab_agree[ctl]`, mapped by [`crate::window::Windows`]).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[repr(C)]
pub struct AgreeCtl {
    /// The armed agreement (0: none; XDP passes every `AGREE_VALUE` up).
    pub seq: u32,
    /// The phase being folded; [`AGREE_NO_PHASE`] while the process re-arms.
    pub phase: u32,
    /// The agreement's last phase.
    pub last: u32,
    /// Values that complete a phase (n - f), own included.
    pub quorum: u32,
    /// Distinct senders folded into `phase`, own included.
    pub count: u32,
    /// 0 -> 1 (CAS) when the quorum notice went up.
    pub notified: u32,
    /// XDP programs between their look at `phase` and the end of their fold.
    pub inflight: u32,
    /// This communicator's rank: the sender of answers.
    pub rank: u32,
    /// Who was folded into `phase`, one bit per rank.
    pub senders: [u64; crate::wire::MAX_RANKS / 64],
    /// Ordered key ([`crate::window::agree_key`]) of the smallest value folded.
    pub min_key: u64,
    /// Ordered key of the largest.
    pub max_key: u64,
    /// Odd while the process writes `ans_*`.
    pub ans_gen: u32,
    /// The phase whose value XDP answers laggers with.
    pub ans_phase: u32,
    /// The f64 bits this rank sent for `ans_phase`.
    pub ans_value: u64,
    /// Its incarnation.
    pub ans_incarnation: u32,
    /// Zero.
    pub reserved: u32,
}

/// Agreement counters (`enum aggbox_astat`, `ab_astats`), in index order.
pub const ASTAT_NAMES: [&str; 10] =
    ["folded", "quorums", "duplicates", "ahead", "answered", "stale", "contended", "malformed", "forged", "passed"];

/// Names of the reduction counters (`enum aggbox_rstat`), in index order.
pub const RSTAT_NAMES: [&str; 13] = [
    "folded",
    "sums",
    "duplicates",
    "to_user",
    "errors",
    "fanned_out",
    "placed",
    "answered",
    "landed",
    "contended",
    "results_to_user",
    "forged",
    "bad_segments",
];

/// `struct aggbox_rxctl`: the receive side of one broadcast.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[repr(C)]
pub struct RxCtl {
    /// The broadcast armed (0: none).
    pub seq: u32,
    /// Its root.
    pub root: u32,
    /// This communicator's rank.
    pub rank: u32,
    /// Its chunks.
    pub nchunks: u32,
    /// Its total elements.
    pub count: u32,
    /// Its element type.
    pub dtype: u32,
    /// The chunk size.
    pub chunk_bytes: u32,
    /// Bytes of the last chunk.
    pub last_bytes: u32,
    /// Chunks below this may be placed.
    pub credit: u32,
    /// Notify every this many landed chunks.
    pub notify: u32,
    /// Chunks placed (XDP adds).
    pub landed: u32,
    /// Chunks XDP must place: `nchunks` less those the process placed.
    pub target: u32,
    /// Set once the completion notice went up.
    pub notified: u32,
    /// [`CLAIM_OPEN`], [`CLAIM_BUSY`] or [`CLAIM_SET`]; only XDP takes it.
    pub claim: u32,
    /// The call's total elements, once it is made.
    pub call_count: u32,
    /// The call, once it is made: [`CALL_KNOWN`] | root << 8 | dtype (0:
    /// not yet).
    pub call_key: u32,
}

/// `struct aggbox_ctl`: one communicator's broadcast control block.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[repr(C)]
pub struct Ctl {
    /// Receiving: broadcast `seq` in `rx[seq % RX_PHASES]`.
    pub rx: [RxCtl; RX_PHASES as usize],
    /// Sending: the broadcast armed (0: none).
    pub tx_seq: u32,
    /// Its chunks.
    pub tx_nchunks: u32,
    /// Ranks that must hold every chunk.
    pub tx_receivers: u32,
    /// Wake the root every this many chunks held by all.
    pub tx_notify: u32,
    /// Chunks held by every receiver (XDP adds).
    pub tx_done: u32,
    /// Zero.
    pub tx_reserved: u32,
    /// The reductions armed for kernel folding, by sequence parity.
    pub red: [RedCtl; RED_PHASES as usize],
    /// The barrier TC counts at rank 0 (armed there only).
    pub bar: BarCtl,
}

/// `AGGBOX_BAR_ABORTED`: in [`BarCtl::state`]'s count, rank 0 gave up on
/// the open barrier.
pub const BAR_ABORTED: u32 = 0x8000_0000;

/// `struct aggbox_barctl`: the barrier at rank 0 (ebpf/aggbox_barrier.h).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[repr(C)]
pub struct BarCtl {
    /// Open barrier seq << 32 | ranks arrived (rank 0 included), changed
    /// only by compare-and-swap.
    pub state: u64,
    /// Who arrived at barrier seq: `bits[seq % 2]`.
    pub bits: [[u64; crate::wire::MAX_RANKS / 64]; 2],
    /// Ranks of the group; 0: not armed.
    pub size: u32,
    /// Zero.
    pub reserved: u32,
}

/// `AGGBOX_CLAIM_OPEN`: armed ahead; the first chunk sets the parameters.
pub const CLAIM_OPEN: u32 = 0;
/// `AGGBOX_CLAIM_BUSY`: XDP is setting them (the process never takes it).
pub const CLAIM_BUSY: u32 = 1;
/// `AGGBOX_CLAIM_SET`: parameters known.
pub const CLAIM_SET: u32 = 2;
/// `AGGBOX_CALL_KNOWN`: in `RxCtl::call_key`, the call was made.
pub const CALL_KNOWN: u32 = 0x8000_0000;

/// Broadcast and barrier counters (`enum aggbox_bstat`), in index order.
pub const BSTAT_NAMES: [&str; 19] = [
    "cloned",
    "placed",
    "acks_sent",
    "duplicates",
    "acks_folded",
    "group_acks",
    "landed",
    "to_user",
    "clones_refused",
    "superchunks",
    "segments_refused",
    "bad_segments",
    "barrier_folded",
    "barrier_released",
    "barrier_answered",
    "barrier_duplicates",
    "barrier_to_user",
    "barrier_contended",
    "barrier_forged",
];

/// `struct aggbox_group`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[repr(C)]
pub struct GroupValue {
    /// The group token every datagram must carry.
    pub token: u64,
    /// Ranks in the group.
    pub size: u32,
    /// Zero.
    pub reserved: u32,
}

/// `struct aggbox_member_key`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
#[repr(C)]
pub struct MemberKey {
    /// Group id.
    pub group: u32,
    /// Rank in the group.
    pub rank: u32,
}

/// `struct aggbox_member`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[repr(C)]
pub struct MemberValue {
    /// IPv4 address in network byte order (as in the IP header).
    pub ipv4: u32,
    /// UDP port in host byte order.
    pub port: u16,
    /// MAC address.
    pub mac: [u8; 6],
}

/// `struct aggbox_user_key`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
#[repr(C)]
pub struct UserKey {
    /// Process id.
    pub pid: u32,
    /// The communicator's local UDP port.
    pub port: u16,
    /// Zero.
    pub reserved: u16,
}

/// `struct aggbox_user`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[repr(C)]
pub struct UserValue {
    /// Start time of the process (field 22 of `/proc/<pid>/stat`).
    pub start_time: u64,
    /// The group the communicator serves.
    pub group: u32,
    /// The communicator's IPv4 address, network byte order.
    pub ipv4: u32,
    /// Inode of the process's PID namespace.
    pub pidns: u32,
    /// Zero.
    pub reserved: u32,
}

// SAFETY: all of these are repr(C) plain data without padding holes that
// matter to the kernel (reserved fields are explicit), valid for any bits.
unsafe impl aya::Pod for PortKey {}
unsafe impl aya::Pod for PortValue {}
unsafe impl aya::Pod for Ctl {}
unsafe impl aya::Pod for AgreeCtl {}
unsafe impl aya::Pod for GroupValue {}
unsafe impl aya::Pod for MemberKey {}
unsafe impl aya::Pod for MemberValue {}
unsafe impl aya::Pod for UserKey {}
unsafe impl aya::Pod for UserValue {}

/// The programs that keep counters (`enum aggbox_prog`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(u32)]
pub enum Prog {
    /// XDP ingress.
    XdpIngress = 0,
    /// TC ingress.
    TcIngress = 1,
    /// TC egress.
    TcEgress = 2,
}

impl Prog {
    /// Every program, in index order.
    pub const ALL: [Prog; 3] = [Prog::XdpIngress, Prog::TcIngress, Prog::TcEgress];
    /// Short name used in reports.
    pub fn name(self) -> &'static str {
        match self {
            Prog::XdpIngress => "xdp_ingress",
            Prog::TcIngress => "tc_ingress",
            Prog::TcEgress => "tc_egress",
        }
    }
}

/// Per-program counters (`enum aggbox_stat`), in index order.
pub const STAT_NAMES: [&str; 10] = [
    "seen",
    "passed_other",
    "accepted",
    "drop_truncated",
    "drop_bad_magic",
    "drop_bad_version",
    "drop_bad_kind",
    "drop_unknown_group",
    "drop_bad_token",
    "drop_not_member",
];
/// Number of counters per program (`AGGBOX_STAT_MAX`).
pub const STAT_MAX: usize = STAT_NAMES.len();

#[cfg(test)]
mod tests {
    use std::mem::{offset_of, size_of};

    use super::*;
    use crate::layout_check::c_values;

    #[test]
    fn values_match_the_c_definitions() {
        let exprs: Vec<String> = [
            "sizeof(struct aggbox_port_key)",
            "offsetof(struct aggbox_port_key, port)",
            "sizeof(struct aggbox_port)",
            "offsetof(struct aggbox_port, ctl)",
            "AGGBOX_NO_CTL",
            "AGGBOX_CTL_SLOTS",
            "AGGBOX_RX_SLOTS",
            "AGGBOX_TX_SLOTS",
            "AGGBOX_TAG_BUSY",
            "sizeof(struct aggbox_rxslot)",
            "offsetof(struct aggbox_rxslot, data)",
            "sizeof(struct aggbox_txslot)",
            "offsetof(struct aggbox_txslot, count)",
            "sizeof(struct aggbox_ctl)",
            "offsetof(struct aggbox_ctl, red)",
            "sizeof(struct aggbox_redctl)",
            "offsetof(struct aggbox_redctl, lane)",
            "offsetof(struct aggbox_redctl, ranks)",
            "offsetof(struct aggbox_redctl, last_bytes)",
            "offsetof(struct aggbox_redctl, fold)",
            "offsetof(struct aggbox_redctl, rank)",
            "offsetof(struct aggbox_redctl, credit)",
            "offsetof(struct aggbox_redctl, landed)",
            "offsetof(struct aggbox_redctl, run)",
            "offsetof(struct aggbox_redctl, notified)",
            "AGGBOX_FOLD_MAX_U",
            "AGGBOX_RES_SLOTS",
            "AGGBOX_RED_PHASES",
            "AGGBOX_RX_PHASES",
            "AGGBOX_RX_WINDOW",
            "sizeof(struct aggbox_rxctl)",
            "offsetof(struct aggbox_rxctl, credit)",
            "offsetof(struct aggbox_rxctl, landed)",
            "offsetof(struct aggbox_rxctl, target)",
            "offsetof(struct aggbox_rxctl, notified)",
            "offsetof(struct aggbox_rxctl, claim)",
            "offsetof(struct aggbox_rxctl, call_key)",
            "AGGBOX_CALL_KNOWN",
            "offsetof(struct aggbox_ctl, rx[1])",
            "offsetof(struct aggbox_ctl, tx_seq)",
            "offsetof(struct aggbox_ctl, tx_done)",
            "AGGBOX_CLAIM_SET",
            "AGGBOX_BSTAT_MAX",
            "AGGBOX_BSTAT_TO_USER",
            "AGGBOX_BSTAT_BARRIER_FOLDED",
            "AGGBOX_BSTAT_BARRIER_FORGED",
            "offsetof(struct aggbox_ctl, bar)",
            "sizeof(struct aggbox_barctl)",
            "offsetof(struct aggbox_barctl, bits[1])",
            "offsetof(struct aggbox_barctl, size)",
            "AGGBOX_BAR_ABORTED",
            "offsetof(struct aggbox_port, group)",
            "sizeof(struct aggbox_group)",
            "offsetof(struct aggbox_group, token)",
            "offsetof(struct aggbox_group, size)",
            "sizeof(struct aggbox_member_key)",
            "offsetof(struct aggbox_member_key, rank)",
            "sizeof(struct aggbox_member)",
            "offsetof(struct aggbox_member, ipv4)",
            "offsetof(struct aggbox_member, port)",
            "offsetof(struct aggbox_member, mac)",
            "sizeof(struct aggbox_user_key)",
            "offsetof(struct aggbox_user_key, port)",
            "sizeof(struct aggbox_user)",
            "offsetof(struct aggbox_user, group)",
            "offsetof(struct aggbox_user, ipv4)",
            "offsetof(struct aggbox_user, pidns)",
            "AGGBOX_PROG_XDP_INGRESS",
            "AGGBOX_PROG_TC_INGRESS",
            "AGGBOX_PROG_TC_EGRESS",
            "AGGBOX_PROG_MAX",
            "AGGBOX_STAT_ACCEPTED",
            "AGGBOX_STAT_DROP_NOT_MEMBER",
            "AGGBOX_STAT_MAX",
        ]
        .map(String::from)
        .to_vec();
        let rust = vec![
            size_of::<PortKey>(),
            offset_of!(PortKey, port),
            size_of::<PortValue>(),
            offset_of!(PortValue, ctl),
            NO_CTL as usize,
            CTL_SLOTS as usize,
            RX_SLOTS as usize,
            TX_SLOTS as usize,
            TAG_BUSY as usize,
            size_of::<RxSlot>(),
            offset_of!(RxSlot, data),
            size_of::<TxSlot>(),
            offset_of!(TxSlot, count),
            size_of::<Ctl>(),
            offset_of!(Ctl, red),
            size_of::<RedCtl>(),
            offset_of!(RedCtl, lane),
            offset_of!(RedCtl, ranks),
            offset_of!(RedCtl, last_bytes),
            offset_of!(RedCtl, fold),
            offset_of!(RedCtl, rank),
            offset_of!(RedCtl, credit),
            offset_of!(RedCtl, landed),
            offset_of!(RedCtl, run),
            offset_of!(RedCtl, notified),
            FOLD_MAX_U as usize,
            RES_SLOTS as usize,
            RED_PHASES as usize,
            RX_PHASES as usize,
            RX_WINDOW as usize,
            size_of::<RxCtl>(),
            offset_of!(RxCtl, credit),
            offset_of!(RxCtl, landed),
            offset_of!(RxCtl, target),
            offset_of!(RxCtl, notified),
            offset_of!(RxCtl, claim),
            offset_of!(RxCtl, call_key),
            CALL_KNOWN as usize,
            offset_of!(Ctl, rx) + size_of::<RxCtl>(),
            offset_of!(Ctl, tx_seq),
            offset_of!(Ctl, tx_done),
            CLAIM_SET as usize,
            BSTAT_NAMES.len(),
            BSTAT_NAMES.iter().position(|n| *n == "to_user").unwrap(),
            BSTAT_NAMES.iter().position(|n| *n == "barrier_folded").unwrap(),
            BSTAT_NAMES.iter().position(|n| *n == "barrier_forged").unwrap(),
            offset_of!(Ctl, bar),
            size_of::<BarCtl>(),
            offset_of!(BarCtl, bits) + size_of::<[u64; crate::wire::MAX_RANKS / 64]>(),
            offset_of!(BarCtl, size),
            BAR_ABORTED as usize,
            offset_of!(PortValue, group),
            size_of::<GroupValue>(),
            offset_of!(GroupValue, token),
            offset_of!(GroupValue, size),
            size_of::<MemberKey>(),
            offset_of!(MemberKey, rank),
            size_of::<MemberValue>(),
            offset_of!(MemberValue, ipv4),
            offset_of!(MemberValue, port),
            offset_of!(MemberValue, mac),
            size_of::<UserKey>(),
            offset_of!(UserKey, port),
            size_of::<UserValue>(),
            offset_of!(UserValue, group),
            offset_of!(UserValue, ipv4),
            offset_of!(UserValue, pidns),
            Prog::XdpIngress as usize,
            Prog::TcIngress as usize,
            Prog::TcEgress as usize,
            Prog::ALL.len(),
            STAT_NAMES.iter().position(|n| *n == "accepted").unwrap(),
            STAT_NAMES.iter().position(|n| *n == "drop_not_member").unwrap(),
            STAT_MAX,
        ];
        let rust: Vec<u64> = rust.into_iter().map(|v| v as u64).collect();
        assert_eq!(rust, c_values("aggbox_maps.h", &exprs));
    }

    #[test]
    fn reduction_values_match_the_c_definitions() {
        let exprs: Vec<String> = [
            "AGGBOX_RED_SLOTS",
            "AGGBOX_RED_SEG",
            "sizeof(struct aggbox_redslot)",
            "offsetof(struct aggbox_redslot, count)",
            "offsetof(struct aggbox_redslot, done)",
            "offsetof(struct aggbox_redslot, inflight)",
            "offsetof(struct aggbox_redslot, acc)",
            "AGGBOX_RSTAT_MAX",
            "AGGBOX_RSTAT_TO_USER",
            "AGGBOX_RSTAT_FORGED",
            "AGGBOX_RED_AHEAD",
            "AGGBOX_RED_DONE_PROCESS",
        ]
        .map(String::from)
        .to_vec();
        let rust = vec![
            RED_SLOTS as u64,
            RED_SEG as u64,
            size_of::<RedSlot>() as u64,
            offset_of!(RedSlot, count) as u64,
            offset_of!(RedSlot, done) as u64,
            offset_of!(RedSlot, inflight) as u64,
            offset_of!(RedSlot, acc) as u64,
            RSTAT_NAMES.len() as u64,
            RSTAT_NAMES.iter().position(|n| *n == "to_user").unwrap() as u64,
            RSTAT_NAMES.iter().position(|n| *n == "forged").unwrap() as u64,
            RED_AHEAD as u64,
            RED_DONE_PROCESS as u64,
        ];
        assert_eq!(rust, c_values("aggbox_reduce.h", &exprs));
    }

    #[test]
    fn agreement_values_match_the_c_definitions() {
        let exprs: Vec<String> = [
            "sizeof(struct aggbox_agreectl)",
            "offsetof(struct aggbox_agreectl, phase)",
            "offsetof(struct aggbox_agreectl, last)",
            "offsetof(struct aggbox_agreectl, quorum)",
            "offsetof(struct aggbox_agreectl, count)",
            "offsetof(struct aggbox_agreectl, notified)",
            "offsetof(struct aggbox_agreectl, inflight)",
            "offsetof(struct aggbox_agreectl, rank)",
            "offsetof(struct aggbox_agreectl, senders)",
            "offsetof(struct aggbox_agreectl, min_key)",
            "offsetof(struct aggbox_agreectl, max_key)",
            "offsetof(struct aggbox_agreectl, ans_gen)",
            "offsetof(struct aggbox_agreectl, ans_phase)",
            "offsetof(struct aggbox_agreectl, ans_value)",
            "offsetof(struct aggbox_agreectl, ans_incarnation)",
            "offsetof(struct aggbox_agreectl, reserved)",
            "AGGBOX_AGREE_NO_PHASE",
            "AGGBOX_AGREE_TRIES",
            "AGGBOX_ASTAT_MAX",
            "AGGBOX_ASTAT_FOLDED",
            "AGGBOX_ASTAT_QUORUMS",
            "AGGBOX_ASTAT_DUPLICATES",
            "AGGBOX_ASTAT_AHEAD",
            "AGGBOX_ASTAT_ANSWERED",
            "AGGBOX_ASTAT_STALE",
            "AGGBOX_ASTAT_CONTENDED",
            "AGGBOX_ASTAT_MALFORMED",
            "AGGBOX_ASTAT_FORGED",
            "AGGBOX_ASTAT_PASSED",
        ]
        .map(String::from)
        .to_vec();
        let stat = |name: &str| ASTAT_NAMES.iter().position(|n| *n == name).unwrap() as u64;
        let rust = vec![
            size_of::<AgreeCtl>() as u64,
            offset_of!(AgreeCtl, phase) as u64,
            offset_of!(AgreeCtl, last) as u64,
            offset_of!(AgreeCtl, quorum) as u64,
            offset_of!(AgreeCtl, count) as u64,
            offset_of!(AgreeCtl, notified) as u64,
            offset_of!(AgreeCtl, inflight) as u64,
            offset_of!(AgreeCtl, rank) as u64,
            offset_of!(AgreeCtl, senders) as u64,
            offset_of!(AgreeCtl, min_key) as u64,
            offset_of!(AgreeCtl, max_key) as u64,
            offset_of!(AgreeCtl, ans_gen) as u64,
            offset_of!(AgreeCtl, ans_phase) as u64,
            offset_of!(AgreeCtl, ans_value) as u64,
            offset_of!(AgreeCtl, ans_incarnation) as u64,
            offset_of!(AgreeCtl, reserved) as u64,
            AGREE_NO_PHASE as u64,
            AGREE_TRIES as u64,
            ASTAT_NAMES.len() as u64,
            stat("folded"),
            stat("quorums"),
            stat("duplicates"),
            stat("ahead"),
            stat("answered"),
            stat("stale"),
            stat("contended"),
            stat("malformed"),
            stat("forged"),
            stat("passed"),
        ];
        // Through aggbox_agree.h (which includes the maps header): each
        // test's layout program has a directory named for its header.
        assert_eq!(rust, c_values("aggbox_agree.h", &exprs));
    }

    #[test]
    fn the_kernel_windows_of_a_host_stay_within_64_mib() {
        let total: usize = window_memory().iter().map(|(_, bytes)| bytes).sum();
        assert!(total <= 64 << 20, "{total} bytes of mmapable maps per interface");
    }
}
