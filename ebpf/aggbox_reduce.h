/* SPDX-License-Identifier: Apache-2.0 */
/*
 * Kernel folding of reduction contributions at a chunk's owner
 * (docs/ALLREDUCE.md, "Kernel datapath").
 *
 * The owner's process arms its control block's `red[seq % 2]` for one
 * reduction whose sums are integer lane additions (integer SUM, quantized
 * float SUM/AVG) and prepares one slot of ab_redwin per owned chunk in
 * flight: tag, its own contribution as the starting sum, its own bit, a
 * count of 1. It also arms the next reduction ahead, with the parameters
 * of the one before it (the same phase), its first slots zeroed and
 * tagged AGGBOX_RED_AHEAD: XDP folds early contributions there, and the
 * process adds its own when it makes the call. For each RED_DATA of that reduction to a prepared slot, XDP
 * ingress (aggbox_xdp_red_data) claims the sender's bit (a repeat is
 * dropped, or passed up when the chunk is complete, so the process
 * answers it), copies the payload into a per-CPU scratch buffer and
 * tail-calls the fold stage. Each run of aggbox_xdp_red_fold adds
 * AGGBOX_RED_SEG lanes into the slot with atomic adds and tail-calls itself
 * for the next segment; the last one counts the contribution, and the one
 * that makes the count reach the group size turns the datagram into a
 * header-only RED_SUM notice for the process: its one wake-up for the
 * chunk, which it reads from the mapped slot. Every other contribution is
 * dropped: none reaches the socket.
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
/* Lanes one run of the fold stage adds (one tail call per segment). */
#ifndef AGGBOX_RED_SEG
#define AGGBOX_RED_SEG 128
#endif
/* Tail-call targets in ab_redprogs. */
#define AGGBOX_REDPROG_FOLD 0
#define AGGBOX_REDPROG_MAX 1

/* One owned chunk being summed. */
struct aggbox_redslot {
	__u64 tag; /* (seq << 32 | chunk) it sums; 0: not prepared */
	__u64 bits[AGGBOX_RANK_WORDS]; /* contributors folded (the owner's own included) */
	__u32 count; /* contributors folded */
	__u32 done; /* 1 once complete */
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
	__u32 reserved;
	__u32 lanes; /* lanes in this payload */
	__u32 next; /* first lane not added yet */
	__u32 lane; /* bytes of a lane: 4 or 8 */
	__u32 len; /* payload bytes */
	__u64 data[AGGBOX_CHUNK_MAX / 8];
};

/* Reduction counters of the host: ab_rstats[stat], per CPU. */
enum aggbox_rstat {
	AGGBOX_RSTAT_FOLDED = 0, /* contributions added into a slot by XDP */
	AGGBOX_RSTAT_SUMS = 1, /* RED_SUM notices passed up: chunks XDP completed */
	AGGBOX_RSTAT_DUPLICATES = 2, /* repeats of a contribution already added */
	AGGBOX_RSTAT_TO_USER = 3, /* RED_DATA left to user space (unarmed, unprepared, odd) */
	AGGBOX_RSTAT_ERRORS = 4, /* a tail call that did not happen (must stay 0) */
	AGGBOX_RSTAT_MAX = 5,
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

struct {
	__uint(type, BPF_MAP_TYPE_PROG_ARRAY);
	__uint(max_entries, AGGBOX_REDPROG_MAX);
	__type(key, __u32);
	__type(value, __u32);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} ab_redprogs SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, AGGBOX_RSTAT_MAX);
	__type(key, __u32);
	__type(value, __u64);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} ab_rstats SEC(".maps");

static __always_inline void aggbox_rcount(enum aggbox_rstat stat)
{
	__u32 idx = stat;
	__u64 *value = bpf_map_lookup_elem(&ab_rstats, &idx);

	if (value)
		*value += 1;
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
	    hdr->dtype != red->dtype || hdr->op != red->op || chunk >= red->nchunks || chunk < red->base ||
	    red->stride == 0 || (red->lane != 4 && red->lane != 8) || red->ranks == 0)
		goto to_user;
	if ((chunk - red->base) % red->stride)
		goto to_user; /* not this rank's chunk: user space says so */
	owned = (chunk - red->base) / red->stride;
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
		/* Armed ahead (zeroed, before the owner's call): the first
		 * contribution names the chunk. */
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
		__sync_fetch_and_sub(&slot->inflight, 1);
		/* Complete: the sender lost its answer, which the process sends. */
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

/*
 * The fold stage: adds lanes [next, next + SEG) of the scratch payload into
 * the slot, then tail-calls itself for the next segment; after the last,
 * counts the contribution.
 */
static __always_inline int aggbox_xdp_red_fold_stage(struct xdp_md *ctx)
{
	struct aggbox_red_scratch *s;
	struct aggbox_redslot *slot;
	struct aggbox_ctl *ctl;
	struct aggbox_hdr *hdr;
	__u32 zero = 0, i, k, count, ranks;

	s = bpf_map_lookup_elem(&ab_redscratch, &zero);
	if (!s)
		return XDP_DROP;
	slot = bpf_map_lookup_elem(&ab_redwin, &s->slot);
	if (!slot)
		return XDP_DROP;
	if (s->lane == 8) {
		for (k = 0; k < AGGBOX_RED_SEG; k++) {
			i = s->next + k;
			if (i >= s->lanes || i >= AGGBOX_CHUNK_MAX / 8)
				break;
			__sync_fetch_and_add(&slot->acc[i], s->data[i]);
		}
	} else {
		for (k = 0; k < AGGBOX_RED_SEG; k++) {
			i = s->next + k;
			if (i >= s->lanes || i >= AGGBOX_CHUNK_MAX / 4)
				break;
			__sync_fetch_and_add(&((__u32 *)slot->acc)[i], ((__u32 *)s->data)[i]);
		}
	}
	s->next += AGGBOX_RED_SEG;
	if (s->next < s->lanes) {
		bpf_tail_call(ctx, &ab_redprogs, AGGBOX_REDPROG_FOLD);
		aggbox_rcount(AGGBOX_RSTAT_ERRORS); /* half added: must not happen */
		__sync_fetch_and_sub(&slot->inflight, 1);
		return XDP_DROP;
	}
	aggbox_rcount(AGGBOX_RSTAT_FOLDED);
	ctl = bpf_map_lookup_elem(&ab_ctl, &s->ctl);
	ranks = ctl ? ctl->red[s->phase & (AGGBOX_RED_PHASES - 1)].ranks : 0;
	count = __sync_fetch_and_add(&slot->count, 1) + 1;
	__sync_fetch_and_sub(&slot->inflight, 1);
	if (!ctl || count < ranks || __sync_val_compare_and_swap(&slot->done, 0, 1) != 0)
		return XDP_DROP;
	/* Complete: the process's one wake-up for this chunk. */
	hdr = aggbox_xdp_strip(ctx, s->len);
	if (!hdr)
		return XDP_DROP;
	hdr->kind = AGGBOX_KIND_RED_SUM;
	hdr->flags = 0;
	aggbox_rcount(AGGBOX_RSTAT_SUMS);
	return XDP_PASS;
}

#endif /* AGGBOX_REDUCE_H */
