// SPDX-License-Identifier: GPL-2.0 OR Apache-2.0
/*
 * TC egress: where a broadcast chunk sent once is cloned to every member
 * (bpf_clone_redirect). Today it checks what our communicators send, drops
 * malformed AggBox datagrams before they reach the wire and lets everything
 * else through.
 */
#include <linux/pkt_cls.h>
#include "aggbox_parse.h"

SEC("classifier")
int aggbox_tc_egress(struct __sk_buff *skb)
{
	struct aggbox_pkt pkt;
	void *data;
	void *data_end;

	aggbox_skb_pull_headers(skb);
	data = (void *)(long)skb->data;
	data_end = (void *)(long)skb->data_end;
	if (aggbox_classify(data, data_end, AGGBOX_DIR_OUT, AGGBOX_PROG_TC_EGRESS, &pkt) ==
	    AGGBOX_INVALID)
		return TC_ACT_SHOT;
	return TC_ACT_OK;
}

char LICENSE[] SEC("license") = "Dual BSD/GPL";
