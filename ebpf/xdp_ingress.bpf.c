// SPDX-License-Identifier: GPL-2.0 OR Apache-2.0
/*
 * XDP ingress: the first program an AggBox datagram meets on a host. It
 * drops (and counts) malformed datagrams and ones from non-members, places
 * broadcast chunks in receive windows and answers them, folds broadcast ACKs
 * at the root (aggbox_bcast.h), and passes everything else up.
 */
/* Folding ACKs needs atomic fetch-and-or: build.rs compiles this for BPF v3. */
#define AGGBOX_NEEDS_ATOMICS 1
#include "aggbox_bcast.h"

SEC("xdp")
int aggbox_xdp_ingress(struct xdp_md *ctx)
{
	struct aggbox_pkt pkt;
	void *data = (void *)(long)ctx->data;
	void *data_end = (void *)(long)ctx->data_end;

	switch (aggbox_classify(data, data_end, AGGBOX_DIR_IN, AGGBOX_PROG_XDP_INGRESS, &pkt)) {
	case AGGBOX_INVALID:
		return XDP_DROP;
	case AGGBOX_VALID:
		if (pkt.ctl >= AGGBOX_CTL_SLOTS)
			return XDP_PASS;
		if (pkt.hdr->kind == AGGBOX_KIND_BCAST_DATA)
			return aggbox_xdp_bcast_data(ctx, &pkt, pkt.ctl);
		if (pkt.hdr->kind == AGGBOX_KIND_BCAST_ACK)
			return aggbox_xdp_bcast_ack(ctx, &pkt, pkt.ctl);
		return XDP_PASS;
	case AGGBOX_OTHER:
	default:
		return XDP_PASS;
	}
}

char LICENSE[] SEC("license") = "Dual BSD/GPL";
