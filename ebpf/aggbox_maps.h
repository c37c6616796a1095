/* SPDX-License-Identifier: Apache-2.0 */
/*
 * Maps shared by every AggBox program on an interface.
 *
 * Each object declares the same maps with LIBBPF_PIN_BY_NAME, so the loader
 * pins them once under /sys/fs/bpf/aggbox/<netns>-<ifindex>/ and every later
 * object and process reuses the same kernel maps. The value layouts are
 * mirrored in core/src/maps.rs (with a layout test).
 */
#ifndef AGGBOX_MAPS_H
#define AGGBOX_MAPS_H

#include <linux/bpf.h>
#include <bpf/bpf_helpers.h>
#include "aggbox_wire.h"

/* How many communicators (local ports) and groups one host serves. */
#define AGGBOX_MAX_PORTS 1024
#define AGGBOX_MAX_GROUPS 256
#define AGGBOX_MAX_MEMBERS (AGGBOX_MAX_GROUPS * 64)

/* ab_ports: local (IPv4 address, UDP port) of a communicator -> the group it
 * serves. Keyed by address too, so a datagram that merely crosses this
 * interface to another host's port of the same number (forwarded or NATed
 * traffic) is not taken for ours. */
struct aggbox_port_key {
	__u32 ipv4; /* network byte order, as in the IP header */
	__u16 port; /* host byte order */
	__u16 reserved;
};

struct aggbox_port {
	__u32 group;
	__u32 ctl; /* index into ab_ctl, or AGGBOX_NO_CTL: no kernel broadcast window */
};

/*
 * Kernel broadcast state (docs/BROADCAST.md, "Kernel datapath"). The first
 * AGGBOX_CTL_SLOTS communicators of a host get a control block in ab_ctl and
 * a region of the receive and send windows; the process maps all three
 * (they are BPF_F_MMAPABLE), so setting up an operation needs no syscall.
 */
#define AGGBOX_NO_CTL 0xffffffffu
#define AGGBOX_CTL_SLOTS 8
#define AGGBOX_RX_SLOTS 1024 /* receive windows of one communicator, in chunks (power of 2) */
#define AGGBOX_RX_PHASES 2 /* broadcasts in flight at a receiver: rx[seq % 2] */
#define AGGBOX_RX_WINDOW (AGGBOX_RX_SLOTS / AGGBOX_RX_PHASES) /* one broadcast's window, in chunks */
#define AGGBOX_TX_SLOTS 512 /* send window of one communicator, in chunks (power of 2) */
#define AGGBOX_RANK_WORDS (AGGBOX_MAX_RANKS / 64)
/* A slot tag is (seq << 32 | chunk); while XDP copies a chunk in, BUSY is set. */
#define AGGBOX_TAG_BUSY 0x80000000u

/* One chunk of the receive window. */
struct aggbox_rxslot {
	__u64 tag;
	__u8 data[AGGBOX_CHUNK_MAX];
};

/* One chunk of the send window: which receivers hold it. */
struct aggbox_txslot {
	__u64 tag; /* written by the root process before it sends the chunk */
	__u64 bits[AGGBOX_RANK_WORDS];
	__u32 count; /* receivers that hold it */
	__u32 reserved;
};

/* The receive side of one broadcast, armed by the process (seq 0: none). */
struct aggbox_rxctl {
	__u32 seq;
	__u32 root;
	__u32 rank; /* this communicator's rank: the sender of its ACKs */
	__u32 nchunks;
	__u32 count; /* total elements, checked against each chunk */
	__u32 dtype;
	__u32 chunk_bytes; /* P */
	__u32 last_bytes; /* bytes of the last chunk */
	__u32 credit; /* chunks below this may be placed: first chunk not copied out + window */
	__u32 notify; /* notify the process every this many landed chunks */
	__u32 landed; /* chunks placed (XDP adds) */
	__u32 target; /* chunks XDP must place: nchunks less those the process placed itself
		       * (armed ahead: 0 less those, until the claim adds nchunks) */
	__u32 notified; /* set once the completion notice went up */
	/* Armed ahead, before the call is known: the first chunk claims
	 * (AGGBOX_CLAIM_*) the parameters it carries. Only XDP takes the
	 * claim (BUSY for a few instructions in softirq); the process only
	 * reads it, so no chunk is ever turned away while a process that
	 * holds it is descheduled. */
	__u32 claim;
	/* The process's call, once it is made (call_key 0: not yet): a chunk
	 * that disagrees with it does not claim the window. */
	__u32 call_count;
	__u32 call_key; /* AGGBOX_CALL_KNOWN | root << 8 | dtype */
};

/*
 * One communicator's control block. Broadcast seq is received in phase
 * rx[seq % AGGBOX_RX_PHASES] and its chunks land in that phase's half of the
 * receive window, so the next broadcast (armed ahead when this one starts)
 * can land while the process is still copying this one out.
 */
/*
 * A reduction this communicator takes part in, armed by the process (seq 0:
 * none) when the owners' sums are integer lane folds (docs/ALLREDUCE.md,
 * "Kernel datapath"): the current one, and the next one armed ahead with
 * the parameters of the one before (a training loop repeats its calls).
 * XDP folds a RED_DATA only when every field matches its header, into the
 * slot the process prepared. With `fanout`, XDP also turns the
 * contribution that completes a chunk into its result, which TC ingress
 * sends to the members that get it (and a header-only RED_DONE to the other
 * contributors), places the results (and DONEs) of others' chunks in this
 * communicator's result window (ab_redres), and counts both in `landed`,
 * so the process is woken once, not per chunk.
 */
struct aggbox_redctl {
	__u32 seq;
	__u32 nchunks;
	__u32 count; /* elements of the whole vector, as in the header */
	__u8 dtype; /* the header's dtype */
	__u8 op; /* the header's op byte (collective, QUANTIZED, operator) */
	__u8 lane; /* bytes of an integer lane: 4 or 8 */
	__u8 fold; /* how lanes combine: AGGBOX_FOLD_* */
	__u32 ranks; /* contributions a chunk needs, the owner's own included */
	/* Chunks an owner takes in a row (docs/ALLREDUCE.md, "Who owns a
	 * chunk"): chunk c is rank (c / run) % ranks's, the (c / run / ranks *
	 * run + c % run)-th of its chunks. Reduce-scatter: a block. */
	__u32 run;
	__u32 chunk_bytes; /* bytes of a chunk */
	__u32 last_bytes; /* bytes of the short chunk, owned index owned_last (if this rank owns it) */
	__u32 owned_last;
	/* Results in the kernel (allreduce). */
	__u32 rank; /* this communicator's rank: the sender of the results it fans out */
	__u32 fanout; /* 1: fan completed chunks out and place others' results */
	__u32 result_last; /* bytes of the vector's last chunk */
	__u32 root; /* reduce: the rank that gets the results */
	__u32 credit; /* results of chunks below this may be placed: first chunk not done + AGGBOX_RES_SLOTS */
	__u32 notify; /* notify the process every this many chunks landed */
	__u32 landed; /* owned chunks XDP completed + results XDP placed */
	__u32 target; /* chunks XDP must land: nchunks less those the process handled itself */
	__u32 notified; /* set once the completion notice went up */
};

/* How the lanes of a reduction combine (aggbox_redctl.fold). MIN and MAX
 * are compare-and-swap loops, idempotent, so a contribution that loses too
 * many races is passed to the process, which folds it again. */
#define AGGBOX_FOLD_ADD 0 /* wrapping integer addition */
#define AGGBOX_FOLD_MIN_S 1 /* signed minimum */
#define AGGBOX_FOLD_MIN_U 2 /* unsigned minimum */
#define AGGBOX_FOLD_MAX_S 3 /* signed maximum */
#define AGGBOX_FOLD_MAX_U 4 /* unsigned maximum */

/* The collective in the high nibble of a reduction header's op byte. */
#define AGGBOX_COLL_ALLREDUCE 1
#define AGGBOX_COLL_REDUCE 2
#define AGGBOX_COLL_REDUCE_SCATTER 3

/* Result slots of one communicator (power of 2), shared by its two phases:
 * a rank gets results of a reduction only after it contributed to it, so
 * only after it took every result of the one before; a late repeat of an
 * older result finds a newer tag (or a disarmed phase) and goes up. A
 * contributor keeps this many chunks in flight on the kernel datapath, so
 * every result it can get has a slot. */
#define AGGBOX_RES_SLOTS 256

/* Reductions in flight at an owner: red[seq % 2], and that phase's slots. */
#define AGGBOX_RED_PHASES 2

/*
 * The barrier at rank 0 (docs/BARRIER.md, "Kernel datapath";
 * aggbox_barrier.h): TC ingress counts BARRIER_ARRIVEs of the open barrier
 * and the one that completes it is sent to every member as its release.
 * `state` is (open barrier seq << 32 | ranks arrived, rank 0 included),
 * changed only by compare-and-swap, by TC and by the process alike: the
 * swap that takes the count to `size` opens the next barrier in the same
 * step. A rank's bit in bits[seq % 2] says it arrived at barrier seq (a
 * repeat is dropped); it is set before the count and taken back when the
 * count could not be taken.
 */
#define AGGBOX_BAR_ABORTED 0x80000000u /* in state's count: rank 0 gave up on the barrier */
#define AGGBOX_BAR_TRIES 8 /* compare-and-swap attempts on state before an arrival is dropped (the rank repeats it) */

struct aggbox_barctl {
	__u64 state;
	__u64 bits[2][AGGBOX_RANK_WORDS];
	__u32 size; /* ranks in the group; 0: not armed, every BARRIER_ARRIVE goes up */
	__u32 reserved;
};

struct aggbox_ctl {
	struct aggbox_rxctl rx[AGGBOX_RX_PHASES];
	/* Sending (root): armed by the process for broadcast tx_seq (0: none). */
	__u32 tx_seq;
	__u32 tx_nchunks;
	__u32 tx_receivers; /* ranks that must hold every chunk */
	__u32 tx_notify; /* wake the root every this many chunks held by all */
	__u32 tx_done; /* chunks held by every receiver (XDP adds) */
	__u32 tx_reserved;
	struct aggbox_redctl red[AGGBOX_RED_PHASES];
	struct aggbox_barctl bar; /* armed at rank 0 only */
};

#define AGGBOX_CLAIM_OPEN 0 /* armed ahead: the first chunk sets the parameters */
#define AGGBOX_CLAIM_BUSY 1 /* XDP on a CPU is setting them (never the process) */
#define AGGBOX_CLAIM_SET 2 /* parameters known: place what matches them */
#define AGGBOX_CALL_KNOWN 0x80000000u /* in rxctl.call_key: the call was made */

/* ab_groups: group id -> what a datagram of that group must carry. */
struct aggbox_group {
	__u64 token;
	__u32 size; /* ranks in the group */
	__u32 reserved;
};

/* ab_members: (group, rank) -> where that rank's datagrams come from. */
struct aggbox_member_key {
	__u32 group;
	__u32 rank;
};

struct aggbox_member {
	__u32 ipv4; /* network byte order, as in the IP header */
	__u16 port; /* host byte order */
	__u8 mac[6];
};

/* ab_users: (pid, port) of a process using this attachment. Only user space
 * reads and writes it: it is the reference count that decides who detaches,
 * and it lets the next start reclaim what a killed process left. */
struct aggbox_user_key {
	__u32 pid;
	__u16 port;
	__u16 reserved;
};

struct aggbox_user {
	__u64 start_time; /* /proc/<pid>/stat field 22, to tell reused pids apart */
	__u32 group;
	__u32 ipv4; /* the communicator's address (network byte order) */
	__u32 pidns; /* inode of its PID namespace: pids mean nothing elsewhere */
	__u32 reserved;
};

/* Which program a counter belongs to. */
enum aggbox_prog {
	AGGBOX_PROG_XDP_INGRESS = 0,
	AGGBOX_PROG_TC_INGRESS = 1,
	AGGBOX_PROG_TC_EGRESS = 2,
	AGGBOX_PROG_MAX = 3,
};

/* Counters, per program: ab_stats[prog * AGGBOX_STAT_MAX + stat]. */
enum aggbox_stat {
	AGGBOX_STAT_SEEN = 0, /* every frame the program ran on */
	AGGBOX_STAT_PASSED_OTHER = 1, /* not AggBox's: passed untouched */
	AGGBOX_STAT_ACCEPTED = 2, /* valid AggBox datagram */
	AGGBOX_STAT_DROP_TRUNCATED = 3, /* shorter than its headers say */
	AGGBOX_STAT_DROP_BAD_MAGIC = 4,
	AGGBOX_STAT_DROP_BAD_VERSION = 5,
	AGGBOX_STAT_DROP_BAD_KIND = 6,
	AGGBOX_STAT_DROP_UNKNOWN_GROUP = 7, /* not the group of the port */
	AGGBOX_STAT_DROP_BAD_TOKEN = 8,
	AGGBOX_STAT_DROP_NOT_MEMBER = 9, /* sender rank or address not in group */
	AGGBOX_STAT_MAX = 10,
};

struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, AGGBOX_MAX_PORTS);
	__type(key, struct aggbox_port_key);
	__type(value, struct aggbox_port);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} ab_ports SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, AGGBOX_MAX_GROUPS);
	__type(key, __u32);
	__type(value, struct aggbox_group);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} ab_groups SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, AGGBOX_MAX_MEMBERS);
	__type(key, struct aggbox_member_key);
	__type(value, struct aggbox_member);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} ab_members SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, AGGBOX_MAX_PORTS);
	__type(key, struct aggbox_user_key);
	__type(value, struct aggbox_user);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} ab_users SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, AGGBOX_PROG_MAX * AGGBOX_STAT_MAX);
	__type(key, __u32);
	__type(value, __u64);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} ab_stats SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(map_flags, BPF_F_MMAPABLE);
	__uint(max_entries, AGGBOX_CTL_SLOTS);
	__type(key, __u32);
	__type(value, struct aggbox_ctl);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} ab_ctl SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(map_flags, BPF_F_MMAPABLE);
	__uint(max_entries, AGGBOX_CTL_SLOTS * AGGBOX_RX_SLOTS);
	__type(key, __u32);
	__type(value, struct aggbox_rxslot);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} ab_rxwin SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(map_flags, BPF_F_MMAPABLE);
	__uint(max_entries, AGGBOX_CTL_SLOTS * AGGBOX_TX_SLOTS);
	__type(key, __u32);
	__type(value, struct aggbox_txslot);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} ab_txwin SEC(".maps");

/* Reduction result windows: ab_redres[ctl * RES_SLOTS + chunk % RES_SLOTS],
 * a result XDP placed (or a DONE, tag only), tagged like a receive slot. */
struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(map_flags, BPF_F_MMAPABLE);
	__uint(max_entries, AGGBOX_CTL_SLOTS * AGGBOX_RES_SLOTS);
	__type(key, __u32);
	__type(value, struct aggbox_rxslot);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} ab_redres SEC(".maps");

/* Broadcast and barrier counters of the host: ab_bstats[stat], per CPU. */
enum aggbox_bstat {
	AGGBOX_BSTAT_CLONED = 0, /* TC egress: copies of FANOUT chunks sent, the original included (size - 1 each) */
	AGGBOX_BSTAT_PLACED = 1, /* XDP: chunks copied into a receive window */
	AGGBOX_BSTAT_ACKS_SENT = 2, /* XDP: ACKs sent back with XDP_TX */
	AGGBOX_BSTAT_DUPLICATES = 3, /* XDP: chunks or ACKs that repeated one already counted */
	AGGBOX_BSTAT_ACKS_FOLDED = 4, /* XDP: ACKs folded into a send window and dropped */
	AGGBOX_BSTAT_GROUP_ACKS = 5, /* XDP: group-ACKs passed up to a root */
	AGGBOX_BSTAT_LANDED = 6, /* XDP: landed notices passed up to a receiver */
	AGGBOX_BSTAT_TO_USER = 7, /* XDP: broadcast datagrams left to user space (unarmed, stale, odd) */
	AGGBOX_BSTAT_CLONES_REFUSED = 8, /* TC egress: copies the device would not take (resent by the root) */
	AGGBOX_BSTAT_SUPERCHUNKS = 9, /* TC ingress: super-chunks (GSO skbs of several chunks) placed */
	AGGBOX_BSTAT_SEGMENTS_REFUSED = 10, /* TC ingress: segments of a super-chunk dropped unplaced (resent by the root) */
	AGGBOX_BSTAT_BAD_SEGMENTS = 11, /* TC ingress: super-chunks dropped: a segment disagrees with the first, or the stride with the chunk size */
	AGGBOX_BSTAT_BARRIER_FOLDED = 12, /* TC ingress: arrivals counted at rank 0 and dropped */
	AGGBOX_BSTAT_BARRIER_RELEASED = 13, /* TC ingress: barriers completed, their releases sent to every member */
	AGGBOX_BSTAT_BARRIER_ANSWERED = 14, /* TC ingress: repeated arrivals of the last barrier answered with its release */
	AGGBOX_BSTAT_BARRIER_DUPLICATES = 15, /* TC ingress: repeated arrivals of the open barrier, dropped */
	AGGBOX_BSTAT_BARRIER_TO_USER = 16, /* TC ingress: arrivals left to the process (not armed, aborted, another barrier) */
	AGGBOX_BSTAT_BARRIER_CONTENDED = 17, /* TC ingress: arrivals dropped uncounted after AGGBOX_BAR_TRIES lost swaps */
	AGGBOX_BSTAT_BARRIER_FORGED = 18, /* TC ingress: BARRIER_DONE from the wire (only TC makes them), dropped */
	AGGBOX_BSTAT_MAX = 19,
};

struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, AGGBOX_BSTAT_MAX);
	__type(key, __u32);
	__type(value, __u64);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} ab_bstats SEC(".maps");

/* Adds 1 to counter `idx` of the per-CPU counter array `map` (this CPU's
 * slot: no other CPU writes it). */
static __always_inline void aggbox_percpu_inc(void *map, __u32 idx)
{
	__u64 *value = bpf_map_lookup_elem(map, &idx);

	if (value)
		*value += 1;
}

static __always_inline void aggbox_bcount(enum aggbox_bstat stat)
{
	aggbox_percpu_inc(&ab_bstats, stat);
}

static __always_inline void aggbox_bcount_n(enum aggbox_bstat stat, __u32 n)
{
	__u32 idx = stat;
	__u64 *value = bpf_map_lookup_elem(&ab_bstats, &idx);

	if (value)
		*value += n;
}

/* Reduction counters of the host: ab_rstats[stat], per CPU. */
enum aggbox_rstat {
	AGGBOX_RSTAT_FOLDED = 0, /* contributions added into a slot by XDP */
	AGGBOX_RSTAT_SUMS = 1, /* RED_SUM notices passed up: chunks XDP completed */
	AGGBOX_RSTAT_DUPLICATES = 2, /* repeats of a contribution already added */
	AGGBOX_RSTAT_TO_USER = 3, /* RED_DATA left to user space (unarmed, unprepared, odd) */
	AGGBOX_RSTAT_ERRORS = 4, /* a tail call that did not happen (must stay 0) */
	AGGBOX_RSTAT_FANNED_OUT = 5, /* TC ingress: results of chunks XDP completed, sent to a member */
	AGGBOX_RSTAT_PLACED = 6, /* XDP: results placed in the result window */
	AGGBOX_RSTAT_ANSWERED = 7, /* XDP: repeats of a completed chunk's contribution answered with its result */
	AGGBOX_RSTAT_LANDED = 8, /* XDP: landed notices passed up */
	AGGBOX_RSTAT_CONTENDED = 9, /* XDP: MIN/MAX contributions that lost too many races, left to the process */
	AGGBOX_RSTAT_RES_TO_USER = 10, /* XDP: RED_RESULT left to user space (unarmed, beyond credit, odd) */
	AGGBOX_RSTAT_FORGED = 11, /* XDP: kernel-internal kinds or flags that came from the wire, dropped */
	AGGBOX_RSTAT_BAD_SEGMENTS = 12, /* TC: super-chunks whose segments disagree with each other or the call, dropped */
	AGGBOX_RSTAT_MAX = 13,
};

struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, AGGBOX_RSTAT_MAX);
	__type(key, __u32);
	__type(value, __u64);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} ab_rstats SEC(".maps");

static __always_inline void aggbox_rcount(enum aggbox_rstat stat)
{
	aggbox_percpu_inc(&ab_rstats, stat);
}

static __always_inline void aggbox_rcount_n(enum aggbox_rstat stat, __u32 n)
{
	__u32 idx = stat;
	__u64 *value = bpf_map_lookup_elem(&ab_rstats, &idx);

	if (value)
		*value += n;
}

/*
 * Approximate agreement (docs/AGREEMENT.md; the XDP fold is aggbox_agree.h).
 * One block per communicator control slot, indexed by pkt.ctl like ab_ctl,
 * mapped by the process (BPF_F_MMAPABLE). The process arms one phase of
 * one agreement at a time; XDP folds that phase's values (count, min and
 * max as ordered integer keys of the doubles) and answers ranks that lag
 * with the value this rank sent for `ans_phase`.
 */
#define AGGBOX_AGREE_NO_PHASE 0xffffffffu
/* Compare-and-swap attempts on min_key / max_key before a value is left to
 * the process (each failure is another CPU's successful write). */
#define AGGBOX_AGREE_TRIES 8

struct aggbox_agreectl {
	__u32 seq; /* armed agreement; 0: none, XDP passes every AGREE_VALUE up */
	__u32 phase; /* phase being folded; AGGBOX_AGREE_NO_PHASE while the process re-arms */
	__u32 last; /* the agreement's last phase */
	__u32 quorum; /* values that complete a phase (n - f), own included */
	__u32 count; /* distinct senders folded into `phase`, own included */
	__u32 notified; /* 0 -> 1 (CAS) when the quorum notice went up */
	__u32 inflight; /* XDP programs between their look at `phase` and the end of their fold */
	__u32 rank; /* this communicator's rank: the sender of answers */
	__u64 senders[AGGBOX_MAX_RANKS / 64]; /* who was folded into `phase` */
	__u64 min_key; /* ordered key of the smallest value folded */
	__u64 max_key; /* ordered key of the largest */
	__u32 ans_gen; /* odd while the process writes ans_*; XDP answers only on an even gen unchanged across its read */
	__u32 ans_phase;
	__u64 ans_value; /* f64 bits this rank sent for ans_phase */
	__u32 ans_incarnation;
	__u32 reserved;
};

struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(map_flags, BPF_F_MMAPABLE);
	__uint(max_entries, AGGBOX_CTL_SLOTS);
	__type(key, __u32);
	__type(value, struct aggbox_agreectl);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} ab_agree SEC(".maps");

/* Agreement counters of the host: ab_astats[stat], per CPU. */
enum aggbox_astat {
	AGGBOX_ASTAT_FOLDED = 0, /* values of the armed phase folded by XDP and dropped */
	AGGBOX_ASTAT_QUORUMS = 1, /* quorum notices passed up (one per phase) */
	AGGBOX_ASTAT_DUPLICATES = 2, /* values of a sender already folded into the phase, dropped */
	AGGBOX_ASTAT_AHEAD = 3, /* values of a later phase, passed up (the process jumps ahead) */
	AGGBOX_ASTAT_ANSWERED = 4, /* values of an earlier phase answered with XDP_TX */
	AGGBOX_ASTAT_STALE = 5, /* answers of an earlier phase, dropped */
	AGGBOX_ASTAT_CONTENDED = 6, /* values that lost too many min/max races, left to the process */
	AGGBOX_ASTAT_MALFORMED = 7, /* AGREE_VALUE shorter than header + body, dropped */
	AGGBOX_ASTAT_FORGED = 8, /* AGREE_QUORUM from the wire (only XDP makes them), dropped */
	AGGBOX_ASTAT_PASSED = 9, /* AGREE_VALUE passed up unchanged: not armed, re-arming, other agreement, no answer to give */
	AGGBOX_ASTAT_MAX = 10,
};

struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, AGGBOX_ASTAT_MAX);
	__type(key, __u32);
	__type(value, __u64);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} ab_astats SEC(".maps");

static __always_inline void aggbox_acount(enum aggbox_astat stat)
{
	aggbox_percpu_inc(&ab_astats, stat);
}

static __always_inline void aggbox_count(enum aggbox_prog prog, enum aggbox_stat stat)
{
	aggbox_percpu_inc(&ab_stats, (__u32)prog * AGGBOX_STAT_MAX + (__u32)stat);
}

#endif /* AGGBOX_MAPS_H */
