/* SPDX-License-Identifier: Apache-2.0 */
/*
 * Classifying a frame: is it AggBox's, and if so is it valid for a group that
 * this host serves? Shared by every AggBox program (XDP and TC alike work on
 * the linear frame between data and data_end).
 */
#ifndef AGGBOX_PARSE_H
#define AGGBOX_PARSE_H

#include <linux/if_ether.h>
#include <linux/in.h>
#include <linux/ip.h>
#include <linux/udp.h>
#include <bpf/bpf_endian.h>
#include "aggbox_maps.h"

/* The IP "fragment offset" and "more fragments" bits. */
#define AGGBOX_IP_FRAG_MASK 0x3fff



enum aggbox_verdict {
	AGGBOX_OTHER = 0, /* not AggBox's: let it through untouched */
	AGGBOX_VALID = 1, /* a valid datagram of a group served here */
	AGGBOX_INVALID = 2, /* AggBox's, but malformed or not from a member: drop */
};

/* Which UDP port identifies our communicator: the destination of what comes
 * in, the source of what goes out. */
enum aggbox_dir {
	AGGBOX_DIR_IN = 0,
	AGGBOX_DIR_OUT = 1,
};

struct aggbox_pkt {
	struct ethhdr *eth;
	struct iphdr *ip;
	struct udphdr *udp;
	struct aggbox_hdr *hdr;
	void *payload; /* right after the header */
	__u32 ctl; /* the local communicator's control block (AGGBOX_NO_CTL: none) */
};

/*
 * skb->data and skb->data_end as packet pointers. Read with a plain load, a
 * BPF v3 build (32-bit ALU) may copy the value through a 32-bit register,
 * which the verifier then takes for a scalar and refuses; a load it cannot
 * see the width of keeps it a 64-bit register.
 */
#define AGGBOX_SKB_PTR(skb, field)                                                                   \
	({                                                                                          \
		void *ptr_;                                                                          \
		asm volatile("%[p] = *(u32 *)(%[ctx] + %[off])"                                      \
			     : [p] "=r"(ptr_)                                                        \
			     : [ctx] "r"(skb), [off] "i"(offsetof(struct __sk_buff, field)));       \
		ptr_;                                                                                \
	})
#define aggbox_skb_data(skb) AGGBOX_SKB_PTR(skb, data)
#define aggbox_skb_data_end(skb) AGGBOX_SKB_PTR(skb, data_end)

static __always_inline enum aggbox_verdict aggbox_drop(enum aggbox_prog prog,
						       enum aggbox_stat why)
{
	aggbox_count(prog, why);
	return AGGBOX_INVALID;
}

/*
 * Classifies the frame in [data, data_end) and counts the outcome under prog.
 * On AGGBOX_VALID, *pkt points at each layer of the frame.
 */
static __always_inline enum aggbox_verdict
aggbox_classify(void *data, void *data_end, enum aggbox_dir dir, enum aggbox_prog prog,
		struct aggbox_pkt *pkt)
{
	struct ethhdr *eth = data;
	struct iphdr *ip;
	struct udphdr *udp;
	struct aggbox_hdr *hdr;
	struct aggbox_port *port;
	struct aggbox_group *group;
	struct aggbox_member *member;
	struct aggbox_member_key member_key;
	struct aggbox_port_key local;

	aggbox_count(prog, AGGBOX_STAT_SEEN);

	/* Ethernet, then IPv4 without fragments, then UDP: else not ours. */
	if ((void *)(eth + 1) > data_end || eth->h_proto != bpf_htons(ETH_P_IP))
		goto other;
	ip = (void *)(eth + 1);
	if ((void *)(ip + 1) > data_end || ip->ihl < 5 || ip->protocol != IPPROTO_UDP ||
	    (ip->frag_off & bpf_htons(AGGBOX_IP_FRAG_MASK)))
		goto other;
	udp = (void *)ip + ip->ihl * 4;
	if ((void *)(udp + 1) > data_end)
		goto other;

	local.ipv4 = dir == AGGBOX_DIR_IN ? ip->daddr : ip->saddr;
	local.port = bpf_ntohs(dir == AGGBOX_DIR_IN ? udp->dest : udp->source);
	local.reserved = 0;
	port = bpf_map_lookup_elem(&ab_ports, &local);
	if (!port)
		goto other;

	/* From here on the datagram is addressed to (or sent by) a communicator
	 * of ours: it is AggBox's, and anything wrong with it drops it. */
	hdr = (void *)(udp + 1);
	if ((void *)(hdr + 1) > data_end || bpf_ntohs(udp->len) < sizeof(*udp) + sizeof(*hdr))
		return aggbox_drop(prog, AGGBOX_STAT_DROP_TRUNCATED);
	if (hdr->magic != AGGBOX_MAGIC)
		return aggbox_drop(prog, AGGBOX_STAT_DROP_BAD_MAGIC);
	if (hdr->version != AGGBOX_VERSION)
		return aggbox_drop(prog, AGGBOX_STAT_DROP_BAD_VERSION);
	if (hdr->kind == 0 || (hdr->kind >= AGGBOX_KIND_MAX &&
				(hdr->kind < AGGBOX_KIND_KV_FIRST || hdr->kind >= AGGBOX_KIND_KV_MAX) &&
				(hdr->kind < AGGBOX_KIND_AGREE_FIRST || hdr->kind >= AGGBOX_KIND_AGREE_MAX)))
		return aggbox_drop(prog, AGGBOX_STAT_DROP_BAD_KIND);
	if (hdr->group != port->group)
		return aggbox_drop(prog, AGGBOX_STAT_DROP_UNKNOWN_GROUP);
	group = bpf_map_lookup_elem(&ab_groups, &hdr->group);
	if (!group)
		return aggbox_drop(prog, AGGBOX_STAT_DROP_UNKNOWN_GROUP);
	if (hdr->token != group->token)
		return aggbox_drop(prog, AGGBOX_STAT_DROP_BAD_TOKEN);
	if (hdr->sender >= group->size)
		return aggbox_drop(prog, AGGBOX_STAT_DROP_NOT_MEMBER);
	member_key.group = hdr->group;
	member_key.rank = hdr->sender;
	member = bpf_map_lookup_elem(&ab_members, &member_key);
	if (!member || member->ipv4 != ip->saddr || member->port != bpf_ntohs(udp->source))
		return aggbox_drop(prog, AGGBOX_STAT_DROP_NOT_MEMBER);

	aggbox_count(prog, AGGBOX_STAT_ACCEPTED);
	pkt->eth = eth;
	pkt->ip = ip;
	pkt->udp = udp;
	pkt->hdr = hdr;
	pkt->payload = hdr + 1;
	pkt->ctl = port->ctl;
	return AGGBOX_VALID;

other:
	aggbox_count(prog, AGGBOX_STAT_PASSED_OTHER);
	return AGGBOX_OTHER;
}

/*
 * TC only: makes the headers up to the AggBox header readable in the linear
 * area when a UDP datagram long enough to carry them keeps them outside it
 * (a locally made or GRO'd skb may). Anything else is left alone: pulling a
 * TCP skb, which is a clone, would copy its head for nothing.
 */
static __always_inline void aggbox_skb_pull_headers(struct __sk_buff *skb)
{
	void *data = aggbox_skb_data(skb);
	void *data_end = aggbox_skb_data_end(skb);
	struct ethhdr *eth = data;
	struct iphdr *ip = (void *)(eth + 1);
	__u32 need;

	if ((void *)(ip + 1) > data_end) {
		need = sizeof(*eth) + sizeof(*ip);
		if (skb->len < need)
			return;
		bpf_skb_pull_data(skb, need); /* then look again */
		data = aggbox_skb_data(skb);
		data_end = aggbox_skb_data_end(skb);
		eth = data;
		ip = (void *)(eth + 1);
		if ((void *)(ip + 1) > data_end)
			return;
	}
	if (eth->h_proto != bpf_htons(ETH_P_IP) || ip->protocol != IPPROTO_UDP)
		return;
	need = sizeof(*eth) + ip->ihl * 4 + sizeof(struct udphdr) + AGGBOX_HDR_LEN;
	if (data + need > data_end && skb->len >= need)
		bpf_skb_pull_data(skb, need);
}

#endif /* AGGBOX_PARSE_H */
