// SPDX-License-Identifier: GPL-2.0 OR Apache-2.0
/*
 * XDP ingress: the first program an AggBox datagram meets on a host. It
 * drops (and counts) malformed datagrams and ones from non-members, places
 * broadcast chunks in receive windows and answers them, folds broadcast ACKs
 * at the root (aggbox_bcast.h), folds reduction contributions at a chunk's
 * owner and places results at the members (aggbox_reduce.h, with its
 * tail-called fold stage below), folds key-value pairs into an owner's
 * kernel table (aggbox_kv.h), folds the values of an approximate
 * agreement's phase and answers ranks that lag (aggbox_agree.h), and passes
 * everything else up.
 */
/* Folding ACKs needs atomic fetch-and-or: build.rs compiles this for BPF v3. */
#define AGGBOX_NEEDS_ATOMICS 1
/* Sums are added under a per-slot spin lock (measured faster than atomic
 * adds: docs/ALLREDUCE.md, "Atomics vs per-slot lock"); build.rs builds an
 * atomic-add variant for that measurement. */
#ifndef AGGBOX_RED_ATOMICS
#define AGGBOX_RED_LOCK 1
#endif
#include "aggbox_reduce.h"
#include "aggbox_kv.h"
#include "aggbox_agree.h"

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
		if (pkt.hdr->kind == AGGBOX_KIND_AGREE_QUORUM) {
			aggbox_acount(AGGBOX_ASTAT_FORGED); /* only this program makes them */
			return XDP_DROP;
		}
		if (pkt.ctl >= AGGBOX_CTL_SLOTS)
			return XDP_PASS;
		if (pkt.hdr->kind == AGGBOX_KIND_AGREE_VALUE)
			return aggbox_xdp_agree_value(ctx, &pkt);
		if (pkt.hdr->kind == AGGBOX_KIND_BCAST_DATA)
			return aggbox_xdp_bcast_data(ctx, &pkt, pkt.ctl);
		if (pkt.hdr->kind == AGGBOX_KIND_BCAST_ACK)
			return aggbox_xdp_bcast_ack(ctx, &pkt, pkt.ctl);
		if (pkt.hdr->kind == AGGBOX_KIND_RED_DATA)
			return aggbox_xdp_red_data(ctx, &pkt);
		if (pkt.hdr->kind == AGGBOX_KIND_RED_RESULT &&
		    !(pkt.hdr->flags & (AGGBOX_FLAG_FANOUT | AGGBOX_FLAG_NOTIFY)))
			return aggbox_xdp_red_result(ctx, &pkt);
		if (pkt.hdr->kind == AGGBOX_KIND_RED_DONE)
			return aggbox_xdp_red_done(ctx, &pkt);
		if (pkt.hdr->kind == AGGBOX_KIND_RED_RESULT || pkt.hdr->kind == AGGBOX_KIND_RED_SUM ||
		    pkt.hdr->kind == AGGBOX_KIND_RED_LANDED) {
			aggbox_rcount(AGGBOX_RSTAT_FORGED); /* only these programs make them */
			return XDP_DROP;
		}
		if (pkt.hdr->kind == AGGBOX_KIND_KV_DATA)
			return aggbox_xdp_kv_data(ctx, &pkt);
		return XDP_PASS;
	case AGGBOX_OTHER:
	default:
		return XDP_PASS;
	}
}

/* The fold stage, reached only by tail call (ab_redprogs). */
SEC("xdp")
int aggbox_xdp_red_fold(struct xdp_md *ctx)
{
	return aggbox_xdp_red_fold_stage(ctx);
}

char LICENSE[] SEC("license") = "Dual BSD/GPL";
