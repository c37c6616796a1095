/* SPDX-License-Identifier: Apache-2.0 */
/*
 * AggBox wire format: the single definition.
 *
 * Every AggBox datagram is IPv4/UDP to a port that a communicator registered
 * (the `ports` map), and its UDP payload starts with `struct aggbox_hdr`,
 * followed by `count` elements of `dtype` (or a kind-specific body).
 *
 * All multi-byte fields are little-endian: AggBox runs on little-endian hosts
 * and the kernel adds payload integers in place, so there is no byte swapping
 * anywhere (Gloo and NCCL send host order too). The Rust mirror lives in
 * core/src/wire.rs and a test checks that its size and offsets match these.
 * docs/PROTOCOL.md explains each field and each kind.
 */
#ifndef AGGBOX_WIRE_H
#define AGGBOX_WIRE_H

#include <linux/types.h>

/* "AGBX" read as a little-endian u32. */
#define AGGBOX_MAGIC 0x58424741u
#define AGGBOX_VERSION 1

/* What a datagram is. Values are stable on the wire. */
enum aggbox_kind {
	AGGBOX_KIND_BARRIER_ARRIVE = 1, /* rank -> rank 0: "I reached barrier `seq`" */
	AGGBOX_KIND_BARRIER_RELEASE = 2, /* rank 0 -> rank: "barrier `seq` is complete" */
	AGGBOX_KIND_CLOSE = 3, /* rank -> rank 0: "I am done with every operation" */
	AGGBOX_KIND_CLOSE_ACK = 4, /* rank 0 -> rank: "got your CLOSE; leave" */
	AGGBOX_KIND_BARRIER_ABORT = 5, /* rank 0 -> rank: "barrier `seq` failed: rank `count` is gone" */
	AGGBOX_KIND_BCAST_DATA = 6, /* root -> receiver: chunk `chunk` of broadcast `seq` */
	AGGBOX_KIND_BCAST_ACK = 7, /* receiver -> root: "I hold chunk `chunk` of `seq`" */
	AGGBOX_KIND_BCAST_ABORT = 8, /* any -> any: "broadcast `seq` failed: rank `count`" */
	AGGBOX_KIND_BCAST_LANDED = 9, /* XDP -> its own host's socket: chunks landed in the window */
	/* Reductions (allreduce, reduce, reduce-scatter, allgather; docs/ALLREDUCE.md).
	 * `op` is (collective << 4 | reduce op), `count` the operation's elements. */
	AGGBOX_KIND_RED_DATA = 10, /* rank -> owner: its contribution to chunk `chunk` of `seq` */
	AGGBOX_KIND_RED_RESULT = 11, /* owner -> rank: the result of chunk `chunk` of `seq` */
	AGGBOX_KIND_RED_DONE = 12, /* owner -> contributor: "chunk `chunk` of `seq` is complete" */
	AGGBOX_KIND_RED_ABORT = 13, /* any -> any: "reduction `seq` failed: rank `count`" */
	AGGBOX_KIND_RED_SUM = 14, /* XDP -> its own host's socket: "owned chunk `chunk` of `seq` is summed" */
	AGGBOX_KIND_RED_LANDED = 15, /* XDP/TC -> its own host's socket: "`count` chunks of `seq` landed" */
	AGGBOX_KIND_BARRIER_DONE = 16, /* TC -> rank 0's socket: "barrier `seq` is complete, its releases are out" */
	AGGBOX_KIND_MAX = 17, /* first unused value */
};

/* Key-value reduce (docs/KV.md), a range of its own so the kinds above may
 * grow: a kind is valid when it is in [1, AGGBOX_KIND_MAX) or in
 * [AGGBOX_KIND_KV_FIRST, AGGBOX_KIND_KV_MAX). `seq` is the operation,
 * `chunk` the batch number (per mapper and owner, across operations),
 * `nchunks` the configured key maximum, `dtype`/`op` the values'. */
enum aggbox_kv_kind {
	AGGBOX_KIND_KV_FIRST = 20,
	AGGBOX_KIND_KV_DATA = 20, /* mapper -> owner: batch `chunk` of `count` pairs */
	AGGBOX_KIND_KV_ACK = 21, /* owner -> mapper: "batch `chunk` is counted" */
	AGGBOX_KIND_KV_FIN = 22, /* mapper -> owner: "I sent you `count` batches in `seq`" */
	AGGBOX_KIND_KV_FIN_ACK = 23, /* owner -> mapper: "I counted all of them" */
	AGGBOX_KIND_KV_ABORT = 24, /* any -> any: "key-value reduce `seq` failed: rank `count`" */
	AGGBOX_KIND_KV_MAX = 25, /* first unused value of the range */
};

/* Approximate agreement (docs/AGREEMENT.md), a range of its own. `seq` is
 * the agreement, `chunk` the phase, `nchunks` its last phase, and the body
 * is a struct aggbox_agree_body. */
enum aggbox_agree_kind {
	AGGBOX_KIND_AGREE_FIRST = 30,
	AGGBOX_KIND_AGREE_VALUE = 30, /* rank -> rank: "my value of phase `chunk` is the body's" */
	AGGBOX_KIND_AGREE_QUORUM = 31, /* XDP -> its own host's socket: phase `chunk` has its quorum */
	AGGBOX_KIND_AGREE_MAX = 32, /* first unused value of the range */
};

/* The body of AGREE_VALUE (and AGREE_QUORUM) after the header (16 bytes). */
struct aggbox_agree_body {
	__u64 value; /* the f64's bits, little-endian */
	__u32 incarnation; /* the sender's start counter (its store's counter) */
	__u32 reserved; /* 0 */
};

#define AGGBOX_AGREE_BODY_LEN 16

/* Header flags. */
#define AGGBOX_FLAG_RETRANSMIT 0x0001 /* this datagram repeats an earlier one */
#define AGGBOX_FLAG_FANOUT 0x0002 /* BCAST_DATA, AGREE_VALUE: TC egress clones it to every member;
				     * RED_RESULT: XDP made it, TC ingress sends it to every member */
#define AGGBOX_FLAG_GROUP 0x0004 /* BCAST_ACK: every receiver holds chunks [0, chunk) */
#define AGGBOX_FLAG_MISMATCH 0x0008 /* BCAST_ABORT: the ranks' calls disagree */
#define AGGBOX_FLAG_ANSWERED 0x0010 /* BCAST_LANDED: the kernel sent this chunk's ACK already;
				       * BARRIER_DONE: it sent every member the release */
#define AGGBOX_FLAG_NOTIFY 0x0020 /* RED_RESULT from XDP: after the fan-out, it goes up as RED_LANDED */
#define AGGBOX_FLAG_ANSWER 0x0040 /* AGREE_VALUE: an answer to a rank that lags behind */
#define AGGBOX_FLAG_RANGE 0x0080 /* BCAST_ACK: it acknowledges chunks [chunk, chunk + count) (a super-chunk) */

/* The fixed header at the start of every AggBox UDP payload (40 bytes). */
struct aggbox_hdr {
	__u32 magic; /* AGGBOX_MAGIC */
	__u8 version; /* AGGBOX_VERSION */
	__u8 kind; /* enum aggbox_kind */
	__u16 flags; /* AGGBOX_FLAG_* */
	__u32 group; /* group id, chosen at rendezvous */
	__u16 sender; /* rank of the sender in the group */
	__u8 dtype; /* element type of the payload (aggbox_dtype) */
	__u8 op; /* reduction op (aggbox_op) */
	__u64 token; /* random group token, chosen at rendezvous */
	__u32 seq; /* operation sequence number within the group */
	__u32 chunk; /* chunk index within the operation */
	__u32 nchunks; /* number of chunks of the operation */
	__u32 count; /* elements of dtype in this datagram */
};

#define AGGBOX_HDR_LEN 40

/* Most ranks a group may have: the sender field and member bitmaps size. */
#define AGGBOX_MAX_RANKS 256

/* Largest chunk payload: what a window slot of the kernel datapath holds. */
#define AGGBOX_CHUNK_MAX 4032

#endif /* AGGBOX_WIRE_H */
