/* SPDX-License-Identifier: Apache-2.0 */
/*
 * The kernel datapath of the reductions (docs/ALLREDUCE.md, "Kernel
 * datapath").
 *
 * Owners' folds. The owner's process arms its control block's
 * `red[seq % 2]` for one reduction whose lanes XDP can combine (integer
 * SUM, MIN and MAX; quantized float SUM/AVG) and prepares one slot of
 * ab_redwin per owned chunk in flight: tag, its own contribution as the
 * start, its own bit, a count of 1. It also arms the next reduction ahead,
 * with the parameters of the one before it (the same phase), its first
 * slots set to the fold's identity and tagged AGGBOX_RED_AHEAD: XDP folds
 * early contributions there, and the process adds its own when it makes
 * the call. For each RED_DATA of that reduction to a prepared slot, XDP
 * ingress (aggbox_xdp_red_data) claims the sender's bit, copies the payload
 * into a per-CPU scratch buffer and tail-calls the fold stage. Each run of
 * aggbox_xdp_red_fold combines AGGBOX_RED_SEG lanes into the slot (atomic
 * adds, or compare-and-swap loops for MIN/MAX) and tail-calls itself for
 * the next segment; the last one counts the contribution.
 *
 * Results. For an allreduce (`fanout`), the contribution that completes a
 * chunk becomes its result: XDP writes the slot's lanes into it and passes
 * it up as a FANOUT RED_RESULT, and TC ingress (aggbox_result.h) sends a
 * copy to every other member. At each member XDP places the result in the
 * result window (aggbox_xdp_red_result). Both count in `landed`; the one
 * that reaches the target (and one per `notify` on the way) goes up as a
 * RED_LANDED notice: the process's one wake-up, after which it reads
 * sums and results from the mapped slots. A repeat of a contribution to a
 * completed chunk (its sender lost the result) is answered by XDP_TX with
 * the result. For the other collectives the completing contribution
 * becomes a header-only RED_SUM notice, and the owner's process sends the
 * results. Every other contribution is dropped: none reaches the socket.
 */
#ifndef AGGBOX_REDUCE_H
#define AGGBOX_REDUCE_H

#include "aggbox_bcast.h"

/* Owned chunks in flight per communicator and phase:
 * slot = (ctl * PHASES + seq % PHASES) * SLOTS + owned % SLOTS. */
#define AGGBOX_RED_SLOTS 256
/* The chunk part of the tag of a slot armed ahead: the first contribution
 * names its chunk (no real chunk has this index). */
#define AGGBOX_RED_AHEAD 0xffffffffu
/* Lanes one run of the fold stage combines (one tail call per segment). */
#ifndef AGGBOX_RED_SEG
#define AGGBOX_RED_SEG 128
#endif
/* Tail-call targets in ab_redprogs. */
#define AGGBOX_REDPROG_FOLD 0
#define AGGBOX_REDPROG_MAX 1
/* Compare-and-swap attempts per lane of a MIN/MAX fold before the
 * contribution is left to the process (each failure is another CPU's
 * successful write to that lane). */
#define AGGBOX_RED_TRIES 4

/* A slot's `done` once complete: who sends the chunk's results. */
#define AGGBOX_RED_DONE_KERNEL 1 /* the kernel (its fan-out), or it told the process with a RED_SUM */
#define AGGBOX_RED_DONE_PROCESS 2 /* the process, which finds it so in the slot (TC hooks) */

/* One owned chunk being summed. */
struct aggbox_redslot {
	__u64 tag; /* (seq << 32 | chunk) it sums; 0: not prepared */
	__u64 bits[AGGBOX_RANK_WORDS]; /* contributors folded (the owner's own included) */
	__u32 count; /* contributors folded */
	__u32 done; /* AGGBOX_RED_DONE_* once complete, else 0 */
	/* CPUs between their tag check and the end of their fold: the process
	 * waits for 0 (after untagging) before it reuses the slot. */
	__u32 inflight;
	__u32 reserved;
	__u64 acc[AGGBOX_CHUNK_MAX / 8]; /* the sum, in little-endian lanes of red.lane bytes */
};

/* The fold stage's state, carried across its tail calls. */
struct aggbox_red_scratch {
	__u32 slot; /* index into ab_redwin */
	__u32 ctl;
	__u32 phase; /* of the reduction: ctl->red[phase] */
	__u32 seq; /* of the reduction */
	__u32 fold; /* AGGBOX_FOLD_* */
	__u32 sender; /* the contributor */
	__u32 contended; /* a MIN/MAX lane lost AGGBOX_RED_TRIES races */
	__u32 reserved;
	__u32 lanes; /* lanes in this payload */
	__u32 next; /* first lane not added yet */
	__u32 lane; /* bytes of a lane: 4 or 8 */
	__u32 len; /* payload bytes */
	__u64 data[AGGBOX_CHUNK_MAX / 8];
};

struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(map_flags, BPF_F_MMAPABLE);
	__uint(max_entries, AGGBOX_CTL_SLOTS * AGGBOX_RED_PHASES * AGGBOX_RED_SLOTS);
	__type(key, __u32);
	__type(value, struct aggbox_redslot);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} ab_redwin SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, struct aggbox_red_scratch);
} ab_redscratch SEC(".maps");

#ifdef AGGBOX_RED_LOCK
/*
 * The ADD fold takes a per-slot spin lock and adds plainly under it,
 * instead of atomic adds (XDP ingress and TC ingress define
 * AGGBOX_RED_LOCK; build.rs builds an atomic-add XDP variant for `aggbox
 * bench fold`). Spin locks may not live in mmapable maps, so they sit in a
 * plain array indexed like ab_redwin (one per object: on a host only one
 * of the two folds).
 */
struct aggbox_redlock {
	struct bpf_spin_lock lock;
};

struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, AGGBOX_CTL_SLOTS * AGGBOX_RED_PHASES * AGGBOX_RED_SLOTS);
	__type(key, __u32);
	__type(value, struct aggbox_redlock);
} ab_redlock SEC(".maps");
#endif

struct {
	__uint(type, BPF_MAP_TYPE_PROG_ARRAY);
	__uint(max_entries, AGGBOX_REDPROG_MAX);
	__type(key, __u32);
	__type(value, __u32);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} ab_redprogs SEC(".maps");

/* The AggBox header of the frame in ctx, re-derived after a helper changed
 * the packet (and its UDP header in *udp), or NULL. */
static __always_inline struct aggbox_hdr *aggbox_xdp_hdr(struct xdp_md *ctx, struct udphdr **udp)
{
	void *data = (void *)(long)ctx->data;
	void *data_end = (void *)(long)ctx->data_end;
	struct aggbox_hdr *hdr = data + AGGBOX_OFF_UDP + sizeof(struct udphdr);

	*udp = data + AGGBOX_OFF_UDP;
	return (void *)(hdr + 1) > data_end ? NULL : hdr;
}

/* Writes the `len` result bytes of `slot` over this datagram's payload (the
 * same length: a contribution to the slot's chunk) and makes it a RED_RESULT
 * with `flags` and sender `rank`, its UDP checksum 0 (none). Returns 0, or -1
 * when it could not (the datagram is then unchanged or to be dropped). */
static __always_inline int aggbox_xdp_make_result(struct xdp_md *ctx, struct aggbox_redslot *slot, __u32 len,
						   __u32 rank, __u16 flags)
{
	struct aggbox_hdr *hdr;
	struct udphdr *udp;

	barrier_var(len);
	if (len == 0 || len > AGGBOX_CHUNK_MAX || bpf_xdp_store_bytes(ctx, AGGBOX_OFF_PAYLOAD, slot->acc, len))
		return -1;
	hdr = aggbox_xdp_hdr(ctx, &udp);
	if (!hdr)
		return -1;
	hdr->kind = AGGBOX_KIND_RED_RESULT;
	hdr->flags = flags;
	hdr->sender = rank;
	udp->check = 0;
	return 0;
}

/* The owner of chunk `chunk` of reduction `red`. */
static __always_inline __u32 aggbox_red_owner(struct aggbox_redctl *red, __u32 chunk)
{
	return red->run && red->ranks ? chunk / red->run % red->ranks : 0;
}

/* The index of chunk `chunk` among its owner's chunks in reduction `red`
 * (run checked non-zero). */
static __always_inline __u32 aggbox_red_owned(struct aggbox_redctl *red, __u32 chunk)
{
	return red->ranks ? chunk / red->run / red->ranks * red->run + chunk % red->run : 0;
}

/* Whether rank `rank` gets the result of a chunk it does not own in
 * reduction `red` of collective `coll` (else a DONE). */
static __always_inline int aggbox_red_recipient(struct aggbox_redctl *red, __u32 coll, __u32 rank)
{
	return coll == AGGBOX_COLL_ALLREDUCE || (coll == AGGBOX_COLL_REDUCE && rank == red->root);
}

/* Counts one chunk landed in reduction `red` (an owned sum XDP completed or a
 * result it placed); returns whether the process must be told now: at its
 * target (once), and every `notify` chunks on the way. */
static __always_inline int aggbox_red_landed(struct aggbox_redctl *red)
{
	__u32 landed;

	return aggbox_count_landed(&red->landed, &red->target, &red->notified, red->notify, &landed);
}

/*
 * XDP ingress, a RED_DATA of a group served here: fold it in the kernel when
 * the owner armed this reduction and prepared the chunk's slot; otherwise
 * pass it up unchanged.
 */
static __always_inline int aggbox_xdp_red_data(struct xdp_md *ctx, struct aggbox_pkt *pkt)
{
	struct aggbox_hdr *hdr = pkt->hdr;
	struct aggbox_red_scratch *s;
	struct aggbox_redslot *slot;
	struct aggbox_ctl *ctl;
	struct aggbox_redctl *red;
	__u32 ctl_idx = pkt->ctl, zero = 0, chunk = hdr->chunk, phase = hdr->seq & (AGGBOX_RED_PHASES - 1);
	__u32 len, want, owned, slot_idx, word;
	__u64 bit, old, tag;
	__u16 sender = hdr->sender;

	ctl = bpf_map_lookup_elem(&ab_ctl, &ctl_idx);
	if (!ctl || pkt->ip->ihl != 5)
		goto to_user;
	red = &ctl->red[phase];
	if (red->seq == 0 || hdr->seq != red->seq || hdr->nchunks != red->nchunks || hdr->count != red->count ||
	    hdr->dtype != red->dtype || hdr->op != red->op || chunk >= red->nchunks || red->run == 0 ||
	    (red->lane != 4 && red->lane != 8) || red->ranks == 0 || red->fold > AGGBOX_FOLD_MAX_U)
		goto to_user;
	if (aggbox_red_owner(red, chunk) != red->rank)
		goto to_user; /* not this rank's chunk: user space says so */
	owned = aggbox_red_owned(red, chunk);
	len = bpf_ntohs(pkt->udp->len) - sizeof(struct udphdr) - sizeof(*hdr);
	want = owned == red->owned_last ? red->last_bytes : red->chunk_bytes;
	if (len != want || len == 0 || len > AGGBOX_CHUNK_MAX || len % red->lane)
		goto to_user;
	slot_idx = (ctl_idx * AGGBOX_RED_PHASES + phase) * AGGBOX_RED_SLOTS + (owned & (AGGBOX_RED_SLOTS - 1));
	slot = bpf_map_lookup_elem(&ab_redwin, &slot_idx);
	if (!slot)
		goto to_user;
	tag = aggbox_tag(hdr->seq, chunk);
	if (slot->tag != tag) {
		/* Armed ahead (the fold's identity, before the owner's call): the
		 * first contribution names the chunk. */
		if (owned < AGGBOX_RED_SLOTS)
			__sync_val_compare_and_swap(&slot->tag, aggbox_tag(hdr->seq, AGGBOX_RED_AHEAD), tag);
		if (slot->tag != tag)
			goto to_user;
	}
	/* Announce this fold, then look at the tag again: the process untags a
	 * slot before it waits for inflight to drop to 0 and reuses it, so
	 * either it sees this CPU here or this CPU sees the tag gone. */
	__sync_fetch_and_add(&slot->inflight, 1);
	if (slot->tag != tag) {
		__sync_fetch_and_sub(&slot->inflight, 1);
		goto to_user;
	}
	word = (sender / 64) & (AGGBOX_RANK_WORDS - 1);
	bit = 1ULL << (sender % 64);
	old = __sync_fetch_and_or(&slot->bits[word], bit);
	if (old & bit) {
		int verdict = slot->done ? XDP_PASS : XDP_DROP;

		aggbox_rcount(AGGBOX_RSTAT_DUPLICATES);
		/* Complete: the sender lost its result. Answer it from the slot
		 * (held by inflight meanwhile), or let the process. */
		if (slot->done && red->fanout && !aggbox_red_recipient(red, hdr->op >> 4, sender)) {
			__sync_fetch_and_sub(&slot->inflight, 1);
			hdr = aggbox_xdp_strip(ctx, len);
			if (!hdr)
				return XDP_DROP;
			hdr->kind = AGGBOX_KIND_RED_DONE;
			hdr->flags = AGGBOX_FLAG_RETRANSMIT;
			hdr->sender = red->rank;
			aggbox_rcount(AGGBOX_RSTAT_ANSWERED);
			return aggbox_xdp_bounce(ctx);
		}
		if (slot->done && red->fanout &&
		    aggbox_xdp_make_result(ctx, slot, len, red->rank, AGGBOX_FLAG_RETRANSMIT) == 0) {
			__sync_fetch_and_sub(&slot->inflight, 1);
			aggbox_rcount(AGGBOX_RSTAT_ANSWERED);
			return aggbox_xdp_bounce(ctx);
		}
		__sync_fetch_and_sub(&slot->inflight, 1);
		return verdict;
	}
	s = bpf_map_lookup_elem(&ab_redscratch, &zero);
	/* The bound again, on the register the copy takes (the compiler would
	 * reuse the check above, made on another register). */
	barrier_var(len);
	if (!s || len == 0 || len > AGGBOX_CHUNK_MAX || bpf_xdp_load_bytes(ctx, AGGBOX_OFF_PAYLOAD, s->data, len)) {
		__sync_fetch_and_and(&slot->bits[word], ~bit); /* not added: let user space */
		__sync_fetch_and_sub(&slot->inflight, 1);
		goto to_user;
	}
	s->slot = slot_idx;
	s->ctl = ctl_idx;
	s->phase = phase;
	s->seq = hdr->seq;
	s->fold = red->fold;
	s->sender = sender;
	s->contended = 0;
	s->lane = red->lane;
	s->lanes = len / red->lane;
	s->len = len;
	s->next = 0;
	bpf_tail_call(ctx, &ab_redprogs, AGGBOX_REDPROG_FOLD);
	/* Not reached while the fold stage is in ab_redprogs. */
	__sync_fetch_and_and(&slot->bits[word], ~bit);
	__sync_fetch_and_sub(&slot->inflight, 1);
	aggbox_rcount(AGGBOX_RSTAT_ERRORS);
	goto to_user;

to_user:
	aggbox_rcount(AGGBOX_RSTAT_TO_USER);
	return XDP_PASS;
}

/* Whether lane value v beats old under fold (MIN/MAX, signed or not). */
static __always_inline int aggbox_wins64(__u32 fold, __u64 v, __u64 old)
{
	switch (fold) {
	case AGGBOX_FOLD_MIN_S: return (__s64)v < (__s64)old;
	case AGGBOX_FOLD_MIN_U: return v < old;
	case AGGBOX_FOLD_MAX_S: return (__s64)v > (__s64)old;
	default: return v > old;
	}
}

static __always_inline int aggbox_wins32(__u32 fold, __u32 v, __u32 old)
{
	switch (fold) {
	case AGGBOX_FOLD_MIN_S: return (__s32)v < (__s32)old;
	case AGGBOX_FOLD_MIN_U: return v < old;
	case AGGBOX_FOLD_MAX_S: return (__s32)v > (__s32)old;
	default: return v > old;
	}
}

/* One segment of lanes of 8 bytes: [next, next + SEG). */
static __always_inline void aggbox_fold_seg64(struct aggbox_red_scratch *s, struct aggbox_redslot *slot)
{
	__u32 i, k, t;
	__u64 v, old;

	for (k = 0; k < AGGBOX_RED_SEG; k++) {
		i = s->next + k;
		if (i >= s->lanes || i >= AGGBOX_CHUNK_MAX / 8)
			break;
		v = s->data[i];
		if (s->fold == AGGBOX_FOLD_ADD) {
			__sync_fetch_and_add(&slot->acc[i], v);
			continue;
		}
		for (t = 0; t < AGGBOX_RED_TRIES; t++) {
			old = slot->acc[i];
			if (!aggbox_wins64(s->fold, v, old) || __sync_val_compare_and_swap(&slot->acc[i], old, v) == old)
				break;
		}
		if (t == AGGBOX_RED_TRIES)
			s->contended = 1;
	}
}

/* One segment of lanes of 4 bytes. */
static __always_inline void aggbox_fold_seg32(struct aggbox_red_scratch *s, struct aggbox_redslot *slot)
{
	__u32 *acc = (__u32 *)slot->acc, *data = (__u32 *)s->data;
	__u32 i, k, t, v, old;

	for (k = 0; k < AGGBOX_RED_SEG; k++) {
		i = s->next + k;
		if (i >= s->lanes || i >= AGGBOX_CHUNK_MAX / 4)
			break;
		v = data[i];
		if (s->fold == AGGBOX_FOLD_ADD) {
			__sync_fetch_and_add(&acc[i], v);
			continue;
		}
		for (t = 0; t < AGGBOX_RED_TRIES; t++) {
			old = acc[i];
			if (!aggbox_wins32(s->fold, v, old) || __sync_val_compare_and_swap(&acc[i], old, v) == old)
				break;
		}
		if (t == AGGBOX_RED_TRIES)
			s->contended = 1;
	}
}

#ifdef AGGBOX_RED_LOCK
/* One segment of an ADD fold with plain adds: the caller holds the slot's
 * lock (no helper calls in here). */
static __always_inline void aggbox_add_seg_locked(struct aggbox_red_scratch *s, struct aggbox_redslot *slot)
{
	__u32 *acc32 = (__u32 *)slot->acc, *data32 = (__u32 *)s->data;
	__u32 i, k;

	if (s->lane == 8) {
		for (k = 0; k < AGGBOX_RED_SEG; k++) {
			i = s->next + k;
			if (i >= s->lanes || i >= AGGBOX_CHUNK_MAX / 8)
				break;
			/* Index from the checked register (not a pointer the
			 * compiler advanced before the check). */
			barrier_var(i);
			slot->acc[i] += s->data[i];
		}
		return;
	}
	for (k = 0; k < AGGBOX_RED_SEG; k++) {
		i = s->next + k;
		if (i >= s->lanes || i >= AGGBOX_CHUNK_MAX / 4)
			break;
		barrier_var(i);
		acc32[i] += data32[i];
	}
}
#endif

/*
 * The fold stage: combines lanes [next, next + SEG) of the scratch payload
 * into the slot, then tail-calls itself for the next segment; after the
 * last, counts the contribution. The one that completes the chunk becomes
 * its result (allreduce) or a RED_SUM notice.
 */
static __always_inline int aggbox_xdp_red_fold_stage(struct xdp_md *ctx)
{
	struct aggbox_red_scratch *s;
	struct aggbox_redslot *slot;
	struct aggbox_redctl *red = NULL;
	struct aggbox_ctl *ctl;
	struct aggbox_hdr *hdr;
	__u32 zero = 0, count, ranks = 0, word;
	__u16 flags;

	s = bpf_map_lookup_elem(&ab_redscratch, &zero);
	if (!s)
		return XDP_DROP;
	slot = bpf_map_lookup_elem(&ab_redwin, &s->slot);
	if (!slot)
		return XDP_DROP;
#ifdef AGGBOX_RED_LOCK
	if (s->fold == AGGBOX_FOLD_ADD) {
		struct aggbox_redlock *lock = bpf_map_lookup_elem(&ab_redlock, &s->slot);

		if (!lock) {
			aggbox_rcount(AGGBOX_RSTAT_ERRORS); /* half added: must not happen */
			__sync_fetch_and_sub(&slot->inflight, 1);
			return XDP_DROP;
		}
		bpf_spin_lock(&lock->lock);
		aggbox_add_seg_locked(s, slot);
		bpf_spin_unlock(&lock->lock);
	} else
#endif
	if (s->lane == 8)
		aggbox_fold_seg64(s, slot);
	else
		aggbox_fold_seg32(s, slot);
	s->next += AGGBOX_RED_SEG;
	if (s->next < s->lanes) {
		bpf_tail_call(ctx, &ab_redprogs, AGGBOX_REDPROG_FOLD);
		aggbox_rcount(AGGBOX_RSTAT_ERRORS); /* half added: must not happen */
		__sync_fetch_and_sub(&slot->inflight, 1);
		return XDP_DROP;
	}
	if (s->contended) {
		/* MIN/MAX are idempotent: the process folds it all again. */
		word = (s->sender / 64) & (AGGBOX_RANK_WORDS - 1);
		__sync_fetch_and_and(&slot->bits[word], ~(1ULL << (s->sender % 64)));
		__sync_fetch_and_sub(&slot->inflight, 1);
		aggbox_rcount(AGGBOX_RSTAT_CONTENDED);
		return XDP_PASS;
	}
	aggbox_rcount(AGGBOX_RSTAT_FOLDED);
	ctl = bpf_map_lookup_elem(&ab_ctl, &s->ctl);
	if (ctl) {
		red = &ctl->red[s->phase & (AGGBOX_RED_PHASES - 1)];
		ranks = red->ranks;
	}
	count = __sync_fetch_and_add(&slot->count, 1) + 1;
	if (!red || count < ranks || __sync_val_compare_and_swap(&slot->done, 0, 1) != 0) {
		__sync_fetch_and_sub(&slot->inflight, 1);
		return XDP_DROP;
	}
	if (red->fanout && red->seq == s->seq) {
		/* The result, fanned out by TC ingress; the slot stays held
		 * (inflight) until its lanes are copied. */
		flags = AGGBOX_FLAG_FANOUT;
		if (aggbox_red_landed(red))
			flags |= AGGBOX_FLAG_NOTIFY;
		/* Still from the contributor (TC checks the sender against the
		 * source address); TC makes the copies this rank's. */
		if (aggbox_xdp_make_result(ctx, slot, s->len, s->sender, flags) == 0) {
			__sync_fetch_and_sub(&slot->inflight, 1);
			return XDP_PASS;
		}
		/* Not made: the process sends it (the sum notice tells it). */
		__sync_fetch_and_sub(&red->landed, 1);
	}
	__sync_fetch_and_sub(&slot->inflight, 1);
	/* Complete: the process's one wake-up for this chunk. */
	hdr = aggbox_xdp_strip(ctx, s->len);
	if (!hdr)
		return XDP_DROP;
	hdr->kind = AGGBOX_KIND_RED_SUM;
	hdr->flags = 0;
	aggbox_rcount(AGGBOX_RSTAT_SUMS);
	return XDP_PASS;
}

/* What a RED_RESULT (`result`) or a RED_DONE from the wire is to reduction
 * `red` at this rank. */
#define AGGBOX_ANSWER_TAKE 0 /* of the armed call, from the chunk's owner, in the window */
#define AGGBOX_ANSWER_OLD 1 /* below the window: copied out long ago, a repeat */
#define AGGBOX_ANSWER_OTHER 2 /* not armed, not for this rank, beyond the credit, odd: user space judges */

static __always_inline int aggbox_red_answer(struct aggbox_redctl *red, struct aggbox_hdr *hdr, int result)
{
	__u32 chunk = hdr->chunk;

	if (!red->fanout || red->seq == 0 || hdr->seq != red->seq || hdr->nchunks != red->nchunks ||
	    hdr->count != red->count || hdr->dtype != red->dtype || hdr->op != red->op || chunk >= red->nchunks ||
	    red->ranks == 0 || aggbox_red_recipient(red, hdr->op >> 4, red->rank) != result)
		return AGGBOX_ANSWER_OTHER;
	/* From the chunk's owner (classify checked the sender's address), and
	 * within the window the process gave. */
	if (hdr->sender != aggbox_red_owner(red, chunk) || hdr->sender == red->rank || chunk >= red->credit)
		return AGGBOX_ANSWER_OTHER;
	if (chunk + AGGBOX_RES_SLOTS < red->credit)
		return AGGBOX_ANSWER_OLD;
	return AGGBOX_ANSWER_TAKE;
}

/*
 * XDP ingress, a RED_RESULT at a member: place it in the result window of
 * the reduction this communicator armed (and gets the results of), and
 * count it landed; otherwise (not armed, not in the window, odd) pass it up
 * unchanged.
 */
static __always_inline int aggbox_xdp_red_result(struct xdp_md *ctx, struct aggbox_pkt *pkt)
{
	struct aggbox_hdr *hdr = pkt->hdr;
	struct aggbox_rxslot *slot;
	struct aggbox_redctl *red;
	struct aggbox_ctl *ctl;
	__u32 ctl_idx = pkt->ctl, seq = hdr->seq, chunk = hdr->chunk, phase = seq & (AGGBOX_RED_PHASES - 1);
	__u32 len, want, slot_idx;

	ctl = bpf_map_lookup_elem(&ab_ctl, &ctl_idx);
	if (!ctl || pkt->ip->ihl != 5)
		goto to_user;
	red = &ctl->red[phase];
	switch (aggbox_red_answer(red, hdr, 1)) {
	case AGGBOX_ANSWER_OLD:
		aggbox_rcount(AGGBOX_RSTAT_DUPLICATES);
		return XDP_DROP;
	case AGGBOX_ANSWER_TAKE:
		break;
	default:
		goto to_user;
	}
	len = bpf_ntohs(pkt->udp->len) - sizeof(struct udphdr) - sizeof(*hdr);
	want = chunk + 1 == red->nchunks ? red->result_last : red->chunk_bytes;
	if (len != want || len == 0 || len > AGGBOX_CHUNK_MAX)
		goto to_user;
	slot_idx = ctl_idx * AGGBOX_RES_SLOTS + (chunk & (AGGBOX_RES_SLOTS - 1));
	slot = bpf_map_lookup_elem(&ab_redres, &slot_idx);
	if (!slot)
		goto to_user;
	switch (aggbox_xdp_place(ctx, slot, aggbox_tag(seq, chunk), len)) {
	case AGGBOX_PLACE_HELD:
		aggbox_rcount(AGGBOX_RSTAT_DUPLICATES);
		return XDP_DROP;
	case AGGBOX_PLACED:
		break;
	default:
		goto to_user;
	}
	if (red->seq != seq)
		goto to_user;
	aggbox_rcount(AGGBOX_RSTAT_PLACED);
	if (!aggbox_red_landed(red))
		return XDP_DROP;
	hdr = aggbox_xdp_strip(ctx, len);
	if (!hdr)
		return XDP_DROP;
	hdr->kind = AGGBOX_KIND_RED_LANDED;
	hdr->flags = 0;
	hdr->count = red->landed;
	aggbox_rcount(AGGBOX_RSTAT_LANDED);
	return XDP_PASS;

to_user:
	aggbox_rcount(AGGBOX_RSTAT_RES_TO_USER);
	return XDP_PASS;
}

/*
 * XDP ingress, a RED_DONE at a contributor that gets no result of the chunk
 * (reduce, reduce-scatter): mark the chunk done in the result window (its
 * tag, no data) and count it landed, as a placed result; otherwise pass it
 * up unchanged.
 */
static __always_inline int aggbox_xdp_red_done(struct xdp_md *ctx, struct aggbox_pkt *pkt)
{
	struct aggbox_hdr *hdr = pkt->hdr;
	struct aggbox_rxslot *slot;
	struct aggbox_redctl *red;
	struct aggbox_ctl *ctl;
	__u32 ctl_idx = pkt->ctl, seq = hdr->seq, chunk = hdr->chunk, phase = seq & (AGGBOX_RED_PHASES - 1);
	__u32 slot_idx;
	__u64 tag, cur;

	ctl = bpf_map_lookup_elem(&ab_ctl, &ctl_idx);
	if (!ctl)
		goto to_user;
	red = &ctl->red[phase];
	switch (aggbox_red_answer(red, hdr, 0)) {
	case AGGBOX_ANSWER_OLD:
		aggbox_rcount(AGGBOX_RSTAT_DUPLICATES);
		return XDP_DROP;
	case AGGBOX_ANSWER_TAKE:
		break;
	default:
		goto to_user;
	}
	slot_idx = ctl_idx * AGGBOX_RES_SLOTS + (chunk & (AGGBOX_RES_SLOTS - 1));
	slot = bpf_map_lookup_elem(&ab_redres, &slot_idx);
	if (!slot)
		goto to_user;
	tag = aggbox_tag(seq, chunk);
	cur = slot->tag;
	if (cur == tag) {
		aggbox_rcount(AGGBOX_RSTAT_DUPLICATES);
		return XDP_DROP;
	}
	if ((cur & AGGBOX_TAG_BUSY) || !aggbox_tag_older(cur, tag) ||
	    __sync_val_compare_and_swap(&slot->tag, cur, tag) != cur || red->seq != seq)
		goto to_user;
	aggbox_rcount(AGGBOX_RSTAT_PLACED);
	if (!aggbox_red_landed(red))
		return XDP_DROP;
	hdr->kind = AGGBOX_KIND_RED_LANDED;
	hdr->flags = 0;
	hdr->count = red->landed;
	pkt->udp->check = 0; /* the header changed */
	aggbox_rcount(AGGBOX_RSTAT_LANDED);
	return XDP_PASS;

to_user:
	aggbox_rcount(AGGBOX_RSTAT_RES_TO_USER);
	return XDP_PASS;
}

#endif /* AGGBOX_REDUCE_H */
