/* SPDX-License-Identifier: Apache-2.0 */
/*
 * The reductions on the TC hooks (docs/ALLREDUCE.md, "The TC datapath"):
 * with no XDP program before it, TC ingress is the first program a
 * contribution or a result meets, and it sees a UDP GSO super-chunk whole:
 * up to 64 segments, each a whole AggBox datagram of consecutive chunks (an
 * owner takes runs of chunks, so a contributor's run to one owner leaves
 * as one super-packet).
 *
 * At a chunk's owner (aggbox_tc_red_data) every segment is checked against
 * the first, then folded into its chunk's slot of ab_redwin as XDP's fold
 * stage does (the same slots, bits, counts and inflight handshake with the
 * process), a bpf_loop over blocks of AGGBOX_RED_SEG lanes (MIN/MAX: over
 * lanes) in place of the tail calls (64 segments of up to 8 blocks would
 * pass the 33-tail-call limit). Sums are plain adds under the slot's spin
 * lock, as in XDP. When the super-chunk completes
 * every one of its chunks (the last contributor's run, as a rule) and the
 * call is an allreduce, it becomes their results: each segment's payload
 * is overwritten with its slot's sum and sent, from this rank, to every
 * other member (bpf_clone_redirect), a super-chunk still. Otherwise the
 * chunks it completed are marked for the process (AGGBOX_RED_DONE_PROCESS)
 * and it goes up whole: the process folds what the kernel did not (it
 * claims the same bits, so nothing is added twice) and sends the results.
 *
 * At a member (aggbox_tc_red_result) each segment of a RED_RESULT is placed
 * in the result window, as XDP places one datagram; the process is woken
 * once per notification step.
 */
#ifndef AGGBOX_TC_REDUCE_H
#define AGGBOX_TC_REDUCE_H

#include "aggbox_reduce.h"
#include "aggbox_result.h"

/* Segments of one super-chunk the reductions take (UDP GSO's limit). */
#define AGGBOX_RED_SEGS_MAX 64

/* One walk of a RED_DATA super-chunk at its owner. */
struct aggbox_red_walk {
	struct aggbox_walk w; /* geometry and header check, as for broadcast */
	struct aggbox_redctl *red;
	struct aggbox_red_scratch *s;
	__u32 slot_idx; /* the slot of the segment being folded */
	__u32 reserved;
	__u64 completed; /* bit i: segment i completed its chunk */
	__u32 ctl_idx;
	__u32 phase;
	__u32 seq;
	__u32 sender;
	__u32 folded; /* segments folded here */
	__u8 to_user; /* a segment the kernel did not take: the process gets the skb */
	__u8 notify; /* a result landed at a notification step */
};

/* The ab_redwin index of owned chunk `owned` of the walk's reduction. */
static __always_inline __u32 aggbox_red_slot_idx(struct aggbox_red_walk *rw, __u32 owned)
{
	return (rw->ctl_idx * AGGBOX_RED_PHASES + rw->phase) * AGGBOX_RED_SLOTS + (owned & (AGGBOX_RED_SLOTS - 1));
}

/* Adds block i of AGGBOX_RED_SEG lanes of the scratch payload into the
 * walk's slot (bpf_loop callback of an ADD fold), with plain adds under the
 * slot's spin lock: measured faster than atomic adds (docs/ALLREDUCE.md,
 * "Atomics vs per-slot lock"). */
static long aggbox_tc_red_add_block(__u64 i, void *data)
{
	struct aggbox_red_walk *rw = data;
	struct aggbox_red_scratch *s = rw->s;
	struct aggbox_redslot *slot = bpf_map_lookup_elem(&ab_redwin, &rw->slot_idx);
	struct aggbox_redlock *lock = bpf_map_lookup_elem(&ab_redlock, &rw->slot_idx);

	if (!s || !slot || !lock)
		return 1;
	s->next = (__u32)i * AGGBOX_RED_SEG;
	bpf_spin_lock(&lock->lock);
	aggbox_add_seg_locked(s, slot);
	bpf_spin_unlock(&lock->lock);
	return 0;
}

/* Folds lane i of a MIN/MAX contribution into the walk's slot with a
 * compare-and-swap loop (bpf_loop callback; flags a lane that lost
 * AGGBOX_RED_TRIES races). */
static long aggbox_tc_red_minmax_lane(__u64 i, void *data)
{
	struct aggbox_red_walk *rw = data;
	struct aggbox_red_scratch *s = rw->s;
	struct aggbox_redslot *slot = bpf_map_lookup_elem(&ab_redwin, &rw->slot_idx);
	__u32 lane = (__u32)i, t, v32, old32, *acc32;
	__u64 v, old;

	if (!s || !slot)
		return 1;
	if (s->lane == 8) {
		if (lane >= AGGBOX_CHUNK_MAX / 8)
			return 1;
		v = s->data[lane];
		for (t = 0; t < AGGBOX_RED_TRIES; t++) {
			old = slot->acc[lane];
			if (!aggbox_wins64(s->fold, v, old) || __sync_val_compare_and_swap(&slot->acc[lane], old, v) == old)
				return 0;
		}
		s->contended = 1;
		return 0;
	}
	if (lane >= AGGBOX_CHUNK_MAX / 4)
		return 1;
	acc32 = (__u32 *)slot->acc;
	v32 = ((__u32 *)s->data)[lane];
	for (t = 0; t < AGGBOX_RED_TRIES; t++) {
		old32 = acc32[lane];
		if (!aggbox_wins32(s->fold, v32, old32) || __sync_val_compare_and_swap(&acc32[lane], old32, v32) == old32)
			return 0;
	}
	s->contended = 1;
	return 0;
}

/*
 * Folds segment i of the walk into its chunk's slot (bpf_loop callback).
 * A segment it cannot take (a slot the process is folding into, or not
 * prepared, or not this rank's) leaves the skb to the process, which
 * folds just that one; a repeat of a contribution is skipped (and, to a
 * completed chunk, left to the process, which answers it).
 */
static long aggbox_tc_red_fold_seg(__u64 i, void *data)
{
	struct aggbox_red_walk *rw = data;
	struct aggbox_redctl *red = rw->red;
	struct aggbox_red_scratch *s = rw->s;
	struct aggbox_redslot *slot;
	__u32 chunk = rw->w.first + (__u32)i, owned, len, want, slot_idx, word, count;
	__u64 tag = aggbox_tag(rw->seq, chunk), bit, old;

	if (!red || !s || i >= AGGBOX_RED_SEGS_MAX || red->run == 0 || red->lane == 0 ||
	    aggbox_red_owner(red, chunk) != red->rank)
		goto to_user;
	owned = aggbox_red_owned(red, chunk);
	len = aggbox_seg_len(&rw->w, (__u32)i);
	want = owned == red->owned_last ? red->last_bytes : red->chunk_bytes;
	if (len != want || len == 0 || len > AGGBOX_CHUNK_MAX || len % red->lane)
		goto to_user;
	slot_idx = aggbox_red_slot_idx(rw, owned);
	slot = bpf_map_lookup_elem(&ab_redwin, &slot_idx);
	if (!slot)
		goto to_user;
	if (slot->tag != tag) {
		/* Armed ahead: the first contribution names the chunk. */
		if (owned < AGGBOX_RED_SLOTS)
			__sync_val_compare_and_swap(&slot->tag, aggbox_tag(rw->seq, AGGBOX_RED_AHEAD), tag);
		if (slot->tag != tag)
			goto to_user;
	}
	/* The process's handshake, as in XDP (aggbox_xdp_red_data). */
	__sync_fetch_and_add(&slot->inflight, 1);
	if (slot->tag != tag)
		goto release;
	word = (rw->sender / 64) & (AGGBOX_RANK_WORDS - 1);
	bit = 1ULL << (rw->sender % 64);
	old = __sync_fetch_and_or(&slot->bits[word], bit);
	if (old & bit) {
		aggbox_rcount(AGGBOX_RSTAT_DUPLICATES);
		__sync_fetch_and_sub(&slot->inflight, 1);
		if (slot->done)
			rw->to_user = 1; /* complete: the sender lost its result; the process answers */
		return 0;
	}
	barrier_var(len);
	if (len == 0 || len > AGGBOX_CHUNK_MAX ||
	    bpf_skb_load_bytes(rw->w.skb, rw->w.hdr_off + (__u32)i * rw->w.stride + AGGBOX_HDR_LEN, s->data, len)) {
		__sync_fetch_and_and(&slot->bits[word], ~bit);
		goto release;
	}
	s->fold = red->fold;
	s->lane = red->lane;
	s->lanes = len / red->lane;
	s->contended = 0;
	rw->slot_idx = slot_idx;
	if (s->fold == AGGBOX_FOLD_ADD)
		bpf_loop((s->lanes + AGGBOX_RED_SEG - 1) / AGGBOX_RED_SEG, aggbox_tc_red_add_block, rw, 0);
	else
		bpf_loop(s->lanes, aggbox_tc_red_minmax_lane, rw, 0);
	if (s->contended) {
		/* MIN/MAX are idempotent: the process folds it all again. */
		__sync_fetch_and_and(&slot->bits[word], ~bit);
		aggbox_rcount(AGGBOX_RSTAT_CONTENDED);
		goto release;
	}
	aggbox_rcount(AGGBOX_RSTAT_FOLDED);
	rw->folded++;
	count = __sync_fetch_and_add(&slot->count, 1) + 1;
	if (count >= red->ranks && __sync_val_compare_and_swap(&slot->done, 0, AGGBOX_RED_DONE_PROCESS) == 0) {
		/* Held (inflight) until its result is written or left to the
		 * process: the process may reuse a done slot once it is free. */
		rw->completed |= 1ULL << (i & (AGGBOX_RED_SEGS_MAX - 1));
		return 0;
	}
	__sync_fetch_and_sub(&slot->inflight, 1);
	return 0;

release:
	__sync_fetch_and_sub(&slot->inflight, 1);
to_user:
	/* The skb goes up whole; the others are still folded here, and the
	 * process folds only this one (to it, the rest are repeats). */
	rw->to_user = 1;
	return 0;
}

/* Releases segment i's completed slot, left for the process to send its
 * result (bpf_loop callback). */
static long aggbox_tc_red_release_seg(__u64 i, void *data)
{
	struct aggbox_red_walk *rw = data;
	struct aggbox_redslot *slot;
	__u32 slot_idx;

	if (!rw->red || !(rw->completed & (1ULL << (i & (AGGBOX_RED_SEGS_MAX - 1)))))
		return 0;
	slot_idx = aggbox_red_slot_idx(rw, aggbox_red_owned(rw->red, rw->w.first + (__u32)i));
	slot = bpf_map_lookup_elem(&ab_redwin, &slot_idx);
	if (slot)
		__sync_fetch_and_sub(&slot->inflight, 1);
	return 0;
}

/* The header fields a result changes, from `kind` to `sender` (one store). */
struct aggbox_result_fields {
	__u8 kind;
	__u16 flags;
	__u32 group;
	__u16 sender;
} __attribute__((packed));

#define AGGBOX_HDR_OFF_KIND offsetof(struct aggbox_hdr, kind)

/*
 * Makes segment i the result of its chunk from this rank: its slot's sum
 * over the payload, kind RED_RESULT, sender this rank; counts it landed and
 * releases the slot (bpf_loop callback; stops at the first it cannot).
 */
static long aggbox_tc_red_result_seg(__u64 i, void *data)
{
	struct aggbox_red_walk *rw = data;
	struct aggbox_redctl *red = rw->red;
	struct aggbox_redslot *slot;
	struct aggbox_result_fields fields;
	__u32 off = rw->w.hdr_off + (__u32)i * rw->w.stride, len = aggbox_seg_len(&rw->w, (__u32)i), slot_idx;
	__u64 group_word = rw->w.words[offsetof(struct aggbox_hdr, group) / 8];

	if (!red)
		return 1;
	slot_idx = aggbox_red_slot_idx(rw, aggbox_red_owned(red, rw->w.first + (__u32)i));
	slot = bpf_map_lookup_elem(&ab_redwin, &slot_idx);
	if (!slot)
		return 1;
	fields.kind = AGGBOX_KIND_RED_RESULT;
	fields.flags = 0;
	fields.group = (__u32)group_word;
	fields.sender = red->rank;
	barrier_var(len);
	if (len == 0 || len > AGGBOX_CHUNK_MAX ||
	    bpf_skb_store_bytes(rw->w.skb, off + AGGBOX_HDR_LEN, slot->acc, len, 0) ||
	    bpf_skb_store_bytes(rw->w.skb, off + AGGBOX_HDR_OFF_KIND, &fields, sizeof(fields), 0)) {
		rw->to_user = 1;
		return 1;
	}
	/* Sent by the kernel: a scan by the process does not send it again. */
	slot->done = AGGBOX_RED_DONE_KERNEL;
	rw->completed &= ~(1ULL << (i & (AGGBOX_RED_SEGS_MAX - 1)));
	__sync_fetch_and_sub(&slot->inflight, 1);
	if (aggbox_red_landed(red))
		rw->notify = 1;
	return 0;
}

/*
 * TC ingress on the TC hooks: a RED_DATA (one datagram, or a super-chunk)
 * of a reduction this rank armed. What the kernel does not take whole
 * (unarmed, another call, a chunk not this rank's, a slot not prepared)
 * goes up to the socket unchanged, as from XDP; a super-chunk whose
 * segments disagree with each other or with the chunk size is dropped and
 * counted.
 */
static __always_inline int aggbox_tc_red_data(struct __sk_buff *skb, struct aggbox_pkt *pkt)
{
	struct aggbox_hdr *hdr = pkt->hdr;
	struct aggbox_red_walk rw = {};
	struct aggbox_member_key key;
	struct aggbox_ctl *ctl;
	struct aggbox_redctl *red;
	__u32 zero = 0, segs, last, size, me, cur_ip, phase = hdr->seq & (AGGBOX_RED_PHASES - 1);
	__u16 cur_port, contributor = hdr->sender;

	rw.ctl_idx = pkt->ctl;
	rw.seq = hdr->seq;
	rw.phase = phase;
	rw.sender = hdr->sender;
	ctl = bpf_map_lookup_elem(&ab_ctl, &rw.ctl_idx);
	if (!ctl || pkt->ip->ihl != 5)
		goto to_user;
	red = &ctl->red[phase];
	rw.red = red;
	rw.w.skb = skb;
	rw.w.first = hdr->chunk;
	segs = aggbox_walk_geometry(skb, &rw.w, pkt->udp->len, AGGBOX_RED_SEGS_MAX);
	if (segs == 0)
		goto bad;
	/* Only the call the process armed, exactly as it called it. */
	last = rw.w.first + segs - 1;
	if (red->seq == 0 || hdr->seq != red->seq || hdr->nchunks != red->nchunks || hdr->count != red->count ||
	    hdr->dtype != red->dtype || hdr->op != red->op || last < rw.w.first || last >= red->nchunks ||
	    red->run == 0 || (red->lane != 4 && red->lane != 8) || red->ranks == 0 || red->ranks > AGGBOX_MAX_RANKS ||
	    red->rank >= red->ranks || red->fold > AGGBOX_FOLD_MAX_U)
		goto to_user;
	/* Every segment but the last is a whole chunk. */
	if (segs > 1 && rw.w.stride != AGGBOX_HDR_LEN + red->chunk_bytes)
		goto bad;
	if (!aggbox_walk_segs_agree(&rw.w, hdr, segs))
		goto bad;
	rw.s = bpf_map_lookup_elem(&ab_redscratch, &zero);
	if (!rw.s)
		goto to_user;
	bpf_loop(segs, aggbox_tc_red_fold_seg, &rw, 0);
	/* pkt's pointers are invalid from here on. */
	if (!rw.completed) {
		if (rw.to_user)
			goto to_user; /* the process folds what is left (the rest are repeats to it) */
		return TC_ACT_SHOT; /* folded (or repeats): consumed */
	}
	if (rw.to_user || rw.completed != (segs == AGGBOX_RED_SEGS_MAX ? ~0ULL : (1ULL << segs) - 1) ||
	    !red->fanout || red->seq != rw.seq || (red->op >> 4) != AGGBOX_COLL_ALLREDUCE)
		goto process_sends;

	/* Every chunk it carried is complete: it becomes their results. */
	bpf_loop(segs, aggbox_tc_red_result_seg, &rw, 0);
	if (rw.completed)
		goto process_sends; /* not all written: the process sends them all (repeats are harmless) */
	aggbox_rcount(AGGBOX_RSTAT_SUMS);
	me = red->rank;
	size = red->ranks;
	if (aggbox_tc_swap(skb) || aggbox_tc_dest(skb, &cur_ip, &cur_port))
		return TC_ACT_SHOT; /* a loss: the contributors resend */
	key.group = (__u32)rw.w.words[offsetof(struct aggbox_hdr, group) / 8];
	if (aggbox_tc_red_copies(skb, &key, me, size, me, segs, &cur_ip, &cur_port) || !rw.notify)
		return TC_ACT_SHOT; /* its work is done (a failed copy is a loss) */
	/* The process's one wake-up, cut to its header. */
	return aggbox_tc_red_notice(skb, &key, contributor, red, &cur_ip, &cur_port, 1);

process_sends:
	/* The completed chunks' slots say so; the process sends their results. */
	bpf_loop(segs, aggbox_tc_red_release_seg, &rw, 0);
	aggbox_rcount(AGGBOX_RSTAT_SUMS);
	return TC_ACT_OK;
bad:
	aggbox_rcount(AGGBOX_RSTAT_BAD_SEGMENTS);
	return TC_ACT_SHOT;
to_user:
	aggbox_rcount(AGGBOX_RSTAT_TO_USER);
	return TC_ACT_OK;
}

/* One walk of a RED_RESULT super-chunk at a member. */
struct aggbox_res_walk {
	struct aggbox_walk w;
	struct aggbox_redctl *red;
	__u32 ctl_idx;
	__u32 seq;
	__u32 owner; /* the sender: every chunk's owner */
	__u32 landed; /* red->landed after the last placement */
	__u8 notify;
};

/* Places segment i of a RED_RESULT in the result window (bpf_loop
 * callback; stops at the first it cannot). */
static long aggbox_tc_res_place_seg(__u64 i, void *data)
{
	struct aggbox_res_walk *rw = data;
	struct aggbox_redctl *red = rw->red;
	struct aggbox_rxslot *slot;
	__u32 chunk = rw->w.first + (__u32)i, len, want, slot_idx;

	if (!red || red->seq != rw->seq || chunk >= red->nchunks || aggbox_red_owner(red, chunk) != rw->owner)
		return 1;
	if (chunk >= red->credit)
		return 1;
	if (chunk + AGGBOX_RES_SLOTS < red->credit) {
		aggbox_rcount(AGGBOX_RSTAT_DUPLICATES); /* copied out long ago */
		rw->w.done = (__u32)i + 1;
		return 0;
	}
	len = aggbox_seg_len(&rw->w, (__u32)i);
	want = chunk + 1 == red->nchunks ? red->result_last : red->chunk_bytes;
	if (len != want || len == 0 || len > AGGBOX_CHUNK_MAX)
		return 1;
	slot_idx = rw->ctl_idx * AGGBOX_RES_SLOTS + (chunk & (AGGBOX_RES_SLOTS - 1));
	slot = bpf_map_lookup_elem(&ab_redres, &slot_idx);
	if (!slot)
		return 1;
	switch (aggbox_place(rw->w.skb, 1, slot, aggbox_tag(rw->seq, chunk),
			     rw->w.hdr_off + (__u32)i * rw->w.stride + AGGBOX_HDR_LEN, len)) {
	case AGGBOX_PLACE_HELD:
		aggbox_rcount(AGGBOX_RSTAT_DUPLICATES);
		rw->w.done = (__u32)i + 1;
		return 0;
	case AGGBOX_PLACED:
		break;
	default:
		return 1;
	}
	if (red->seq != rw->seq)
		return 1; /* the call moved on meanwhile: do not count it */
	aggbox_rcount(AGGBOX_RSTAT_PLACED);
	if (aggbox_count_landed(&red->landed, &red->target, &red->notified, red->notify, &rw->landed))
		rw->notify = 1;
	rw->w.done = (__u32)i + 1;
	return 0;
}

/*
 * TC ingress on the TC hooks: a RED_RESULT (one datagram, or a super-chunk)
 * of the allreduce this communicator armed, from the chunks' owner: each
 * segment is placed in the result window and counted landed; the skb is
 * then dropped, or (at a notification step) goes up as the RED_LANDED
 * notice. What the kernel does not place whole goes up unchanged: the
 * process takes each chunk once, by the slot's tag.
 */
static __always_inline int aggbox_tc_red_result(struct __sk_buff *skb, struct aggbox_pkt *pkt)
{
	struct aggbox_hdr *hdr = pkt->hdr;
	struct aggbox_res_walk rw = {};
	struct aggbox_ctl *ctl;
	struct aggbox_redctl *red;
	__u32 segs;

	rw.ctl_idx = pkt->ctl;
	rw.seq = hdr->seq;
	rw.owner = hdr->sender;
	ctl = bpf_map_lookup_elem(&ab_ctl, &rw.ctl_idx);
	if (!ctl || pkt->ip->ihl != 5)
		goto to_user;
	red = &ctl->red[rw.seq & (AGGBOX_RED_PHASES - 1)];
	rw.red = red;
	if (aggbox_red_answer(red, hdr, 1) != AGGBOX_ANSWER_TAKE)
		goto to_user; /* the first chunk decides: the rest are its run */
	rw.w.skb = skb;
	rw.w.first = hdr->chunk;
	segs = aggbox_walk_geometry(skb, &rw.w, pkt->udp->len, AGGBOX_RED_SEGS_MAX);
	if (segs == 0 || (segs > 1 && rw.w.stride != AGGBOX_HDR_LEN + red->chunk_bytes))
		goto bad;
	if (!aggbox_walk_segs_agree(&rw.w, hdr, segs))
		goto bad;
	rw.w.done = 0;
	bpf_loop(segs, aggbox_tc_res_place_seg, &rw, 0);
	/* pkt's pointers are invalid from here on. */
	if (rw.w.done != segs)
		goto to_user; /* the process takes what is not placed; the rest are repeats to it */
	if (!rw.notify)
		return TC_ACT_SHOT;
	hdr = aggbox_tc_strip(skb);
	if (!hdr)
		return TC_ACT_SHOT;
	hdr->kind = AGGBOX_KIND_RED_LANDED;
	hdr->flags = 0;
	hdr->count = rw.landed;
	aggbox_rcount(AGGBOX_RSTAT_LANDED);
	return TC_ACT_OK;

bad:
	aggbox_rcount(AGGBOX_RSTAT_BAD_SEGMENTS);
	return TC_ACT_SHOT;
to_user:
	aggbox_rcount(AGGBOX_RSTAT_RES_TO_USER);
	return TC_ACT_OK;
}

#endif /* AGGBOX_TC_REDUCE_H */
