/* SPDX-License-Identifier: Apache-2.0 */
/*
 * Kernel folding of key-value reduce at a key's owner (docs/KV.md, "Kernel
 * datapath").
 *
 * The owner's process arms ab_kvctl[ctl] for an operation with a kernel
 * table of its own making: an open-addressing array of slots
 * (BPF_F_MMAPABLE, 2 x kernel_capacity slots, kept across operations) in
 * ab_kvarrs[ctl], or a BPF hash map of kernel_capacity entries in
 * ab_kvtabs[ctl] (AGGBOX_KV_TABLE=hash). For each KV_DATA of a group served here, the first program on
 * the interface (TC ingress on the TC hooks, XDP ingress on the XDP hooks:
 * one body, aggbox_kv_data, with two entry points) looks the batch up in
 * the mapper's window of batch numbers (ab_kvwin, kept across operations):
 * a batch folded before is answered with a KV_ACK sent back from the kernel
 * (its ack was lost), one being folded on another CPU is dropped, one
 * spilled before goes up again. A new batch of an operation not armed yet
 * (its mapper began first) is held off: dropped unacknowledged, so it comes
 * again and is folded here. A new batch of the armed operation is claimed
 * (compare-and-swap) and a bpf_loop over its pairs (aggbox_kv_fold_next)
 * folds them into the table: an atomic add on an existing key for SUM, a
 * compare-and-swap loop for MIN and MAX; a new key claims an empty slot
 * within AGGBOX_KV_PROBES (array; see aggbox_kv_fold_slot) or is inserted
 * with BPF_NOEXIST (hash; a second look when another CPU inserted the key
 * first). When every pair is folded the batch is counted for its mapper
 * (ab_kvcount) and turned into its KV_ACK, sent back (XDP_TX, or
 * bpf_redirect to the interface's egress from TC): no process runs. A pair
 * the kernel cannot fold (a key longer than AGGBOX_KV_KEY, the table full,
 * a NaN, a value a CAS loop could not settle) stops the fold: the batch
 * goes up to the socket flagged KV_SPILL with the number of pairs already
 * folded in the high half of `nchunks`, and the process folds the rest
 * (spill). A GSO super-packet of batches goes up to the process whole.
 */
#ifndef AGGBOX_KV_H
#define AGGBOX_KV_H

#include "aggbox_bcast.h"

/* Key bytes of the kernel table: longer keys spill. */
#define AGGBOX_KV_KEY 32
/* Batch numbers of one mapper's window (= kv::WINDOW, a power of 2). */
#define AGGBOX_KV_WINDOW 256
/* Bytes of a pair besides its key: u16 length, u64 value. */
#define AGGBOX_KV_PAIR 10
/* KV_DATA passed up by XDP: the first (nchunks >> 16) pairs are folded. */
#define AGGBOX_FLAG_KV_SPILL 0x0020
/* aggbox_kvctl.table: the kind of the armed operation's kernel table. */
#define AGGBOX_KVTAB_HASH 0
#define AGGBOX_KVTAB_ARRAY 1
/* Slots an array table's fold looks at for a key before the pair spills. */
#define AGGBOX_KV_PROBES 16
/* A slot's tag: 0 empty, BUSY while its key is written, else the key's
 * hash with the low 16 bits replaced by (length << 2 | 2). */
#define AGGBOX_KVSLOT_BUSY 1
/* A window slot is (batch << 32 | state). */
#define AGGBOX_KV_BUSY 1 /* being folded */
#define AGGBOX_KV_DONE 2 /* folded and counted */
#define AGGBOX_KV_SPILLED 3 /* + pairs folded: went up to user space */
/* Values of wire dtype (core/src/dtype.rs) and op (aggbox_op). */
#define AGGBOX_KV_I64 2
#define AGGBOX_KV_U64 4
#define AGGBOX_KV_F64 6
#define AGGBOX_KV_SUM 0
#define AGGBOX_KV_MIN 1
#define AGGBOX_KV_MAX 2
/* Attempts of a MIN/MAX compare-and-swap loop before the pair spills. */
#define AGGBOX_KV_CAS_TRIES 8

/* One communicator's key-value arming, written by its process. */
struct aggbox_kvctl {
	__u32 seq; /* the armed operation; 0: none */
	__u32 group; /* of the communicator (until it is written, its KV_DATA is held off) */
	__u32 rank; /* the communicator's rank: the sender of its acks */
	__u32 key_max; /* as in the header's nchunks */
	__u8 dtype; /* as in the header */
	__u8 op;
	__u8 fold; /* 1: fold pairs; 0: spill every batch at its first pair (f64 SUM) */
	__u8 table; /* AGGBOX_KVTAB_*: where the armed operation's pairs go */
	__u32 mask; /* AGGBOX_KVTAB_ARRAY: the table's slots - 1 (a power of 2) */
};

/* One slot of an open-addressing array table (BPF_F_MMAPABLE: the owner's
 * process reads and clears the slots in place at finish). The element after
 * the last slot (index mask + 1) is the table's header: `tag` counts the
 * keys claimed, `value` is the capacity (written by the process); a new key
 * beyond it spills, as a full hash map refuses it. */
struct aggbox_kvslot {
	__u64 tag; /* see AGGBOX_KVSLOT_BUSY */
	__u64 value;
	__u64 words[AGGBOX_KV_KEY / 8]; /* the key, zero-padded */
};

/* A key of the kernel table: its length and its bytes, zero-padded. */
struct aggbox_kvkey {
	__u32 len;
	__u8 bytes[AGGBOX_KV_KEY];
};

/* One mapper's window of batch numbers at one communicator. */
struct aggbox_kvwin {
	__u64 slot[AGGBOX_KV_WINDOW];
};

/* What XDP counted for one mapper in the armed operation (the process
 * zeroes it before arming). */
struct aggbox_kvcount {
	__u64 batches; /* batches folded whole and acknowledged by XDP */
	__u64 pairs; /* pairs folded (spilled batches' first pairs included) */
};

/* The fold of one batch, carried through its bpf_loop over the pairs
 * (per CPU: the keys are too big for the stack). */
struct aggbox_kv_scratch {
	__u32 ctl;
	__u32 win; /* index into ab_kvwin */
	__u32 batch;
	__u32 off; /* of the next pair in the packet */
	__u32 end; /* of the payload */
	__u32 i; /* pairs folded */
	__u32 count; /* pairs in the batch */
	__u32 key_max;
	__u8 dtype;
	__u8 op;
	__u8 table; /* AGGBOX_KVTAB_* */
	__u8 spill; /* 1: a pair could not be folded */
	__u32 mask; /* of an array table */
	struct aggbox_kvkey key;
	struct aggbox_kvslot cand; /* array table: the key in cand.words */
};

/* Key-value counters of the host: ab_kvstats[stat], per CPU. */
enum aggbox_kvstat {
	AGGBOX_KVSTAT_PAIRS = 0, /* pairs folded into a kernel table */
	AGGBOX_KVSTAT_BATCHES = 1, /* batches folded whole and acknowledged */
	AGGBOX_KVSTAT_SPILLED = 2, /* batches passed up with KV_SPILL */
	AGGBOX_KVSTAT_DUPLICATES = 3, /* repeats of a folded batch, acknowledged again */
	AGGBOX_KVSTAT_TO_USER = 4, /* KV_DATA left to user space (mismatched, odd) */
	AGGBOX_KVSTAT_ERRORS = 5, /* a fold loop that did not run (must stay 0) */
	AGGBOX_KVSTAT_HELD = 6, /* new batches of an operation not armed yet, dropped unacknowledged */
	AGGBOX_KVSTAT_MAX = 7,
};

/* The template of the tables in ab_kvtabs (the process makes each). */
struct aggbox_kv_table {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(map_flags, BPF_F_NO_PREALLOC);
	__uint(max_entries, 1);
	__type(key, struct aggbox_kvkey);
	__type(value, __u64);
};

struct {
	__uint(type, BPF_MAP_TYPE_ARRAY_OF_MAPS);
	__uint(max_entries, AGGBOX_CTL_SLOTS);
	__type(key, __u32);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
	__array(values, struct aggbox_kv_table);
} ab_kvtabs SEC(".maps");

/* The template of the tables in ab_kvarrs (any number of slots). */
struct aggbox_kv_array {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(map_flags, BPF_F_MMAPABLE | BPF_F_INNER_MAP);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, struct aggbox_kvslot);
};

struct {
	__uint(type, BPF_MAP_TYPE_ARRAY_OF_MAPS);
	__uint(max_entries, AGGBOX_CTL_SLOTS);
	__type(key, __u32);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
	__array(values, struct aggbox_kv_array);
} ab_kvarrs SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, AGGBOX_CTL_SLOTS);
	__type(key, __u32);
	__type(value, struct aggbox_kvctl);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} ab_kvctl SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, AGGBOX_CTL_SLOTS * AGGBOX_MAX_RANKS);
	__type(key, __u32);
	__type(value, struct aggbox_kvwin);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} ab_kvwin SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, AGGBOX_CTL_SLOTS * AGGBOX_MAX_RANKS);
	__type(key, __u32);
	__type(value, struct aggbox_kvcount);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} ab_kvcount SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, struct aggbox_kv_scratch);
} ab_kvscratch SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, AGGBOX_KVSTAT_MAX);
	__type(key, __u32);
	__type(value, __u64);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} ab_kvstats SEC(".maps");

static __always_inline void aggbox_kvcount_stat(enum aggbox_kvstat stat)
{
	aggbox_percpu_inc(&ab_kvstats, stat);
}

static __always_inline void aggbox_kvcount_pairs(__u32 n)
{
	__u32 idx = AGGBOX_KVSTAT_PAIRS;
	__u64 *value = bpf_map_lookup_elem(&ab_kvstats, &idx);

	if (value)
		*value += n;
}

/* The order of f64 bits as an unsigned integer (NaN excluded). */
static __always_inline __u64 aggbox_kv_f64_order(__u64 bits)
{
	return (bits >> 63) ? ~bits : bits | (1ULL << 63);
}

/* Whether `v` should replace `old` under MIN (`max` 0) or MAX (1). */
static __always_inline int aggbox_kv_better(__u8 dtype, int max, __u64 old, __u64 v)
{
	if (dtype == AGGBOX_KV_I64)
		return max ? (__s64)v > (__s64)old : (__s64)v < (__s64)old;
	if (dtype == AGGBOX_KV_F64) {
		old = aggbox_kv_f64_order(old);
		v = aggbox_kv_f64_order(v);
	}
	return max ? v > old : v < old;
}

/* Folds one pair into `table`; 0, or -1 when it must spill. */
static __always_inline int aggbox_kv_fold_pair(void *table, struct aggbox_kvkey *key, __u64 v, __u8 dtype, __u8 op)
{
	__u64 *cur, old;
	long err;
	int i, max = op == AGGBOX_KV_MAX;

	if (dtype == AGGBOX_KV_F64 && ((v >> 52) & 0x7ff) == 0x7ff && (v & 0xfffffffffffffULL))
		return -1; /* NaN: user space propagates it */
	cur = bpf_map_lookup_elem(table, key);
	if (!cur) {
		err = bpf_map_update_elem(table, key, &v, BPF_NOEXIST);
		if (err == 0)
			return 0;
		if (err != -17 /* EEXIST: another CPU inserted it first */)
			return -1; /* full */
		cur = bpf_map_lookup_elem(table, key);
		if (!cur)
			return -1;
	}
	if (op == AGGBOX_KV_SUM) {
		if (dtype == AGGBOX_KV_F64)
			return -1;
		__sync_fetch_and_add(cur, v);
		return 0;
	}
	for (i = 0; i < AGGBOX_KV_CAS_TRIES; i++) {
		old = *(volatile __u64 *)cur;
		if (!aggbox_kv_better(dtype, max, old, v))
			return 0;
		if (__sync_val_compare_and_swap(cur, old, v) == old)
			return 0;
	}
	return -1;
}

/* The slot hash of a zero-padded key of `len` bytes (any mix will do:
 * only XDP places keys; the process reads every slot). */
static __always_inline __u64 aggbox_kv_slot_hash(const __u64 *w, __u32 len)
{
	__u64 h = (__u64)len * 0x9E3779B97F4A7C15ULL;
	int i;

	for (i = 0; i < AGGBOX_KV_KEY / 8; i++) {
		h ^= w[i];
		h *= 0xBF58476D1CE4E5B9ULL;
		h ^= h >> 31;
	}
	return h;
}

/* Folds one pair into the open-addressing array `table` of `mask` + 1
 * slots: up to AGGBOX_KV_PROBES slots from the key's hash, linearly; an
 * empty one is claimed (compare-and-swap of its tag to BUSY), filled and
 * published (exchange of the tag: after the key and value); a slot with
 * the key's tag and words is folded as in aggbox_kv_fold_pair. 0, or -1
 * when it must spill (no slot within the probes, a slot another CPU is
 * filling, NaN, f64 SUM, a CAS loop that did not settle). */
static __always_inline int aggbox_kv_fold_slot(void *table, __u32 mask, const __u64 *w, __u32 len, __u64 v, __u8 dtype,
					       __u8 op)
{
	struct aggbox_kvslot *e, *head = 0;
	__u64 h, tag, t, old;
	__u32 idx, p, head_idx;
	int i, max = op == AGGBOX_KV_MAX;

	if (dtype == AGGBOX_KV_F64 && ((v >> 52) & 0x7ff) == 0x7ff && (v & 0xfffffffffffffULL))
		return -1; /* NaN: user space propagates it */
	if (op == AGGBOX_KV_SUM && dtype == AGGBOX_KV_F64)
		return -1;
	h = aggbox_kv_slot_hash(w, len);
	tag = (h & ~0xffffULL) | ((__u64)len << 2) | 2;
	for (p = 0; p < AGGBOX_KV_PROBES; p++) {
		idx = ((__u32)(h >> 32) + p) & mask;
		e = bpf_map_lookup_elem(table, &idx);
		if (!e)
			return -1;
		t = *(volatile __u64 *)&e->tag;
		if (t == 0) {
			if (!head) {
				head_idx = mask + 1;
				head = bpf_map_lookup_elem(table, &head_idx);
				if (!head)
					return -1;
			}
			if (__sync_fetch_and_add(&head->tag, 1) >= head->value)
				return -1; /* the capacity's worth of keys is in: full */
			if (__sync_val_compare_and_swap(&e->tag, 0, AGGBOX_KVSLOT_BUSY) != 0) {
				/* Another CPU claimed it first: give the count back. */
				__sync_fetch_and_add(&head->tag, -1);
			} else {
				e->words[0] = w[0];
				e->words[1] = w[1];
				e->words[2] = w[2];
				e->words[3] = w[3];
				e->value = v;
				__sync_lock_test_and_set(&e->tag, tag);
				return 0;
			}
			t = *(volatile __u64 *)&e->tag;
		}
		if (t == AGGBOX_KVSLOT_BUSY)
			return -1; /* another CPU fills it: perhaps with this key */
		if (t != tag || e->words[0] != w[0] || e->words[1] != w[1] || e->words[2] != w[2] || e->words[3] != w[3])
			continue;
		if (op == AGGBOX_KV_SUM) {
			__sync_fetch_and_add(&e->value, v);
			return 0;
		}
		for (i = 0; i < AGGBOX_KV_CAS_TRIES; i++) {
			old = *(volatile __u64 *)&e->value;
			if (!aggbox_kv_better(dtype, max, old, v))
				return 0;
			if (__sync_val_compare_and_swap(&e->value, old, v) == old)
				return 0;
		}
		return -1;
	}
	return -1;
}

/* Loads `len` bytes at `off` of the packet (an skb with `is_skb`, else an
 * XDP frame); `is_skb` is a constant at every call. */
static __always_inline long aggbox_kv_load(void *ctx, const int is_skb, __u32 off, void *to, __u32 len)
{
	return is_skb ? bpf_skb_load_bytes(ctx, off, to, len) : bpf_xdp_load_bytes(ctx, off, to, len);
}

/* What a bpf_loop over a batch's pairs carries. */
struct aggbox_kv_walk {
	void *ctx; /* the packet */
	struct aggbox_kv_scratch *s;
};

/*
 * Folds the batch's next pair (one bpf_loop step): 0 to go on, 1 to stop,
 * after the last pair or at one that must spill (s->spill set).
 */
static __always_inline long aggbox_kv_fold_next(struct aggbox_kv_walk *w, const int is_skb)
{
	struct aggbox_kv_scratch *s = w->s;
	void *table;
	__u64 value;
	__u32 len;
	__u16 klen;

	if (s->i >= s->count)
		return 1;
	if (aggbox_kv_load(w->ctx, is_skb, s->off, &klen, sizeof(klen)) ||
	    aggbox_kv_load(w->ctx, is_skb, s->off + 2, &value, sizeof(value)))
		goto spill;
	len = klen;
	if (len == 0 || len > AGGBOX_KV_KEY || s->off + AGGBOX_KV_PAIR + len > s->end)
		goto spill; /* a long key (or a malformed pair: user space says so) */
	if (s->table == AGGBOX_KVTAB_ARRAY) {
		table = bpf_map_lookup_elem(&ab_kvarrs, &s->ctl);
		if (!table)
			goto spill;
		s->cand.words[0] = 0;
		s->cand.words[1] = 0;
		s->cand.words[2] = 0;
		s->cand.words[3] = 0;
		barrier_var(len);
		if (len == 0 || len > AGGBOX_KV_KEY)
			goto spill;
		if (aggbox_kv_load(w->ctx, is_skb, s->off + AGGBOX_KV_PAIR, s->cand.words, len))
			goto spill;
		if (aggbox_kv_fold_slot(table, s->mask, s->cand.words, len, value, s->dtype, s->op))
			goto spill;
	} else {
		table = bpf_map_lookup_elem(&ab_kvtabs, &s->ctl);
		if (!table)
			goto spill;
		__builtin_memset(&s->key, 0, sizeof(s->key));
		s->key.len = len;
		barrier_var(len);
		if (len == 0 || len > AGGBOX_KV_KEY)
			goto spill;
		if (aggbox_kv_load(w->ctx, is_skb, s->off + AGGBOX_KV_PAIR, s->key.bytes, len))
			goto spill;
		if (aggbox_kv_fold_pair(table, &s->key, value, s->dtype, s->op))
			goto spill;
	}
	s->off += AGGBOX_KV_PAIR + len;
	s->i++;
	return 0;
spill:
	s->spill = 1;
	return 1;
}

static long aggbox_xdp_kv_pair(__u32 i, void *walk)
{
	return aggbox_kv_fold_next(walk, 0);
}

static long aggbox_tc_kv_pair(__u32 i, void *walk)
{
	return aggbox_kv_fold_next(walk, 1);
}

/* What the kernel does with a KV_DATA (aggbox_kv_data). */
enum aggbox_kv_verdict {
	AGGBOX_KV_TO_USER, /* up to the process unchanged */
	AGGBOX_KV_DROP, /* held off or being folded elsewhere: it comes again */
	AGGBOX_KV_ACK, /* folded (now or before): answer it with its KV_ACK */
	AGGBOX_KV_SPILL, /* up flagged KV_SPILL, `folded` pairs folded */
};

/* What the verdict needs besides the packet. */
struct aggbox_kv_out {
	__u32 payload_len; /* the batch's pairs, bytes */
	__u32 rank; /* the sender of the ack */
	__u32 key_max;
	__u32 folded; /* pairs folded of a spilled batch */
};

/*
 * A KV_DATA of a group served here, the same for XDP and TC: answer a
 * repeat, fold a new batch of the armed operation, else leave it to the
 * process. Counts what it decided.
 */
static __always_inline enum aggbox_kv_verdict aggbox_kv_data(void *ctx, const int is_skb, struct aggbox_pkt *pkt,
							     struct aggbox_kv_out *out)
{
	struct aggbox_hdr *hdr = pkt->hdr;
	struct aggbox_kv_scratch *s;
	struct aggbox_kvcount *count;
	struct aggbox_kv_walk walk;
	struct aggbox_kvctl *kc;
	struct aggbox_kvwin *win;
	__u32 ctl_idx = pkt->ctl, zero = 0, win_idx, b = hdr->chunk, cb, st;
	__u64 cur, *slot;
	long loops;

	if (pkt->ip->ihl != 5 || (hdr->flags & AGGBOX_FLAG_KV_SPILL) || hdr->sender >= AGGBOX_MAX_RANKS)
		goto to_user;
	kc = bpf_map_lookup_elem(&ab_kvctl, &ctl_idx);
	if (!kc)
		goto to_user;
	if (kc->group != hdr->group || kc->group == 0) {
		/* The port is this group's (aggbox_classify checked), so its
		 * process has not opened key-value reduce here yet: hold the
		 * batch off unacknowledged; it comes again. */
		aggbox_kvcount_stat(AGGBOX_KVSTAT_HELD);
		return AGGBOX_KV_DROP;
	}
	if (kc->seq != 0 && hdr->seq == kc->seq &&
	    (hdr->dtype != kc->dtype || hdr->op != kc->op || hdr->nchunks != kc->key_max))
		goto to_user; /* the process fails the call as mismatched */
	out->payload_len = bpf_ntohs(pkt->udp->len) - sizeof(struct udphdr) - sizeof(*hdr);
	out->rank = kc->rank;
	out->key_max = kc->key_max;
	out->folded = 0;
	win_idx = ctl_idx * AGGBOX_MAX_RANKS + hdr->sender;
	win = bpf_map_lookup_elem(&ab_kvwin, &win_idx);
	if (!win)
		goto to_user;
	slot = &win->slot[b & (AGGBOX_KV_WINDOW - 1)];
	cur = *(volatile __u64 *)slot;
	cb = cur >> 32;
	st = (__u32)cur;
	if (cur != 0 && cb == b) {
		if (st == AGGBOX_KV_DONE) {
			aggbox_kvcount_stat(AGGBOX_KVSTAT_DUPLICATES);
			return AGGBOX_KV_ACK;
		}
		if (st == AGGBOX_KV_BUSY)
			return AGGBOX_KV_DROP; /* another CPU folds it; it comes again */
		out->folded = st - AGGBOX_KV_SPILLED;
		return AGGBOX_KV_SPILL;
	}
	if (cur != 0 && (__s32)(b - cb) < 0) {
		/* Older than the batch that took its slot: that one was sent
		 * only after this one was acknowledged, so it was counted. */
		aggbox_kvcount_stat(AGGBOX_KVSTAT_DUPLICATES);
		return AGGBOX_KV_ACK;
	}
	if (kc->seq == 0 || hdr->seq != kc->seq) {
		/* A new batch of an operation not armed here (yet): its
		 * mapper began first. Held off unacknowledged, the window
		 * untouched; the mapper sends it again and, armed by then,
		 * the kernel folds it. */
		aggbox_kvcount_stat(AGGBOX_KVSTAT_HELD);
		return AGGBOX_KV_DROP;
	}
	if (__sync_val_compare_and_swap(slot, cur, ((__u64)b << 32) | AGGBOX_KV_BUSY) != cur)
		return AGGBOX_KV_DROP; /* claimed meanwhile by another CPU */
	s = bpf_map_lookup_elem(&ab_kvscratch, &zero);
	if (!s || !kc->fold) {
		/* No scratch (cannot happen), or f64 SUM: every pair spills. */
		*(volatile __u64 *)slot = ((__u64)b << 32) | AGGBOX_KV_SPILLED;
		return AGGBOX_KV_SPILL;
	}
	s->ctl = ctl_idx;
	s->win = win_idx;
	s->batch = b;
	s->off = AGGBOX_OFF_PAYLOAD;
	s->end = AGGBOX_OFF_PAYLOAD + out->payload_len;
	s->i = 0;
	s->count = hdr->count;
	s->key_max = kc->key_max;
	s->dtype = kc->dtype;
	s->op = kc->op;
	s->table = kc->table;
	s->spill = 0;
	s->mask = kc->mask;
	walk.ctx = ctx;
	walk.s = s;
	/* At most one pair per AGGBOX_KV_PAIR + 1 bytes: a count beyond that
	 * is malformed, and stops at the first pair past the end. */
	loops = bpf_loop(s->count < out->payload_len ? s->count : out->payload_len,
			 is_skb ? aggbox_tc_kv_pair : aggbox_xdp_kv_pair, &walk, 0);
	if (loops < 0)
		aggbox_kvcount_stat(AGGBOX_KVSTAT_ERRORS);
	/* pkt's pointers are invalid from here on. */
	count = bpf_map_lookup_elem(&ab_kvcount, &win_idx);
	if (loops < 0 || s->spill || s->i < s->count || s->off != s->end) {
		/* A pair it could not fold, or bytes after the last pair (user
		 * space says so): the process folds the rest. */
		if (count && s->i)
			__sync_fetch_and_add(&count->pairs, s->i);
		aggbox_kvcount_pairs(s->i);
		out->folded = s->i;
		*(volatile __u64 *)slot = ((__u64)b << 32) | (AGGBOX_KV_SPILLED + s->i);
		return AGGBOX_KV_SPILL;
	}
	if (count) {
		__sync_fetch_and_add(&count->pairs, s->i);
		__sync_fetch_and_add(&count->batches, 1);
	}
	aggbox_kvcount_pairs(s->i);
	aggbox_kvcount_stat(AGGBOX_KVSTAT_BATCHES);
	*(volatile __u64 *)slot = ((__u64)b << 32) | AGGBOX_KV_DONE;
	return AGGBOX_KV_ACK;

to_user:
	aggbox_kvcount_stat(AGGBOX_KVSTAT_TO_USER);
	return AGGBOX_KV_TO_USER;
}

/* Writes the KV_ACK fields over a batch's header (already cut to it). */
static __always_inline void aggbox_kv_make_ack(struct aggbox_hdr *hdr, __u32 rank)
{
	hdr->kind = AGGBOX_KIND_KV_ACK;
	hdr->sender = rank;
	hdr->flags = 0;
	hdr->count = 0;
}

/* Flags the batch in [data, data_end) KV_SPILL with `folded` pairs folded
 * (its UDP checksum, which covers the header, becomes none). Returns -1
 * when the header is not within the packet. */
static __always_inline int aggbox_kv_mark_spill(void *data, void *data_end, __u32 key_max, __u32 folded)
{
	struct aggbox_hdr *hdr = data + AGGBOX_OFF_UDP + sizeof(struct udphdr);

	if ((void *)(hdr + 1) > data_end)
		return -1;
	((struct udphdr *)(data + AGGBOX_OFF_UDP))->check = 0;
	hdr->flags |= AGGBOX_FLAG_KV_SPILL;
	hdr->nchunks = (key_max & 0xffff) | (folded << 16);
	aggbox_kvcount_stat(AGGBOX_KVSTAT_SPILLED);
	return 0;
}

/* XDP ingress, a KV_DATA of a communicator with a control slot. */
static __always_inline int aggbox_xdp_kv_data(struct xdp_md *ctx, struct aggbox_pkt *pkt)
{
	struct aggbox_kv_out out = {};
	struct aggbox_hdr *hdr;

	switch (aggbox_kv_data(ctx, 0, pkt, &out)) {
	case AGGBOX_KV_DROP:
		return XDP_DROP;
	case AGGBOX_KV_ACK:
		hdr = aggbox_xdp_strip(ctx, out.payload_len);
		if (!hdr)
			return XDP_DROP;
		aggbox_kv_make_ack(hdr, out.rank);
		return aggbox_xdp_bounce(ctx);
	case AGGBOX_KV_SPILL:
		if (aggbox_kv_mark_spill((void *)(long)ctx->data, (void *)(long)ctx->data_end, out.key_max, out.folded))
			return XDP_DROP;
		return XDP_PASS;
	case AGGBOX_KV_TO_USER:
	default:
		return XDP_PASS;
	}
}

/* TC ingress on the TC hooks, the same for one datagram: the ack goes back
 * out of the interface from here (bpf_redirect). A GSO super-packet of
 * batches goes up whole: the process folds it. */
static __always_inline int aggbox_tc_kv_data(struct __sk_buff *skb, struct aggbox_pkt *pkt)
{
	struct aggbox_kv_out out = {};
	struct aggbox_hdr *hdr;

	if (skb->gso_segs > 1) {
		aggbox_kvcount_stat(AGGBOX_KVSTAT_TO_USER);
		return TC_ACT_OK;
	}
	switch (aggbox_kv_data(skb, 1, pkt, &out)) {
	case AGGBOX_KV_DROP:
		return TC_ACT_SHOT;
	case AGGBOX_KV_ACK:
		hdr = aggbox_tc_strip(skb);
		if (!hdr)
			return TC_ACT_SHOT; /* a loss: the mapper sends it again */
		aggbox_kv_make_ack(hdr, out.rank);
		if (aggbox_tc_swap(skb))
			return TC_ACT_SHOT;
		return bpf_redirect(skb->ifindex, 0);
	case AGGBOX_KV_SPILL:
		if (aggbox_kv_mark_spill(aggbox_skb_data(skb), aggbox_skb_data_end(skb), out.key_max, out.folded))
			return TC_ACT_SHOT;
		return TC_ACT_OK;
	case AGGBOX_KV_TO_USER:
	default:
		return TC_ACT_OK;
	}
}

#endif /* AGGBOX_KV_H */
