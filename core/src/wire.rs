//! The AggBox wire format, mirrored from `ebpf/aggbox_wire.h` (the single
//! definition; a test checks that the size and every offset match).
//! `docs/PROTOCOL.md` describes each field and each kind.

#[cfg(not(target_endian = "little"))]
compile_error!("AggBox's wire format is little-endian and so far only little-endian hosts are supported");

/// "AGBX" read as a little-endian u32.
pub const MAGIC: u32 = 0x5842_4741;
/// The protocol version this build speaks.
pub const VERSION: u8 = 1;
/// Bytes of [`Header`] on the wire.
pub const HDR_LEN: usize = 40;
/// Most ranks a group may have.
pub const MAX_RANKS: usize = 256;
/// Header flag: this datagram repeats an earlier one.
pub const FLAG_RETRANSMIT: u16 = 0x0001;
/// Header flag of `BCAST_DATA` and `AGREE_VALUE`: TC egress clones it to
/// every member.
pub const FLAG_FANOUT: u16 = 0x0002;
/// Header flag of `BCAST_ACK`: every receiver holds chunks `[0, chunk)`.
pub const FLAG_GROUP: u16 = 0x0004;
/// Header flag of `BCAST_ABORT`: the ranks' calls disagree.
pub const FLAG_MISMATCH: u16 = 0x0008;
/// Header flag of `BCAST_LANDED`: the kernel sent this chunk's ACK already;
/// of `BARRIER_DONE`: it sent every member the barrier's release.
pub const FLAG_ANSWERED: u16 = 0x0010;
/// `AGGBOX_FLAG_NOTIFY`: a RED_RESULT XDP made goes up as `RedLanded`
/// after TC ingress fanned it out (kernel-internal, dropped on the wire).
pub const FLAG_NOTIFY: u16 = 0x0020;
/// `AGREE_VALUE`: an answer to a rank that lags behind (it is not answered
/// in turn).
pub const FLAG_ANSWER: u16 = 0x0040;
/// `AGGBOX_FLAG_RANGE`: a BCAST_ACK that acknowledges chunks `[chunk,
/// chunk + count)`, a super-chunk TC ingress placed whole.
pub const FLAG_RANGE: u16 = 0x0080;
/// Bytes of [`AgreeBody`] after the header.
pub const AGREE_BODY_LEN: usize = 16;

/// `struct aggbox_agree_body`: what an `AGREE_VALUE` carries after the
/// header. Little-endian.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[repr(C)]
pub struct AgreeBody {
    /// The value's `f64` bits.
    pub value: u64,
    /// The sender's start counter (the counter of its store).
    pub incarnation: u32,
    /// 0.
    pub reserved: u32,
}

impl AgreeBody {
    /// The body's bytes.
    pub fn to_bytes(&self) -> [u8; AGREE_BODY_LEN] {
        let mut out = [0u8; AGREE_BODY_LEN];
        out[..8].copy_from_slice(&self.value.to_le_bytes());
        out[8..12].copy_from_slice(&self.incarnation.to_le_bytes());
        out[12..].copy_from_slice(&self.reserved.to_le_bytes());
        out
    }

    /// The body at the start of `payload`, if it is long enough.
    pub fn from_bytes(payload: &[u8]) -> Option<AgreeBody> {
        let b = payload.get(..AGREE_BODY_LEN)?;
        Some(AgreeBody {
            value: u64::from_le_bytes(b[..8].try_into().ok()?),
            incarnation: u32::from_le_bytes(b[8..12].try_into().ok()?),
            reserved: u32::from_le_bytes(b[12..].try_into().ok()?),
        })
    }
}
/// Largest chunk payload (a window slot of the kernel datapath).
pub const CHUNK_MAX: usize = 4032;
/// IPv4 + UDP + AggBox header bytes in every datagram.
pub const DATAGRAM_OVERHEAD: usize = 20 + 8 + HDR_LEN;

/// The group's chunk size for a smallest MTU of `mtu` (docs/BROADCAST.md).
pub fn chunk_size(mtu: u32) -> usize {
    let room = (mtu as usize).saturating_sub(DATAGRAM_OVERHEAD);
    (room.min(CHUNK_MAX) / 8 * 8).max(8)
}

/// Whether sequence number `a` is at or before `b`, in serial-number
/// arithmetic (RFC 1982): correct across the wrap from `u32::MAX` to 0 as
/// long as the two are less than 2^31 apart.
pub fn seq_at_or_before(a: u32, b: u32) -> bool {
    (b.wrapping_sub(a) as i32) >= 0
}

/// What a datagram is (`enum aggbox_kind`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(u8)]
pub enum Kind {
    /// rank -> rank 0: "I reached barrier `seq`".
    BarrierArrive = 1,
    /// rank 0 -> rank: "barrier `seq` is complete".
    BarrierRelease = 2,
    /// rank -> rank 0: "I am done with every operation".
    Close = 3,
    /// rank 0 -> rank: "got your CLOSE; leave".
    CloseAck = 4,
    /// rank 0 -> rank: "barrier `seq` failed: rank `count` is gone".
    BarrierAbort = 5,
    /// root -> receiver: chunk `chunk` of broadcast `seq`.
    BcastData = 6,
    /// receiver -> root: "I hold chunk `chunk` of `seq`".
    BcastAck = 7,
    /// any -> any: "broadcast `seq` failed: rank `count`".
    BcastAbort = 8,
    /// XDP -> its own host's socket: chunks of broadcast `seq` landed in the
    /// receive window (`count` of them); `chunk` is one it did not ACK.
    BcastLanded = 9,
    /// rank -> owner: its contribution to chunk `chunk` of reduction `seq`.
    RedData = 10,
    /// owner -> rank: the result of chunk `chunk` of reduction `seq`.
    RedResult = 11,
    /// owner -> contributor: "chunk `chunk` of `seq` is complete" (to a
    /// contributor that gets no result of it).
    RedDone = 12,
    /// any -> any: "reduction `seq` failed: rank `count`".
    RedAbort = 13,
    /// XDP -> its own host's socket: "owned chunk `chunk` of reduction
    /// `seq` is summed" (in the mapped slot; no body).
    RedSum = 14,
    /// XDP (or TC ingress) -> its own host's socket: `count` chunks of
    /// reduction `seq` landed (owned sums XDP completed and results it
    /// placed in the result window; no body).
    RedLanded = 15,
    /// TC ingress -> rank 0's socket: "barrier `seq` is complete", from the
    /// rank whose arrival completed it; flagged [`FLAG_ANSWERED`] when TC
    /// sent every member its release (else the process sends them).
    BarrierDone = 16,
    /// mapper -> owner: key-value batch `chunk` (numbered per mapper and
    /// owner, across operations) of `count` pairs of operation `seq`
    /// (docs/KV.md).
    KvData = 20,
    /// owner -> mapper: "batch `chunk` is counted".
    KvAck = 21,
    /// mapper -> owner: "I sent you `count` batches in operation `seq`".
    KvFin = 22,
    /// owner -> mapper: "I counted every batch your `KV_FIN` announced".
    KvFinAck = 23,
    /// any -> any: "key-value reduce `seq` failed: rank `count`".
    KvAbort = 24,
    /// rank -> rank: "my value of phase `chunk` (of `nchunks`) of agreement
    /// `seq` is the body's" ([`AgreeBody`], docs/AGREEMENT.md).
    AgreeValue = 30,
    /// XDP -> its own host's socket: "phase `chunk` of agreement `seq` has
    /// its quorum in the window".
    AgreeQuorum = 31,
}

impl Kind {
    /// The kind with this wire value, if any.
    pub fn from_u8(value: u8) -> Option<Kind> {
        Some(match value {
            1 => Kind::BarrierArrive,
            2 => Kind::BarrierRelease,
            3 => Kind::Close,
            4 => Kind::CloseAck,
            5 => Kind::BarrierAbort,
            6 => Kind::BcastData,
            7 => Kind::BcastAck,
            8 => Kind::BcastAbort,
            9 => Kind::BcastLanded,
            10 => Kind::RedData,
            11 => Kind::RedResult,
            12 => Kind::RedDone,
            13 => Kind::RedAbort,
            14 => Kind::RedSum,
            15 => Kind::RedLanded,
            16 => Kind::BarrierDone,
            20 => Kind::KvData,
            21 => Kind::KvAck,
            22 => Kind::KvFin,
            23 => Kind::KvFinAck,
            24 => Kind::KvAbort,
            30 => Kind::AgreeValue,
            31 => Kind::AgreeQuorum,
            _ => return None,
        })
    }
}

/// `struct aggbox_hdr`: the fixed header at the start of every AggBox UDP
/// payload. All fields little-endian.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[repr(C)]
pub struct Header {
    /// [`MAGIC`].
    pub magic: u32,
    /// [`VERSION`].
    pub version: u8,
    /// A [`Kind`] value.
    pub kind: u8,
    /// `FLAG_*` bits.
    pub flags: u16,
    /// Group id, chosen at rendezvous.
    pub group: u32,
    /// Rank of the sender.
    pub sender: u16,
    /// Element type of the payload.
    pub dtype: u8,
    /// Reduction op.
    pub op: u8,
    /// Random group token, chosen at rendezvous.
    pub token: u64,
    /// Operation sequence number within the group.
    pub seq: u32,
    /// Chunk index within the operation.
    pub chunk: u32,
    /// Number of chunks of the operation.
    pub nchunks: u32,
    /// Elements of `dtype` in this datagram.
    pub count: u32,
}

const _: () = assert!(std::mem::size_of::<Header>() == HDR_LEN);

/// Why a datagram was refused (the user datapath counts these like the BPF
/// programs do).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Malformed {
    /// Shorter than the header.
    Truncated,
    /// Not AggBox's magic.
    BadMagic,
    /// Another protocol version.
    BadVersion,
    /// An unknown kind.
    BadKind,
}

impl Header {
    /// A header of `kind` with the magic and version filled in.
    pub fn new(kind: Kind, group: u32, token: u64, sender: u16, seq: u32) -> Header {
        Header {
            magic: MAGIC,
            version: VERSION,
            kind: kind as u8,
            group,
            token,
            sender,
            seq,
            ..Header::default()
        }
    }

    /// Writes the header into the first [`HDR_LEN`] bytes of `buf`.
    ///
    /// # Panics
    /// If `buf` is shorter than [`HDR_LEN`] (a bug of the caller).
    pub fn write_to(&self, buf: &mut [u8]) {
        assert!(buf.len() >= HDR_LEN, "buffer too short for an AggBox header");
        // SAFETY: Header is repr(C) plain data of exactly HDR_LEN bytes, the
        // target is little-endian like the wire, and buf has room.
        unsafe { std::ptr::write_unaligned(buf.as_mut_ptr().cast::<Header>(), *self) }
    }

    /// Reads and checks the header at the start of `buf`.
    pub fn read_from(buf: &[u8]) -> Result<(Header, Kind), Malformed> {
        if buf.len() < HDR_LEN {
            return Err(Malformed::Truncated);
        }
        // SAFETY: buf holds at least HDR_LEN bytes and every bit pattern is a
        // valid Header.
        let header = unsafe { std::ptr::read_unaligned(buf.as_ptr().cast::<Header>()) };
        if header.magic != MAGIC {
            return Err(Malformed::BadMagic);
        }
        if header.version != VERSION {
            return Err(Malformed::BadVersion);
        }
        let kind = Kind::from_u8(header.kind).ok_or(Malformed::BadKind)?;
        Ok((header, kind))
    }
}

#[cfg(test)]
mod tests {
    use std::mem::offset_of;

    use super::*;
    use crate::layout_check::c_values;

    #[test]
    fn header_matches_the_c_definition() {
        let fields = [
            "magic", "version", "kind", "flags", "group", "sender", "dtype", "op", "token", "seq",
            "chunk", "nchunks", "count",
        ];
        let mut exprs = vec!["sizeof(struct aggbox_hdr)".to_string(), "AGGBOX_HDR_LEN".into()];
        exprs.extend(fields.iter().map(|f| format!("offsetof(struct aggbox_hdr, {f})")));
        exprs.extend(
            [
                "AGGBOX_MAGIC",
                "AGGBOX_VERSION",
                "AGGBOX_MAX_RANKS",
                "AGGBOX_FLAG_RETRANSMIT",
                "AGGBOX_FLAG_FANOUT",
                "AGGBOX_FLAG_GROUP",
                "AGGBOX_FLAG_MISMATCH",
                "AGGBOX_FLAG_ANSWERED",
                "AGGBOX_FLAG_NOTIFY",
                "AGGBOX_FLAG_RANGE",
                "AGGBOX_CHUNK_MAX",
            ]
            .map(String::from),
        );
        exprs.extend(
            [
                "AGGBOX_KIND_BARRIER_ARRIVE",
                "AGGBOX_KIND_BARRIER_RELEASE",
                "AGGBOX_KIND_CLOSE",
                "AGGBOX_KIND_CLOSE_ACK",
                "AGGBOX_KIND_BARRIER_ABORT",
                "AGGBOX_KIND_BCAST_DATA",
                "AGGBOX_KIND_BCAST_ACK",
                "AGGBOX_KIND_BCAST_ABORT",
                "AGGBOX_KIND_BCAST_LANDED",
                "AGGBOX_KIND_RED_DATA",
                "AGGBOX_KIND_RED_RESULT",
                "AGGBOX_KIND_RED_DONE",
                "AGGBOX_KIND_RED_ABORT",
                "AGGBOX_KIND_RED_SUM",
                "AGGBOX_KIND_RED_LANDED",
                "AGGBOX_KIND_BARRIER_DONE",
                "AGGBOX_KIND_MAX",
                "AGGBOX_KIND_KV_FIRST",
                "AGGBOX_KIND_KV_DATA",
                "AGGBOX_KIND_KV_ACK",
                "AGGBOX_KIND_KV_FIN",
                "AGGBOX_KIND_KV_FIN_ACK",
                "AGGBOX_KIND_KV_ABORT",
                "AGGBOX_KIND_KV_MAX",
                "AGGBOX_KIND_AGREE_FIRST",
                "AGGBOX_KIND_AGREE_VALUE",
                "AGGBOX_KIND_AGREE_QUORUM",
                "AGGBOX_KIND_AGREE_MAX",
                "AGGBOX_FLAG_ANSWER",
                "AGGBOX_AGREE_BODY_LEN",
                "sizeof(struct aggbox_agree_body)",
                "offsetof(struct aggbox_agree_body, value)",
                "offsetof(struct aggbox_agree_body, incarnation)",
            ]
            .map(String::from),
        );
        let c = c_values("aggbox_wire.h", &exprs);
        let rust = vec![
            std::mem::size_of::<Header>() as u64,
            HDR_LEN as u64,
            offset_of!(Header, magic) as u64,
            offset_of!(Header, version) as u64,
            offset_of!(Header, kind) as u64,
            offset_of!(Header, flags) as u64,
            offset_of!(Header, group) as u64,
            offset_of!(Header, sender) as u64,
            offset_of!(Header, dtype) as u64,
            offset_of!(Header, op) as u64,
            offset_of!(Header, token) as u64,
            offset_of!(Header, seq) as u64,
            offset_of!(Header, chunk) as u64,
            offset_of!(Header, nchunks) as u64,
            offset_of!(Header, count) as u64,
            MAGIC as u64,
            VERSION as u64,
            MAX_RANKS as u64,
            FLAG_RETRANSMIT as u64,
            FLAG_FANOUT as u64,
            FLAG_GROUP as u64,
            FLAG_MISMATCH as u64,
            FLAG_ANSWERED as u64,
            FLAG_NOTIFY as u64,
            FLAG_RANGE as u64,
            CHUNK_MAX as u64,
            Kind::BarrierArrive as u64,
            Kind::BarrierRelease as u64,
            Kind::Close as u64,
            Kind::CloseAck as u64,
            Kind::BarrierAbort as u64,
            Kind::BcastData as u64,
            Kind::BcastAck as u64,
            Kind::BcastAbort as u64,
            Kind::BcastLanded as u64,
            Kind::RedData as u64,
            Kind::RedResult as u64,
            Kind::RedDone as u64,
            Kind::RedAbort as u64,
            Kind::RedSum as u64,
            Kind::RedLanded as u64,
            Kind::BarrierDone as u64,
            Kind::BarrierDone as u64 + 1,
            Kind::KvData as u64,
            Kind::KvData as u64,
            Kind::KvAck as u64,
            Kind::KvFin as u64,
            Kind::KvFinAck as u64,
            Kind::KvAbort as u64,
            Kind::KvAbort as u64 + 1,
            Kind::AgreeValue as u64,
            Kind::AgreeValue as u64,
            Kind::AgreeQuorum as u64,
            Kind::AgreeQuorum as u64 + 1,
            FLAG_ANSWER as u64,
            AGREE_BODY_LEN as u64,
            std::mem::size_of::<AgreeBody>() as u64,
            offset_of!(AgreeBody, value) as u64,
            offset_of!(AgreeBody, incarnation) as u64,
        ];
        assert_eq!(rust, c);
    }

    #[test]
    fn sequence_numbers_compare_across_the_wrap() {
        assert!(seq_at_or_before(5, 5));
        assert!(seq_at_or_before(4, 5));
        assert!(!seq_at_or_before(6, 5));
        assert!(seq_at_or_before(u32::MAX, 0));
        assert!(seq_at_or_before(u32::MAX - 3, 2));
        assert!(!seq_at_or_before(2, u32::MAX - 3));
    }

    #[test]
    fn chunk_size_follows_the_mtu() {
        assert_eq!(chunk_size(1500), 1432);
        assert_eq!(chunk_size(3500), 3432);
        assert_eq!(chunk_size(9000), CHUNK_MAX);
        assert_eq!(chunk_size(1499), 1424); // 1431 rounded down to 8
        assert_eq!(chunk_size(60), 8);
    }

    #[test]
    fn magic_spells_agbx_on_the_wire() {
        assert_eq!(&MAGIC.to_le_bytes(), b"AGBX");
    }

    #[test]
    fn round_trip_and_malformed() {
        let mut header = Header::new(Kind::BarrierRelease, 7, 0x1122_3344_5566_7788, 5, 99);
        header.chunk = 3;
        header.nchunks = 4;
        header.count = 250;
        let mut buf = [0u8; HDR_LEN + 3];
        header.write_to(&mut buf);
        // Byte-by-byte against the documented layout, independent of the code above.
        assert_eq!(&buf[0..4], b"AGBX");
        assert_eq!(buf[4], 1);
        assert_eq!(buf[5], 2);
        assert_eq!(&buf[8..12], &7u32.to_le_bytes());
        assert_eq!(&buf[12..14], &5u16.to_le_bytes());
        assert_eq!(&buf[16..24], &0x1122_3344_5566_7788u64.to_le_bytes());
        assert_eq!(&buf[24..28], &99u32.to_le_bytes());
        assert_eq!(&buf[36..40], &250u32.to_le_bytes());
        assert_eq!(Header::read_from(&buf), Ok((header, Kind::BarrierRelease)));

        assert_eq!(Header::read_from(&buf[..HDR_LEN - 1]), Err(Malformed::Truncated));
        let mut bad = buf;
        bad[0] = b'X';
        assert_eq!(Header::read_from(&bad), Err(Malformed::BadMagic));
        let mut bad = buf;
        bad[4] = 2;
        assert_eq!(Header::read_from(&bad), Err(Malformed::BadVersion));
        let mut bad = buf;
        bad[5] = 0;
        assert_eq!(Header::read_from(&bad), Err(Malformed::BadKind));
        bad[5] = 200;
        assert_eq!(Header::read_from(&bad), Err(Malformed::BadKind));
        for kind in [17, 19, 25] {
            bad[5] = kind;
            assert_eq!(Header::read_from(&bad), Err(Malformed::BadKind), "kind {kind}");
        }
        bad[5] = 22;
        assert_eq!(Header::read_from(&bad).map(|(_, k)| k), Ok(Kind::KvFin));
    }
}
