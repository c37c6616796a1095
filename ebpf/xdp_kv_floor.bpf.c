// SPDX-License-Identifier: GPL-2.0 OR Apache-2.0
/*
 * The XDP floor of `aggbox bench kv` (docs/BENCHMARKS.md): a trivial XDP
 * program for a host's interface that drops every KV_DATA datagram to UDP
 * port `floor_port` and counts it (packets, the pairs in their headers, the
 * time of the first and the last) per CPU; everything else passes (the
 * rendezvous and the barriers of the ranks that send). The bench attaches it
 * instead of AggBox's programs, has the mappers send the batches the kernel
 * datapath sends, and reads the counters: the rate at which the kernel can
 * merely drop those packets, the ceiling of any in-kernel fold.
 */
#include <linux/bpf.h>
#include <linux/if_ether.h>
#include <linux/in.h>
#include <linux/ip.h>
#include <linux/udp.h>
#include <bpf/bpf_helpers.h>
#include <bpf/bpf_endian.h>

#include "aggbox_wire.h"

/* ab_kvfloor[0], per CPU. */
struct aggbox_kvfloor {
	__u64 packets;
	__u64 pairs;
	__u64 first_ns; /* bpf_ktime_get_ns (CLOCK_MONOTONIC) of the first; 0: none */
	__u64 last_ns;
};

struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, struct aggbox_kvfloor);
} ab_kvfloor SEC(".maps");

/* Set at load (host order). */
volatile const __u16 floor_port = 0;

SEC("xdp")
int aggbox_xdp_kv_floor(struct xdp_md *ctx)
{
	void *data = (void *)(long)ctx->data;
	void *data_end = (void *)(long)ctx->data_end;
	struct ethhdr *eth = data;
	struct iphdr *ip = (void *)(eth + 1);
	struct udphdr *udp = (void *)(ip + 1);
	struct aggbox_hdr *hdr = (void *)(udp + 1);
	struct aggbox_kvfloor *f;
	__u32 zero = 0;
	__u64 now;

	if ((void *)(hdr + 1) > data_end)
		return XDP_PASS;
	if (eth->h_proto != bpf_htons(ETH_P_IP) || ip->ihl != 5 || ip->protocol != IPPROTO_UDP ||
	    udp->dest != bpf_htons(floor_port) || hdr->kind != AGGBOX_KIND_KV_DATA)
		return XDP_PASS;
	f = bpf_map_lookup_elem(&ab_kvfloor, &zero);
	if (f) {
		now = bpf_ktime_get_ns();
		if (!f->first_ns)
			f->first_ns = now;
		f->last_ns = now;
		f->packets++;
		f->pairs += hdr->count;
	}
	return XDP_DROP;
}

char LICENSE[] SEC("license") = "Dual BSD/GPL";
