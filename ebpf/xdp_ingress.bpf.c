// SPDX-License-Identifier: GPL-2.0 OR Apache-2.0
/*
 * XDP ingress: the first program an AggBox datagram meets on a host.
 * Today it admits valid datagrams of the groups served here to their socket
 * and drops (and counts) malformed ones and ones from non-members; later
 * stages (placement, ACK folding, aggregation) hang off the VALID branch.
 */
#include "aggbox_parse.h"

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
	case AGGBOX_OTHER:
	default:
		return XDP_PASS;
	}
}

char LICENSE[] SEC("license") = "Dual BSD/GPL";
