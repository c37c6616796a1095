// SPDX-License-Identifier: GPL-2.0 OR Apache-2.0
/*
 * TC egress: checks what our communicators send (a malformed AggBox datagram
 * never reaches the wire) and clones each broadcast chunk a kernel root sent
 * once, and each agreement value a kernel rank sent once, to every member of
 * its group (aggbox_tc_fanout). Everything else goes through untouched.
 */
#include "aggbox_bcast.h"

SEC("classifier")
int aggbox_tc_egress(struct __sk_buff *skb)
{
	struct aggbox_pkt pkt;
	void *data;
	void *data_end;

	aggbox_skb_pull_headers(skb);
	data = aggbox_skb_data(skb);
	data_end = aggbox_skb_data_end(skb);
	switch (aggbox_classify(data, data_end, AGGBOX_DIR_OUT, AGGBOX_PROG_TC_EGRESS, &pkt)) {
	case AGGBOX_INVALID:
		return TC_ACT_SHOT;
	case AGGBOX_VALID:
		/* A broadcast chunk, or an agreement value a kernel rank sends
		 * to every other rank once (docs/AGREEMENT.md). */
		if (skb->mark != AGGBOX_CLONE_MARK &&
		    (pkt.hdr->kind == AGGBOX_KIND_BCAST_DATA || pkt.hdr->kind == AGGBOX_KIND_AGREE_VALUE) &&
		    (pkt.hdr->flags & AGGBOX_FLAG_FANOUT))
			return aggbox_tc_fanout(skb, &pkt);
		return TC_ACT_OK;
	default:
		return TC_ACT_OK;
	}
}

char LICENSE[] SEC("license") = "Dual BSD/GPL";
