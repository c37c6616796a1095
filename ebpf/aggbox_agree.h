/* SPDX-License-Identifier: Apache-2.0 */
/*
 * The kernel datapath of approximate agreement (docs/AGREEMENT.md,
 * docs/PROTOCOL.md "Approximate agreement"): XDP folds the values of the
 * phase the process armed in its ab_agree block and wakes it once per
 * phase, when a quorum of n - f distinct senders (its own included) is in.
 *
 * For an AGREE_VALUE of the armed agreement (aggbox_xdp_agree_value):
 * - of the armed phase: min and max are folded first (bounded
 *   compare-and-swap loops on the ordered keys; idempotent, since a
 *   sender's value of a phase never changes, so a repeat re-folding it is
 *   harmless), then the sender's bit is claimed (a repeat is dropped), then
 *   the count; the value that takes the count to the quorum and wins the
 *   `notified` CAS goes up as AGREE_QUORUM (body kept): the one wake-up of
 *   the phase. The others are dropped;
 * - of a later phase: up to the process, which jumps ahead;
 * - of an earlier phase, not an answer itself: the sender lags behind, and
 *   is answered with XDP_TX with the value this rank sent for ans_phase;
 * - an answer of an earlier phase: stale, dropped;
 * - decided (armed at the last phase), a repeated final value from a rank
 *   that decided too: recorded, and answered with this rank's final value,
 *   since the sender's repeat says it has not heard that this rank decided.
 * Everything XDP cannot settle (not armed, another agreement, the process
 * re-arming, a value that lost too many races, an answer being rewritten)
 * goes up unchanged, and the process folds it with the same atomics on the
 * mapped block (Windows::fold_agree).
 *
 * The `inflight` handshake (as aggbox_reduce.h's slots): XDP announces
 * itself (an atomic add, a full barrier) before it reads `phase`; the
 * process stores NO_PHASE (a full barrier) before it waits for inflight to
 * drop to 0 and rewrites the block. So either XDP sees NO_PHASE and leaves
 * the block alone, or the process waits for its fold to end. While XDP is
 * announced, the block's parameters (seq, last, quorum, rank) are those
 * written before the `phase` it read.
 */
#ifndef AGGBOX_AGREE_H
#define AGGBOX_AGREE_H

#include "aggbox_bcast.h"

/* A load the compiler must make, once, where it is written. */
#define AGGBOX_READ_ONCE(x) (*(volatile typeof(x) *)&(x))

/* The ordered key of f64 bits b: unsigned order of keys is the order of
 * the doubles (negative ones inverted, the others with their sign bit
 * set; -0 below +0). Integer operations only. */
static __always_inline __u64 aggbox_agree_key(__u64 b)
{
	return (b >> 63) ? ~b : (b | (1ULL << 63));
}

/* Folds key into *slot as a minimum (`max` 0) or maximum (`max` 1);
 * returns -1 when it lost AGGBOX_AGREE_TRIES races. */
static __always_inline int aggbox_agree_fold_key(__u64 *slot, __u64 key, int max)
{
	__u64 old;
	__u32 t;

	for (t = 0; t < AGGBOX_AGREE_TRIES; t++) {
		old = AGGBOX_READ_ONCE(*slot);
		if (max ? key <= old : key >= old)
			return 0;
		if (__sync_val_compare_and_swap(slot, old, key) == old)
			return 0;
	}
	return -1;
}

/*
 * Turns the frame around into this rank's answer to a rank that lags: the
 * value it sent for ans_phase (read under the ans_gen seqlock), flagged
 * ANSWER, from `rank`, the frame cut to header + body. Returns 0 when the
 * frame is the answer (XDP_TX it), -1 when it is unchanged (pass it up).
 */
static __always_inline int aggbox_agree_answer(struct xdp_md *ctx, struct aggbox_agreectl *ctl)
{
	struct aggbox_agree_body *body;
	struct aggbox_hdr *hdr;
	struct ethhdr *eth;
	struct iphdr *ip;
	struct udphdr *udp;
	void *data, *data_end;
	__u32 g1, g2, ans_phase, ans_inc, rank, last, len;
	__u32 want = AGGBOX_OFF_PAYLOAD + AGGBOX_AGREE_BODY_LEN;
	__u64 ans_value;
	__u16 old_len, new_len;

	g1 = AGGBOX_READ_ONCE(ctl->ans_gen);
	if (g1 & 1)
		return -1; /* the process is writing it */
	ans_phase = AGGBOX_READ_ONCE(ctl->ans_phase);
	ans_value = AGGBOX_READ_ONCE(ctl->ans_value);
	ans_inc = AGGBOX_READ_ONCE(ctl->ans_incarnation);
	g2 = AGGBOX_READ_ONCE(ctl->ans_gen);
	if (g1 != g2)
		return -1;
	rank = ctl->rank;
	last = ctl->last;

	len = bpf_xdp_get_buff_len(ctx);
	if (len < want)
		return -1;
	if (len > want && bpf_xdp_adjust_tail(ctx, -(int)(len - want)))
		return -1;
	data = (void *)(long)ctx->data;
	data_end = (void *)(long)ctx->data_end;
	eth = data;
	ip = (void *)(eth + 1);
	udp = (void *)(ip + 1);
	hdr = (void *)(udp + 1);
	body = (void *)(hdr + 1);
	if ((void *)(body + 1) > data_end)
		return -1;
	aggbox_swap_ends(eth, ip, udp);
	hdr->sender = rank;
	hdr->chunk = ans_phase;
	hdr->nchunks = last;
	hdr->flags = AGGBOX_FLAG_ANSWER;
	body->value = ans_value;
	body->incarnation = ans_inc;
	body->reserved = 0;
	old_len = ip->tot_len;
	new_len = bpf_htons(sizeof(*ip) + sizeof(*udp) + AGGBOX_HDR_LEN + AGGBOX_AGREE_BODY_LEN);
	ip->check = aggbox_csum_replace2(ip->check, old_len, new_len);
	ip->tot_len = new_len;
	udp->len = bpf_htons(sizeof(*udp) + AGGBOX_HDR_LEN + AGGBOX_AGREE_BODY_LEN);
	udp->check = 0; /* none, as IPv4 allows */
	return 0;
}

/* XDP ingress, an AGREE_VALUE of a communicator with a control slot. */
static __always_inline int aggbox_xdp_agree_value(struct xdp_md *ctx, struct aggbox_pkt *pkt)
{
	void *data_end = (void *)(long)ctx->data_end;
	struct aggbox_hdr *hdr = pkt->hdr;
	struct aggbox_agree_body *body = pkt->payload;
	struct aggbox_agreectl *ctl;
	__u32 ctl_idx = pkt->ctl, seq = hdr->seq, chunk = hdr->chunk, phase, word, count;
	__u16 sender = hdr->sender, flags = hdr->flags;
	__u64 key, bit, old;

	if ((void *)(body + 1) > data_end ||
	    bpf_ntohs(pkt->udp->len) < sizeof(struct udphdr) + AGGBOX_HDR_LEN + AGGBOX_AGREE_BODY_LEN) {
		aggbox_acount(AGGBOX_ASTAT_MALFORMED);
		return XDP_DROP;
	}
	key = aggbox_agree_key(body->value);
	ctl = bpf_map_lookup_elem(&ab_agree, &ctl_idx);
	if (!ctl)
		goto pass;
	if (AGGBOX_READ_ONCE(ctl->seq) == 0 || seq != AGGBOX_READ_ONCE(ctl->seq))
		goto pass; /* the process decides */

	/* Announce this fold, then look at the phase (see the top). */
	__sync_fetch_and_add(&ctl->inflight, 1);
	phase = AGGBOX_READ_ONCE(ctl->phase);
	/* The agreement again, after the phase: the process writes seq before
	 * it stores a phase, so this is the seq of the phase read above. */
	if (phase == AGGBOX_AGREE_NO_PHASE || AGGBOX_READ_ONCE(ctl->seq) != seq) {
		__sync_fetch_and_sub(&ctl->inflight, 1);
		goto pass;
	}
	if (hdr->nchunks != ctl->last) {
		/* Another number of phases: a rank started with another
		 * epsilon or other bounds. The process reports the mismatch. */
		__sync_fetch_and_sub(&ctl->inflight, 1);
		goto pass;
	}

	if (chunk == phase) {
		/* Min and max first: a repeat re-folds the same value, harmless. */
		if (aggbox_agree_fold_key(&ctl->min_key, key, 0) || aggbox_agree_fold_key(&ctl->max_key, key, 1)) {
			__sync_fetch_and_sub(&ctl->inflight, 1);
			aggbox_acount(AGGBOX_ASTAT_CONTENDED);
			return XDP_PASS; /* the process folds it */
		}
		word = (sender / 64) & (AGGBOX_RANK_WORDS - 1);
		bit = 1ULL << (sender % 64);
		old = __sync_fetch_and_or(&ctl->senders[word], bit);
		if (phase == ctl->last &&
		    (flags & (AGGBOX_FLAG_RETRANSMIT | AGGBOX_FLAG_ANSWER)) == AGGBOX_FLAG_RETRANSMIT) {
			/* Decided, and a decided sender repeats its final value:
			 * it has not heard that this rank decided too. Recorded
			 * (the bit) and answered with this rank's final value. */
			if (!(old & bit))
				__sync_fetch_and_add(&ctl->count, 1);
			if (pkt->ip->ihl == 5 && !aggbox_agree_answer(ctx, ctl)) {
				__sync_fetch_and_sub(&ctl->inflight, 1);
				aggbox_acount(AGGBOX_ASTAT_ANSWERED);
				return XDP_TX;
			}
			__sync_fetch_and_sub(&ctl->inflight, 1);
			aggbox_acount(AGGBOX_ASTAT_FOLDED);
			return XDP_DROP;
		}
		if (old & bit) {
			__sync_fetch_and_sub(&ctl->inflight, 1);
			aggbox_acount(AGGBOX_ASTAT_DUPLICATES);
			return XDP_DROP;
		}
		count = __sync_fetch_and_add(&ctl->count, 1) + 1;
		if (count >= ctl->quorum && __sync_val_compare_and_swap(&ctl->notified, 0, 1) == 0) {
			__sync_fetch_and_sub(&ctl->inflight, 1);
			/* The phase's one wake-up: this value, as the notice. */
			hdr->kind = AGGBOX_KIND_AGREE_QUORUM;
			pkt->udp->check = 0; /* the header changed */
			aggbox_acount(AGGBOX_ASTAT_QUORUMS);
			return XDP_PASS;
		}
		__sync_fetch_and_sub(&ctl->inflight, 1);
		aggbox_acount(AGGBOX_ASTAT_FOLDED);
		return XDP_DROP;
	}
	if (chunk > phase) {
		/* The sender is ahead (or sent its final value): the process
		 * jumps ahead. */
		__sync_fetch_and_sub(&ctl->inflight, 1);
		aggbox_acount(AGGBOX_ASTAT_AHEAD);
		return XDP_PASS;
	}
	if (flags & AGGBOX_FLAG_ANSWER) {
		/* An answer to a phase this rank has left: nothing to learn. */
		__sync_fetch_and_sub(&ctl->inflight, 1);
		aggbox_acount(AGGBOX_ASTAT_STALE);
		return XDP_DROP;
	}
	/* The sender lags: answer it with this rank's value of ans_phase. The
	 * block stays held (inflight) while the answer is read. */
	if (pkt->ip->ihl != 5 || aggbox_agree_answer(ctx, ctl)) {
		__sync_fetch_and_sub(&ctl->inflight, 1);
		goto pass;
	}
	__sync_fetch_and_sub(&ctl->inflight, 1);
	aggbox_acount(AGGBOX_ASTAT_ANSWERED);
	return XDP_TX;

pass:
	aggbox_acount(AGGBOX_ASTAT_PASSED);
	return XDP_PASS;
}

#endif /* AGGBOX_AGREE_H */
