// SPDX-License-Identifier: GPL-2.0 OR Apache-2.0
/*
 * TC ingress: checks what XDP passed up (invalid AggBox datagrams are
 * dropped) and, since skbs can be copied here and XDP frames cannot, sends
 * the ACK of the chunk whose landed notice XDP passed up to the process
 * (aggbox_tc_answer_landed), and sends the reduction results XDP completed to
 * every member (aggbox_tc_red_fanout).
 */
#include "aggbox_result.h"

SEC("classifier")
int aggbox_tc_ingress(struct __sk_buff *skb)
{
	struct aggbox_pkt pkt;
	void *data;
	void *data_end;

	aggbox_skb_pull_headers(skb);
	data = (void *)(long)skb->data;
	data_end = (void *)(long)skb->data_end;

	switch (aggbox_classify(data, data_end, AGGBOX_DIR_IN, AGGBOX_PROG_TC_INGRESS, &pkt)) {
	case AGGBOX_INVALID:
		return TC_ACT_SHOT;
	case AGGBOX_VALID:
		if (pkt.hdr->kind == AGGBOX_KIND_BCAST_LANDED && pkt.ctl < AGGBOX_CTL_SLOTS)
			return aggbox_tc_answer_landed(skb, &pkt);
		if (pkt.hdr->kind == AGGBOX_KIND_RED_RESULT && (pkt.hdr->flags & AGGBOX_FLAG_FANOUT) &&
		    pkt.ctl < AGGBOX_CTL_SLOTS)
			return aggbox_tc_red_fanout(skb, &pkt);
		return TC_ACT_OK;
	default:
		return TC_ACT_OK;
	}
}

char LICENSE[] SEC("license") = "Dual BSD/GPL";
