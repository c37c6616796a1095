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

/* What the fold of an AGREE_VALUE decided (aggbox_agree_fold). */
enum aggbox_agree_verdict {
	AGGBOX_AGREE_PASS, /* up to the process unchanged */
	AGGBOX_AGREE_DROP, /* folded, a duplicate or stale: consumed */
	AGGBOX_AGREE_QUORUM, /* the phase's one wake-up: up, as AGREE_QUORUM */
	AGGBOX_AGREE_ANSWER, /* turn it into the answer it carries back */
};

/* This rank's answer to a rank that lags (or that repeats its final
 * value): the value it sent for `phase`, from `rank`. */
struct aggbox_agree_answer {
	__u64 value;
	__u32 phase;
	__u32 incarnation;
	__u32 last;
	__u16 rank;
};

/* Reads the answer under the ans_gen seqlock; -1 while the process is
 * writing it (the value then goes up, and the process answers). */
static __always_inline int aggbox_agree_read_answer(struct aggbox_agreectl *ctl, struct aggbox_agree_answer *ans)
{
	__u32 g1, g2;

	g1 = AGGBOX_READ_ONCE(ctl->ans_gen);
	if (g1 & 1)
		return -1;
	ans->phase = AGGBOX_READ_ONCE(ctl->ans_phase);
	ans->value = AGGBOX_READ_ONCE(ctl->ans_value);
	ans->incarnation = AGGBOX_READ_ONCE(ctl->ans_incarnation);
	g2 = AGGBOX_READ_ONCE(ctl->ans_gen);
	if (g1 != g2)
		return -1;
	ans->rank = ctl->rank;
	ans->last = ctl->last;
	return 0;
}

/*
 * Writes `ans` over a datagram cut to header + body, turned around: flagged
 * ANSWER, from ans->rank, IPv4 and UDP lengths fixed, UDP checksum none (as
 * IPv4 allows). The caller checked that the body is within the frame.
 */
static __always_inline void aggbox_agree_write_answer(struct ethhdr *eth, struct aggbox_agree_answer *ans)
{
	struct iphdr *ip = (void *)(eth + 1);
	struct udphdr *udp = (void *)(ip + 1);
	struct aggbox_hdr *hdr = (void *)(udp + 1);
	struct aggbox_agree_body *body = (void *)(hdr + 1);
	__u16 old_len = ip->tot_len;
	__u16 new_len = bpf_htons(sizeof(*ip) + sizeof(*udp) + AGGBOX_HDR_LEN + AGGBOX_AGREE_BODY_LEN);

	aggbox_swap_ends(eth, ip, udp);
	hdr->sender = ans->rank;
	hdr->chunk = ans->phase;
	hdr->nchunks = ans->last;
	hdr->flags = AGGBOX_FLAG_ANSWER;
	body->value = ans->value;
	body->incarnation = ans->incarnation;
	body->reserved = 0;
	ip->check = aggbox_csum_replace2(ip->check, old_len, new_len);
	ip->tot_len = new_len;
	udp->len = bpf_htons(sizeof(*udp) + AGGBOX_HDR_LEN + AGGBOX_AGREE_BODY_LEN);
	udp->check = 0;
}

/*
 * The fold of an AGREE_VALUE of a communicator with a control slot, the
 * same for XDP and TC (the top of this file says what it does). `body` is
 * the datagram's body, within the packet; an ANSWER verdict fills `ans`.
 */
static __always_inline enum aggbox_agree_verdict aggbox_agree_fold(struct aggbox_pkt *pkt, struct aggbox_agree_body *body,
								   struct aggbox_agree_answer *ans)
{
	struct aggbox_hdr *hdr = pkt->hdr;
	struct aggbox_agreectl *ctl;
	__u32 ctl_idx = pkt->ctl, seq = hdr->seq, chunk = hdr->chunk, phase, word, count;
	__u16 sender = hdr->sender, flags = hdr->flags;
	__u64 key, bit, old;
	enum aggbox_agree_verdict verdict;

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
			return AGGBOX_AGREE_PASS; /* the process folds it */
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
			verdict = pkt->ip->ihl == 5 && !aggbox_agree_read_answer(ctl, ans) ? AGGBOX_AGREE_ANSWER
											 : AGGBOX_AGREE_DROP;
			__sync_fetch_and_sub(&ctl->inflight, 1);
			if (verdict == AGGBOX_AGREE_DROP)
				aggbox_acount(AGGBOX_ASTAT_FOLDED);
			return verdict;
		}
		if (old & bit) {
			__sync_fetch_and_sub(&ctl->inflight, 1);
			aggbox_acount(AGGBOX_ASTAT_DUPLICATES);
			return AGGBOX_AGREE_DROP;
		}
		count = __sync_fetch_and_add(&ctl->count, 1) + 1;
		if (count >= ctl->quorum && __sync_val_compare_and_swap(&ctl->notified, 0, 1) == 0) {
			__sync_fetch_and_sub(&ctl->inflight, 1);
			aggbox_acount(AGGBOX_ASTAT_QUORUMS);
			return AGGBOX_AGREE_QUORUM;
		}
		__sync_fetch_and_sub(&ctl->inflight, 1);
		aggbox_acount(AGGBOX_ASTAT_FOLDED);
		return AGGBOX_AGREE_DROP;
	}
	if (chunk > phase) {
		/* The sender is ahead (or sent its final value): the process
		 * jumps ahead. */
		__sync_fetch_and_sub(&ctl->inflight, 1);
		aggbox_acount(AGGBOX_ASTAT_AHEAD);
		return AGGBOX_AGREE_PASS;
	}
	if (flags & AGGBOX_FLAG_ANSWER) {
		/* An answer to a phase this rank has left: nothing to learn. */
		__sync_fetch_and_sub(&ctl->inflight, 1);
		aggbox_acount(AGGBOX_ASTAT_STALE);
		return AGGBOX_AGREE_DROP;
	}
	/* The sender lags: answer it with this rank's value of ans_phase, read
	 * while the block is held (inflight). */
	verdict = pkt->ip->ihl == 5 && !aggbox_agree_read_answer(ctl, ans) ? AGGBOX_AGREE_ANSWER : AGGBOX_AGREE_PASS;
	__sync_fetch_and_sub(&ctl->inflight, 1);
	if (verdict == AGGBOX_AGREE_PASS)
		goto pass;
	return verdict;

pass:
	aggbox_acount(AGGBOX_ASTAT_PASSED);
	return AGGBOX_AGREE_PASS;
}

/* Whether an AGREE_VALUE's body is within [body, data_end) and its UDP
 * length; counted as malformed when not. */
static __always_inline int aggbox_agree_body_ok(struct aggbox_pkt *pkt, void *data_end)
{
	if ((void *)((struct aggbox_agree_body *)pkt->payload + 1) > data_end ||
	    bpf_ntohs(pkt->udp->len) < sizeof(struct udphdr) + AGGBOX_HDR_LEN + AGGBOX_AGREE_BODY_LEN) {
		aggbox_acount(AGGBOX_ASTAT_MALFORMED);
		return 0;
	}
	return 1;
}

/* XDP ingress, an AGREE_VALUE of a communicator with a control slot. */
static __always_inline int aggbox_xdp_agree_value(struct xdp_md *ctx, struct aggbox_pkt *pkt)
{
	struct aggbox_agree_answer ans = {};
	__u32 want = AGGBOX_OFF_PAYLOAD + AGGBOX_AGREE_BODY_LEN, len;
	void *data, *data_end;

	if (!aggbox_agree_body_ok(pkt, (void *)(long)ctx->data_end))
		return XDP_DROP;
	switch (aggbox_agree_fold(pkt, pkt->payload, &ans)) {
	case AGGBOX_AGREE_DROP:
		return XDP_DROP;
	case AGGBOX_AGREE_QUORUM:
		pkt->hdr->kind = AGGBOX_KIND_AGREE_QUORUM;
		pkt->udp->check = 0; /* the header changed */
		return XDP_PASS;
	case AGGBOX_AGREE_ANSWER:
		len = bpf_xdp_get_buff_len(ctx);
		if (len < want || (len > want && bpf_xdp_adjust_tail(ctx, -(int)(len - want))))
			goto unanswered;
		data = (void *)(long)ctx->data;
		data_end = (void *)(long)ctx->data_end;
		if (data + want > data_end)
			goto unanswered;
		aggbox_agree_write_answer(data, &ans);
		aggbox_acount(AGGBOX_ASTAT_ANSWERED);
		return XDP_TX;
	case AGGBOX_AGREE_PASS:
	default:
		return XDP_PASS;
	}
unanswered:
	aggbox_acount(AGGBOX_ASTAT_PASSED);
	return XDP_PASS; /* the process answers it */
}

/* TC ingress on the TC hooks, the same: the answer goes back out of the
 * interface from here (bpf_redirect). Only single datagrams: agreement
 * values are not sent as super-packets. */
static __always_inline int aggbox_tc_agree_value(struct __sk_buff *skb, struct aggbox_pkt *pkt)
{
	struct aggbox_agree_answer ans = {};
	__u32 want = AGGBOX_OFF_PAYLOAD + AGGBOX_AGREE_BODY_LEN;
	struct aggbox_hdr *hdr;
	void *data, *data_end;

	if (skb->gso_segs > 1 || pkt->ip->ihl != 5) {
		aggbox_acount(AGGBOX_ASTAT_PASSED);
		return TC_ACT_OK;
	}
	/* The body into the linear area (the parse pulled the header). */
	if (skb->len >= want && bpf_skb_pull_data(skb, want))
		return TC_ACT_OK;
	/* The packet's pointers again, after the pull (the parse checked the
	 * headers, and IPv4 has no options). */
	data = aggbox_skb_data(skb);
	data_end = aggbox_skb_data_end(skb);
	if (data + AGGBOX_OFF_PAYLOAD > data_end)
		return TC_ACT_OK;
	pkt->eth = data;
	pkt->ip = data + AGGBOX_OFF_IP;
	pkt->udp = data + AGGBOX_OFF_UDP;
	pkt->hdr = data + AGGBOX_OFF_UDP + sizeof(struct udphdr);
	pkt->payload = data + AGGBOX_OFF_PAYLOAD;
	if (!aggbox_agree_body_ok(pkt, data_end))
		return TC_ACT_SHOT;
	switch (aggbox_agree_fold(pkt, pkt->payload, &ans)) {
	case AGGBOX_AGREE_DROP:
		return TC_ACT_SHOT;
	case AGGBOX_AGREE_QUORUM:
		hdr = aggbox_tc_hdr(skb);
		if (!hdr)
			return TC_ACT_SHOT;
		hdr->kind = AGGBOX_KIND_AGREE_QUORUM;
		data = aggbox_skb_data(skb);
		data_end = aggbox_skb_data_end(skb);
		if (data + AGGBOX_OFF_PAYLOAD > data_end)
			return TC_ACT_SHOT;
		((struct udphdr *)(data + AGGBOX_OFF_UDP))->check = 0; /* the header changed */
		return TC_ACT_OK;
	case AGGBOX_AGREE_ANSWER:
		if (skb->len != want && bpf_skb_change_tail(skb, want, 0))
			goto unanswered;
		data = aggbox_skb_data(skb);
		data_end = aggbox_skb_data_end(skb);
		if (data + want > data_end)
			goto unanswered;
		aggbox_agree_write_answer(data, &ans);
		aggbox_acount(AGGBOX_ASTAT_ANSWERED);
		return bpf_redirect(skb->ifindex, 0);
	case AGGBOX_AGREE_PASS:
	default:
		return TC_ACT_OK;
	}
unanswered:
	aggbox_acount(AGGBOX_ASTAT_PASSED);
	return TC_ACT_OK; /* the process answers it */
}

#endif /* AGGBOX_AGREE_H */
