// SPDX-License-Identifier: GPL-2.0 OR Apache-2.0
/*
 * Fault injection for the virtual cluster (this kernel has no netem).
 * Attached at TC egress of the bridge-side veth of each host, so every frame
 * delivered to that host passes here once. A random draw drops a frame; a
 * second one duplicates it with bpf_clone_redirect to the same device. The
 * clone comes back through this hook carrying FAULT_MARK and is let through.
 * A third one delays it: the frame gets skb->priority = delay_priority, the id
 * of a slow HTB class that the loader put at the root of this device (TC
 * egress runs before the root qdisc, and HTB takes a priority that names one
 * of its classes as the class). Other frames leave through HTB's unshaped
 * direct queue first, so frames sent later overtake the delayed one: it is
 * reordered, not lost.
 * Only UDP frames whose destination port is in [port_lo, port_hi] are touched.
 */
#include <linux/bpf.h>
#include <linux/if_ether.h>
#include <linux/in.h>
#include <linux/ip.h>
#include <linux/pkt_cls.h>
#include <linux/udp.h>
#include <bpf/bpf_endian.h>
#include <bpf/bpf_helpers.h>

#define FAULT_MARK 0xab0fa017u
#define PER_MILLION 1000000u

/* Set by the loader before the program is loaded. */
volatile const __u32 drop_ppm = 0; /* frames dropped, parts per million */
volatile const __u32 dup_ppm = 0; /* frames duplicated, parts per million */
volatile const __u32 reorder_ppm = 0; /* frames delayed (reordered), parts per million */
/* The slow class (major:minor) that delayed frames are queued in; only
 * meaningful when reorder_ppm is not 0. */
volatile const __u32 delay_priority = 0;
volatile const __u16 port_lo = 0;
volatile const __u16 port_hi = 65535;

enum fault_stat {
	FAULT_STAT_SEEN = 0, /* frames in the faulted port range */
	FAULT_STAT_DROPPED = 1,
	FAULT_STAT_DUPLICATED = 2,
	FAULT_STAT_DELAYED = 3, /* sent through the slow class */
	FAULT_STAT_MAX = 4,
};

struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, FAULT_STAT_MAX);
	__type(key, __u32);
	__type(value, __u64);
} fault_stats SEC(".maps");

static __always_inline void fault_count(enum fault_stat stat)
{
	__u32 idx = stat;
	__u64 *value = bpf_map_lookup_elem(&fault_stats, &idx);

	if (value)
		*value += 1;
}

static __always_inline int in_faulted_range(struct __sk_buff *skb)
{
	void *data = (void *)(long)skb->data;
	void *data_end = (void *)(long)skb->data_end;
	struct ethhdr *eth = data;
	struct iphdr *ip;
	struct udphdr *udp;
	__u16 dport;

	if ((void *)(eth + 1) > data_end || eth->h_proto != bpf_htons(ETH_P_IP))
		return 0;
	ip = (void *)(eth + 1);
	if ((void *)(ip + 1) > data_end || ip->protocol != IPPROTO_UDP || ip->ihl < 5)
		return 0;
	udp = (void *)ip + ip->ihl * 4;
	if ((void *)(udp + 1) > data_end)
		return 0;
	dport = bpf_ntohs(udp->dest);
	return dport >= port_lo && dport <= port_hi;
}

SEC("classifier")
int aggbox_fault(struct __sk_buff *skb)
{
	if (skb->mark == FAULT_MARK) {
		skb->mark = 0;
		return TC_ACT_OK; /* a duplicate we made: deliver it as it is */
	}
	/* Only the frames picked below take the slow class, so that the
	 * delayed counter tells exactly which did. */
	if (reorder_ppm && skb->priority == delay_priority)
		skb->priority = 0;
	if (!in_faulted_range(skb))
		return TC_ACT_OK;
	fault_count(FAULT_STAT_SEEN);
	if (bpf_get_prandom_u32() % PER_MILLION < drop_ppm) {
		fault_count(FAULT_STAT_DROPPED);
		return TC_ACT_SHOT;
	}
	if (bpf_get_prandom_u32() % PER_MILLION < dup_ppm) {
		skb->mark = FAULT_MARK;
		if (bpf_clone_redirect(skb, skb->ifindex, 0) == 0)
			fault_count(FAULT_STAT_DUPLICATED);
		skb->mark = 0;
	}
	/* After the clone: a duplicate leaves at once, its original maybe later. */
	if (bpf_get_prandom_u32() % PER_MILLION < reorder_ppm) {
		skb->priority = delay_priority;
		fault_count(FAULT_STAT_DELAYED);
	}
	return TC_ACT_OK;
}

char LICENSE[] SEC("license") = "Dual BSD/GPL";
