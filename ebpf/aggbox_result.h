/* SPDX-License-Identifier: Apache-2.0 */
/*
 * TC ingress, the fan-out of a reduction result (docs/ALLREDUCE.md,
 * "Results in the kernel"): XDP turned the contribution that completed an
 * owned chunk into the chunk's RED_RESULT (flagged FANOUT, still addressed
 * from the contributor to this host) and passed it up, because XDP cannot
 * copy a packet and TC can. Here it is sent, from this rank, to the members
 * that get the result (allreduce: all; reduce: the root), then cut to its
 * header and sent as RED_DONE to the other contributors (reduce,
 * reduce-scatter); then it is dropped, or (flagged NOTIFY) goes up to the
 * process as its RED_LANDED notice.
 */
#ifndef AGGBOX_RESULT_H
#define AGGBOX_RESULT_H

#include "aggbox_bcast.h"

/* The IPv4 destination and UDP destination port (network order) of the frame. */
static __always_inline int aggbox_tc_dest(struct __sk_buff *skb, __u32 *ip, __u16 *port)
{
	void *data = aggbox_skb_data(skb);
	void *data_end = aggbox_skb_data_end(skb);
	struct iphdr *iph = data + AGGBOX_OFF_IP;
	struct udphdr *udp = data + AGGBOX_OFF_UDP;

	if ((void *)(udp + 1) > data_end)
		return -1;
	*ip = iph->daddr;
	*port = udp->dest;
	return 0;
}

/* Points the frame (of `chunks` results) at `rank` (key->group set) and
 * sends a copy there. */
static __always_inline int aggbox_tc_red_copy(struct __sk_buff *skb, struct aggbox_member_key *key, __u32 rank,
					       __u32 chunks, __u32 *cur_ip, __u16 *cur_port)
{
	struct aggbox_member *member;

	key->rank = rank;
	member = bpf_map_lookup_elem(&ab_members, key);
	if (!member || aggbox_retarget(skb, member, cur_ip, cur_port))
		return -1;
	if (bpf_clone_redirect(skb, skb->ifindex, 0) == 0)
		aggbox_rcount_n(AGGBOX_RSTAT_FANNED_OUT, chunks);
	return 0;
}

/* The copies' loop, run by bpf_loop: its body is verified once, not once
 * per member (an unrolled walk of 255 members took the verifier 170 ms). */
struct aggbox_copies {
	struct __sk_buff *skb;
	struct aggbox_member_key key;
	__u32 me;
	__u32 size;
	__u32 skip; /* a rank that gets no copy (this one, or the root that got the result) */
	__u32 cur_ip;
	__u32 chunks; /* results per copy: a super-chunk's segments, else 1 */
	__u16 cur_port;
	__u16 failed;
};

static long aggbox_tc_red_copy_one(__u64 i, void *data);

/* Sends a copy of the frame (of `chunks` results, addressed to `*cur_ip`,
 * `*cur_port`) to every member of `key->group` but `me` and `skip`;
 * returns whether one could not be addressed, and where the frame points
 * now. */
static __always_inline int aggbox_tc_red_copies(struct __sk_buff *skb, struct aggbox_member_key *key, __u32 me,
						 __u32 size, __u32 skip, __u32 chunks, __u32 *cur_ip, __u16 *cur_port)
{
	struct aggbox_copies copies;

	copies.skb = skb;
	copies.key = *key;
	copies.me = me;
	copies.size = size;
	copies.skip = skip;
	copies.cur_ip = *cur_ip;
	copies.cur_port = *cur_port;
	copies.chunks = chunks;
	copies.failed = 0;
	bpf_loop(size - 1, aggbox_tc_red_copy_one, &copies, 0);
	*cur_ip = copies.cur_ip;
	*cur_port = copies.cur_port;
	return copies.failed;
}

static long aggbox_tc_red_copy_one(__u64 i, void *data)
{
	struct aggbox_copies *c = data;
	__u32 rank;

	if (c->size == 0)
		return 1;
	rank = (c->me + (__u32)i + 1) % c->size;
	if (rank == c->skip)
		return 0;
	if (aggbox_tc_red_copy(c->skb, &c->key, rank, c->chunks, &c->cur_ip, &c->cur_port)) {
		c->failed = 1;
		return 1;
	}
	return 0;
}

/*
 * Makes the frame, after its copies went out, the RED_LANDED notice of
 * reduction `red` for the process: addressed as it came, from `contributor`
 * to here (a helper first: it makes the frame private again after the
 * copies), cut to its header when `strip`. `key->group` is set; the frame
 * is addressed to `*cur_ip`, `*cur_port` now.
 */
static __always_inline int aggbox_tc_red_notice(struct __sk_buff *skb, struct aggbox_member_key *key, __u16 contributor,
						 struct aggbox_redctl *red, __u32 *cur_ip, __u16 *cur_port, int strip)
{
	struct aggbox_member *member;
	struct aggbox_hdr *hdr;

	key->rank = contributor;
	member = bpf_map_lookup_elem(&ab_members, key);
	if (!member || aggbox_retarget(skb, member, cur_ip, cur_port) || aggbox_tc_swap(skb))
		return TC_ACT_SHOT;
	hdr = strip ? aggbox_tc_strip(skb) : aggbox_tc_hdr(skb);
	if (!hdr)
		return TC_ACT_SHOT;
	hdr->kind = AGGBOX_KIND_RED_LANDED;
	hdr->sender = contributor;
	hdr->flags = 0;
	hdr->count = red->landed;
	aggbox_rcount(AGGBOX_RSTAT_LANDED);
	return TC_ACT_OK;
}

static __always_inline int aggbox_tc_red_fanout(struct __sk_buff *skb, struct aggbox_pkt *pkt)
{
	struct aggbox_member_key key;
	struct aggbox_redctl *red;
	struct aggbox_ctl *ctl;
	struct aggbox_hdr *hdr;
	__u32 ctl_idx = pkt->ctl, cur_ip, me, size, coll = pkt->hdr->op >> 4, root, skip;
	__u16 cur_port, flags = pkt->hdr->flags, contributor = pkt->hdr->sender;

	if (pkt->ip->ihl != 5)
		return TC_ACT_SHOT;
	ctl = bpf_map_lookup_elem(&ab_ctl, &ctl_idx);
	if (!ctl)
		return TC_ACT_SHOT;
	red = &ctl->red[pkt->hdr->seq & (AGGBOX_RED_PHASES - 1)];
	me = red->rank;
	size = red->ranks;
	root = red->root;
	key.group = pkt->hdr->group;
	if (size > AGGBOX_MAX_RANKS || me >= size)
		return TC_ACT_SHOT;

	/* From this rank now: the ends swap (the checksums do not change). */
	if (aggbox_tc_swap(skb))
		return TC_ACT_SHOT;
	hdr = aggbox_tc_hdr(skb);
	if (!hdr)
		return TC_ACT_SHOT;
	hdr->sender = me;
	hdr->flags = 0;
	if (aggbox_tc_dest(skb, &cur_ip, &cur_port))
		return TC_ACT_SHOT;
	/* The skb's pointers are invalid from the first helper call on.
	 * Allreduce: the result to every other member. Reduce: the result to
	 * the root, then a DONE to the others. Reduce-scatter: a DONE to every
	 * other member. */
	skip = me;
	if (coll != AGGBOX_COLL_ALLREDUCE) {
		if (coll == AGGBOX_COLL_REDUCE && root != me) {
			if (root >= size || aggbox_tc_red_copy(skb, &key, root, 1, &cur_ip, &cur_port))
				return TC_ACT_SHOT;
			skip = root;
		}
		hdr = aggbox_tc_strip(skb);
		if (!hdr)
			return TC_ACT_SHOT;
		hdr->kind = AGGBOX_KIND_RED_DONE;
	}
	if (aggbox_tc_red_copies(skb, &key, me, size, skip, 1, &cur_ip, &cur_port))
		return TC_ACT_SHOT;
	if (!(flags & AGGBOX_FLAG_NOTIFY))
		return TC_ACT_SHOT; /* its work is done */

	return aggbox_tc_red_notice(skb, &key, contributor, red, &cur_ip, &cur_port, 0);
}

#endif /* AGGBOX_RESULT_H */
