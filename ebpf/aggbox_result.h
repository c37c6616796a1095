/* SPDX-License-Identifier: Apache-2.0 */
/*
 * TC ingress, the fan-out of a reduction result (docs/ALLREDUCE.md,
 * "Results in the kernel"): XDP turned the contribution that completed an
 * owned chunk of an allreduce into the chunk's RED_RESULT (flagged FANOUT,
 * still addressed from the contributor to this host) and passed it up,
 * because XDP cannot copy a packet and TC can. Here it is sent, from this
 * rank, to every other member; then it is dropped, or (flagged NOTIFY)
 * goes up to the process as its RED_LANDED notice.
 */
#ifndef AGGBOX_RESULT_H
#define AGGBOX_RESULT_H

#include "aggbox_bcast.h"

/* The IPv4 destination and UDP destination port (network order) of the frame. */
static __always_inline int aggbox_tc_dest(struct __sk_buff *skb, __u32 *ip, __u16 *port)
{
	void *data = (void *)(long)skb->data;
	void *data_end = (void *)(long)skb->data_end;
	struct iphdr *iph = data + AGGBOX_OFF_IP;
	struct udphdr *udp = data + AGGBOX_OFF_UDP;

	if ((void *)(udp + 1) > data_end)
		return -1;
	*ip = iph->daddr;
	*port = udp->dest;
	return 0;
}

static __always_inline int aggbox_tc_red_fanout(struct __sk_buff *skb, struct aggbox_pkt *pkt)
{
	struct aggbox_member_key key;
	struct aggbox_member *member;
	struct aggbox_redctl *red;
	struct aggbox_ctl *ctl;
	struct aggbox_hdr *hdr;
	__u32 ctl_idx = pkt->ctl, cur_ip, me, size, i;
	__u16 cur_port, flags = pkt->hdr->flags, contributor = pkt->hdr->sender;

	if (pkt->ip->ihl != 5)
		return TC_ACT_SHOT;
	ctl = bpf_map_lookup_elem(&ab_ctl, &ctl_idx);
	if (!ctl)
		return TC_ACT_SHOT;
	red = &ctl->red[pkt->hdr->seq & (AGGBOX_RED_PHASES - 1)];
	me = red->rank;
	size = red->ranks;
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
	/* The skb's pointers are invalid from the first helper call on. */
	for (i = 1; i < AGGBOX_MAX_RANKS; i++) {
		if (i >= size)
			break;
		key.rank = (me + i) % size;
		member = bpf_map_lookup_elem(&ab_members, &key);
		if (!member || aggbox_retarget(skb, member, &cur_ip, &cur_port))
			return TC_ACT_SHOT;
		if (bpf_clone_redirect(skb, skb->ifindex, 0) == 0)
			aggbox_rcount(AGGBOX_RSTAT_FANNED_OUT);
	}
	if (!(flags & AGGBOX_FLAG_NOTIFY))
		return TC_ACT_SHOT; /* its work is done */

	/* The notice: addressed as it came, from the contributor to here. */
	key.rank = contributor;
	member = bpf_map_lookup_elem(&ab_members, &key);
	if (!member || aggbox_retarget(skb, member, &cur_ip, &cur_port) || aggbox_tc_swap(skb))
		return TC_ACT_SHOT;
	hdr = aggbox_tc_hdr(skb);
	if (!hdr)
		return TC_ACT_SHOT;
	hdr->kind = AGGBOX_KIND_RED_LANDED;
	hdr->sender = contributor;
	hdr->flags = 0;
	hdr->count = red->landed;
	aggbox_rcount(AGGBOX_RSTAT_LANDED);
	return TC_ACT_OK;
}

#endif /* AGGBOX_RESULT_H */
