/* SPDX-License-Identifier: Apache-2.0 */
/*
 * The barrier in the kernel (docs/BARRIER.md, "Kernel datapath"): rank 0's
 * TC ingress counts the BARRIER_ARRIVEs of the open barrier in its control
 * block's `bar` (struct aggbox_barctl) and drops them, so rank 0's process
 * is not woken once per rank. The arrival that completes the barrier is
 * sent to every other member as its BARRIER_RELEASE (bpf_clone_redirect)
 * and then goes up to the process as BARRIER_DONE, its one wake-up.
 *
 * - Of the open barrier, a rank not counted yet: its bit is claimed (a
 *   repeat finds it set and is dropped), then the count is taken by
 *   compare-and-swap on `state`; the swap that makes the count `size`
 *   opens the next barrier in the same step. If rank 0's process entered
 *   last, its own swap completed the barrier and it sends the releases.
 * - Of the barrier just completed: the rank lost its release and asked
 *   again; it is answered with the release (bpf_redirect).
 * - Anything else (not armed, aborted, another barrier, a swap that could
 *   not be taken because the process aborted meanwhile) goes up unchanged,
 *   and the process counts it with the same atomics on the mapped block
 *   (Windows::arrive) or answers it.
 */
#ifndef AGGBOX_BARRIER_H
#define AGGBOX_BARRIER_H

#include "aggbox_result.h"

#ifndef AGGBOX_READ_ONCE
#define AGGBOX_READ_ONCE(x) (*(volatile typeof(x) *)&(x))
#endif

/* What counting an arrival decided (aggbox_bar_fold). */
enum aggbox_bar_verdict {
	AGGBOX_BAR_PASS, /* up to the process unchanged */
	AGGBOX_BAR_DROP, /* counted, a repeat, or uncounted after lost swaps: consumed */
	AGGBOX_BAR_ANSWER, /* of the barrier just completed: turn it into its release */
	AGGBOX_BAR_COMPLETE, /* it completed the open barrier: release everyone */
};

static __always_inline __u64 aggbox_bar_state(__u32 seq, __u32 count)
{
	return ((__u64)seq << 32) | count;
}

/* Counts an arrival of barrier `seq` from `rank` (the top of this file
 * says how). */
static __always_inline enum aggbox_bar_verdict aggbox_bar_fold(struct aggbox_barctl *bar, __u32 seq, __u32 rank)
{
	__u64 state, next, bit, *word;
	__u32 size, open, count, t;

	size = AGGBOX_READ_ONCE(bar->size);
	if (size == 0 || size > AGGBOX_MAX_RANKS || rank == 0 || rank >= size) {
		aggbox_bcount(AGGBOX_BSTAT_BARRIER_TO_USER);
		return AGGBOX_BAR_PASS;
	}
	state = AGGBOX_READ_ONCE(bar->state);
	open = state >> 32;
	if (seq == open - 1) {
		aggbox_bcount(AGGBOX_BSTAT_BARRIER_ANSWERED);
		return AGGBOX_BAR_ANSWER;
	}
	if (seq != open || ((__u32)state & AGGBOX_BAR_ABORTED)) {
		aggbox_bcount(AGGBOX_BSTAT_BARRIER_TO_USER);
		return AGGBOX_BAR_PASS;
	}
	word = &bar->bits[seq & 1][rank / 64];
	bit = 1ULL << (rank % 64);
	if (__sync_fetch_and_or(word, bit) & bit) {
		aggbox_bcount(AGGBOX_BSTAT_BARRIER_DUPLICATES);
		return AGGBOX_BAR_DROP;
	}
	for (t = 0; t < AGGBOX_BAR_TRIES; t++) {
		state = AGGBOX_READ_ONCE(bar->state);
		count = (__u32)state;
		if ((__u32)(state >> 32) != seq || (count & AGGBOX_BAR_ABORTED)) {
			/* Aborted meanwhile: the process answers it. */
			__sync_fetch_and_and(word, ~bit);
			aggbox_bcount(AGGBOX_BSTAT_BARRIER_TO_USER);
			return AGGBOX_BAR_PASS;
		}
		next = count + 1 >= size ? aggbox_bar_state(seq + 1, 0) : state + 1;
		if (__sync_val_compare_and_swap(&bar->state, state, next) != state)
			continue;
		if (count + 1 < size) {
			aggbox_bcount(AGGBOX_BSTAT_BARRIER_FOLDED);
			return AGGBOX_BAR_DROP;
		}
		/* The next barrier's arrivals come only after its releases:
		 * its bitmap (barrier seq - 1's) is cleared before they go. */
		word = bar->bits[(seq + 1) & 1];
		for (t = 0; t < AGGBOX_RANK_WORDS; t++)
			AGGBOX_READ_ONCE(word[t]) = 0;
		aggbox_bcount(AGGBOX_BSTAT_BARRIER_RELEASED);
		return AGGBOX_BAR_COMPLETE;
	}
	/* Uncounted: dropped, and the rank repeats it on its timer. */
	__sync_fetch_and_and(word, ~bit);
	aggbox_bcount(AGGBOX_BSTAT_BARRIER_CONTENDED);
	return AGGBOX_BAR_DROP;
}

/* Turns the (header-only) arrival around into barrier `seq`'s release
 * from rank 0: cut to its header, ends swapped. Returns the header. */
static __always_inline struct aggbox_hdr *aggbox_tc_bar_release(struct __sk_buff *skb)
{
	struct aggbox_hdr *hdr;

	hdr = aggbox_tc_strip(skb);
	if (!hdr || aggbox_tc_swap(skb))
		return NULL;
	hdr = aggbox_tc_hdr(skb);
	if (!hdr)
		return NULL;
	hdr->kind = AGGBOX_KIND_BARRIER_RELEASE;
	hdr->sender = 0;
	hdr->flags = 0;
	return hdr;
}

/*
 * A BARRIER_ARRIVE at a communicator with a control block. The completing
 * one is sent, as the release, to every member but rank 0, then back to
 * the process as BARRIER_DONE from the rank that completed it, flagged
 * ANSWERED when every release was addressed (else the process sends them).
 */
static __always_inline int aggbox_tc_barrier_arrive(struct __sk_buff *skb, struct aggbox_pkt *pkt)
{
	struct aggbox_member_key key;
	struct aggbox_member *member;
	struct aggbox_ctl *ctl;
	struct aggbox_hdr *hdr;
	__u32 ctl_idx = pkt->ctl, size, cur_ip;
	__u16 cur_port, arriver = pkt->hdr->sender, flags = AGGBOX_FLAG_ANSWERED;

	if (pkt->ip->ihl != 5)
		return TC_ACT_OK;
	ctl = bpf_map_lookup_elem(&ab_ctl, &ctl_idx);
	if (!ctl)
		return TC_ACT_OK;
	key.group = pkt->hdr->group;
	switch (aggbox_bar_fold(&ctl->bar, pkt->hdr->seq, arriver)) {
	case AGGBOX_BAR_DROP:
		return TC_ACT_SHOT;
	case AGGBOX_BAR_ANSWER:
		/* The packet's pointers are invalid from here on. */
		if (!aggbox_tc_bar_release(skb))
			return TC_ACT_OK;
		return bpf_redirect(skb->ifindex, 0);
	case AGGBOX_BAR_COMPLETE:
		break;
	default:
		return TC_ACT_OK;
	}

	size = ctl->bar.size;
	if (size > AGGBOX_MAX_RANKS || !aggbox_tc_bar_release(skb) || aggbox_tc_dest(skb, &cur_ip, &cur_port))
		return TC_ACT_OK; /* as it came, or cut to a release the process ignores: it releases */
	if (aggbox_tc_red_copies(skb, &key, 0, size, 0, 0, &cur_ip, &cur_port))
		flags = 0;
	/* Back to the process, from the rank that completed it. */
	key.rank = arriver;
	member = bpf_map_lookup_elem(&ab_members, &key);
	if (!member || aggbox_retarget(skb, member, &cur_ip, &cur_port) || aggbox_tc_swap(skb))
		return TC_ACT_SHOT;
	hdr = aggbox_tc_hdr(skb);
	if (!hdr)
		return TC_ACT_SHOT;
	hdr->kind = AGGBOX_KIND_BARRIER_DONE;
	hdr->sender = arriver;
	hdr->flags = flags;
	return TC_ACT_OK;
}

#endif /* AGGBOX_BARRIER_H */
