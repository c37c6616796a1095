// SPDX-License-Identifier: GPL-2.0 OR Apache-2.0
/*
 * TC ingress: where a result that XDP completed is fanned out to the group
 * (skbs can be cloned here, XDP frames cannot). Today it checks what XDP
 * passed up, drops invalid AggBox datagrams and lets everything else through.
 */
#include <linux/pkt_cls.h>
#include "aggbox_parse.h"

SEC("classifier")
int aggbox_tc_ingress(struct __sk_buff *skb)
{
	struct aggbox_pkt pkt;
	void *data;
	void *data_end;

	aggbox_skb_pull_headers(skb);
	data = (void *)(long)skb->data;
	data_end = (void *)(long)skb->data_end;

	if (aggbox_classify(data, data_end, AGGBOX_DIR_IN, AGGBOX_PROG_TC_INGRESS, &pkt) ==
	    AGGBOX_INVALID)
		return TC_ACT_SHOT;
	return TC_ACT_OK;
}

char LICENSE[] SEC("license") = "Dual BSD/GPL";
