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
#define AGGBOX_MAX_GROUPS 1024
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
 * A reduction this communicator owns chunks of, armed by the process
 * (seq 0: none) when the owners' sums are integer lane additions
 * (docs/ALLREDUCE.md, "Kernel datapath"): the current one, and the next
 * one armed ahead with the parameters of the one before (a training loop
 * repeats its calls). XDP folds a RED_DATA only when every field matches
 * its header, into the slot the process prepared.
 */
struct aggbox_redctl {
	__u32 seq;
	__u32 nchunks;
	__u32 count; /* elements of the whole vector, as in the header */
	__u8 dtype; /* the header's dtype */
	__u8 op; /* the header's op byte (collective, QUANTIZED, operator) */
	__u8 lane; /* bytes of an integer lane: 4 or 8 */
	__u8 reserved;
	__u32 ranks; /* contributions a chunk needs, the owner's own included */
	__u32 base; /* this rank's first chunk */
	__u32 stride; /* chunks between two of its chunks: owned index = (chunk - base) / stride */
	__u32 chunk_bytes; /* bytes of a chunk */
	__u32 last_bytes; /* bytes of the short chunk, owned index owned_last (if this rank owns it) */
	__u32 owned_last;
};

/* Reductions in flight at an owner: red[seq % 2], and that phase's slots. */
#define AGGBOX_RED_PHASES 2

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

/* Broadcast counters of the host: ab_bstats[stat], per CPU. */
enum aggbox_bstat {
	AGGBOX_BSTAT_CLONED = 0, /* TC egress: copies of FANOUT chunks sent, the original included (size - 1 each) */
	AGGBOX_BSTAT_PLACED = 1, /* XDP: chunks copied into a receive window */
	AGGBOX_BSTAT_ACKS_SENT = 2, /* XDP: ACKs sent back with XDP_TX */
	AGGBOX_BSTAT_DUPLICATES = 3, /* XDP: chunks or ACKs that repeated one already counted */
	AGGBOX_BSTAT_ACKS_FOLDED = 4, /* XDP: ACKs folded into a send window and dropped */
	AGGBOX_BSTAT_GROUP_ACKS = 5, /* XDP: group-ACKs passed up to a root */
	AGGBOX_BSTAT_LANDED = 6, /* XDP: landed notices passed up to a receiver */
	AGGBOX_BSTAT_TO_USER = 7, /* XDP: broadcast datagrams left to user space (unarmed, stale, odd) */
	AGGBOX_BSTAT_MAX = 8,
};

struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, AGGBOX_BSTAT_MAX);
	__type(key, __u32);
	__type(value, __u64);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} ab_bstats SEC(".maps");

static __always_inline void aggbox_bcount(enum aggbox_bstat stat)
{
	__u32 idx = stat;
	__u64 *value = bpf_map_lookup_elem(&ab_bstats, &idx);

	if (value)
		*value += 1;
}

static __always_inline void aggbox_count(enum aggbox_prog prog, enum aggbox_stat stat)
{
	__u32 idx = (__u32)prog * AGGBOX_STAT_MAX + (__u32)stat;
	__u64 *value = bpf_map_lookup_elem(&ab_stats, &idx);

	if (value)
		*value += 1; /* per-CPU slot: no other CPU writes it */
}

#endif /* AGGBOX_MAPS_H */
