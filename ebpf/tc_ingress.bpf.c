// SPDX-License-Identifier: GPL-2.0 OR Apache-2.0
/*
 * TC ingress. With XDP attached (the XDP hooks) it checks what XDP passed
 * up (invalid AggBox datagrams are dropped) and, since skbs can be copied
 * here and XDP frames cannot, sends the ACK of the chunk whose landed notice
 * XDP passed up to the process (aggbox_tc_answer_landed), and sends the
 * reduction results XDP completed to every member (aggbox_tc_red_fanout).
 * Without XDP (the TC hooks: virtual devices, where any XDP program would
 * turn GSO off on the peer and cut every super-chunk into MTU frames) it is
 * the first program a datagram meets: it places broadcast chunks and
 * super-chunks in the receive windows and answers them from here
 * (aggbox_tc_bcast_data), folds ACKs at the root
 * (aggbox_bcast_fold_ack), folds reduction contributions at their owner
 * and places results at the members (aggbox_tc_reduce.h), folds
 * agreement values and answers ranks that lag (aggbox_agree.h), and folds
 * key-value batches into the owner's kernel table (aggbox_kv.h). On both
 * hooks it counts barrier arrivals at rank 0 and releases every member
 * from here (aggbox_barrier.h).
 */
/* Claims, placements and folds use atomic fetch-and-add/or and
 * compare-and-swap: build.rs compiles this for BPF v3. */
#define AGGBOX_NEEDS_ATOMICS 1
/* Reduction sums are added under a per-slot spin lock, as in XDP. */
#define AGGBOX_RED_LOCK 1
#include "aggbox_tc_reduce.h"
#include "aggbox_agree.h"
#include "aggbox_kv.h"
#include "aggbox_barrier.h"

/* Set by the loader: 1 on the TC hooks (no XDP program on the interface). */
volatile const __u32 aggbox_tc_hooks = 0;

SEC("classifier")
int aggbox_tc_ingress(struct __sk_buff *skb)
{
	struct aggbox_pkt pkt;
	void *data;
	void *data_end;

	aggbox_skb_pull_headers(skb);
	data = aggbox_skb_data(skb);
	data_end = aggbox_skb_data_end(skb);

	switch (aggbox_classify(data, data_end, AGGBOX_DIR_IN, AGGBOX_PROG_TC_INGRESS, &pkt)) {
	case AGGBOX_INVALID:
		return TC_ACT_SHOT;
	case AGGBOX_VALID:
		if (pkt.hdr->kind == AGGBOX_KIND_BARRIER_DONE) {
			aggbox_bcount(AGGBOX_BSTAT_BARRIER_FORGED); /* only this program makes them, going up */
			return TC_ACT_SHOT;
		}
		if (pkt.hdr->kind == AGGBOX_KIND_BARRIER_ARRIVE && pkt.ctl < AGGBOX_CTL_SLOTS)
			return aggbox_tc_barrier_arrive(skb, &pkt);
		if (aggbox_tc_hooks) {
			if (pkt.hdr->kind == AGGBOX_KIND_BCAST_LANDED) {
				aggbox_count(AGGBOX_PROG_TC_INGRESS, AGGBOX_STAT_DROP_BAD_KIND); /* only this program makes them, going up */
				return TC_ACT_SHOT;
			}
			if (pkt.hdr->kind == AGGBOX_KIND_RED_SUM || pkt.hdr->kind == AGGBOX_KIND_RED_LANDED) {
				aggbox_rcount(AGGBOX_RSTAT_FORGED); /* likewise */
				return TC_ACT_SHOT;
			}
			if (pkt.hdr->kind == AGGBOX_KIND_AGREE_QUORUM) {
				aggbox_acount(AGGBOX_ASTAT_FORGED); /* likewise */
				return TC_ACT_SHOT;
			}
			if (pkt.ctl >= AGGBOX_CTL_SLOTS)
				return TC_ACT_OK;
			if (pkt.hdr->kind == AGGBOX_KIND_BCAST_DATA)
				return aggbox_tc_bcast_data(skb, &pkt);
			if (pkt.hdr->kind == AGGBOX_KIND_RED_DATA)
				return aggbox_tc_red_data(skb, &pkt);
			if (pkt.hdr->kind == AGGBOX_KIND_RED_RESULT)
				return aggbox_tc_red_result(skb, &pkt);
			if (pkt.hdr->kind == AGGBOX_KIND_AGREE_VALUE)
				return aggbox_tc_agree_value(skb, &pkt);
			if (pkt.hdr->kind == AGGBOX_KIND_KV_DATA)
				return aggbox_tc_kv_data(skb, &pkt);
			/* A GSO skb of ACKs is left whole to user space: the fold
			 * reads one header. */
			if (pkt.hdr->kind == AGGBOX_KIND_BCAST_ACK && skb->gso_segs <= 1)
				return aggbox_bcast_fold_ack(&pkt, pkt.ctl) == AGGBOX_FOLD_CONSUMED ? TC_ACT_SHOT : TC_ACT_OK;
			return TC_ACT_OK;
		}
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
