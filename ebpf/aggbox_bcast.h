/* SPDX-License-Identifier: Apache-2.0 */
/*
 * The kernel datapath of broadcast (docs/BROADCAST.md, "Kernel datapath"):
 * - aggbox_tc_fanout: TC egress clones a FANOUT chunk to every member;
 * - aggbox_xdp_bcast_data: XDP places a chunk in the receive window and
 *   answers it with an ACK by XDP_TX (or, for the chunk that completes a
 *   notification step, passes a LANDED notice up instead);
 * - aggbox_xdp_bcast_ack: XDP folds ACKs at the root and passes one
 *   group-ACK up per notification step.
 * Anything these do not handle (an unarmed, stale or odd datagram) goes up
 * to the socket unchanged, where user space runs the same protocol.
 * Broadcast datagrams carry no IP options (AggBox sends none); one with
 * options is left to user space.
 */
#ifndef AGGBOX_BCAST_H
#define AGGBOX_BCAST_H

#include <linux/pkt_cls.h>
#include "aggbox_parse.h"

/* skb->mark of the clones TC egress makes, so they are not cloned again. */
#define AGGBOX_CLONE_MARK 0xab0c1047u

/* Byte offsets in a frame whose IPv4 header has no options. */
#define AGGBOX_OFF_ETH_DST 0
#define AGGBOX_OFF_IP (sizeof(struct ethhdr))
#define AGGBOX_OFF_IP_CSUM (AGGBOX_OFF_IP + offsetof(struct iphdr, check))
#define AGGBOX_OFF_IP_DST (AGGBOX_OFF_IP + offsetof(struct iphdr, daddr))
#define AGGBOX_OFF_UDP (AGGBOX_OFF_IP + sizeof(struct iphdr))
#define AGGBOX_OFF_UDP_DPORT (AGGBOX_OFF_UDP + offsetof(struct udphdr, dest))
#define AGGBOX_OFF_UDP_CSUM (AGGBOX_OFF_UDP + offsetof(struct udphdr, check))
#define AGGBOX_OFF_PAYLOAD (AGGBOX_OFF_UDP + sizeof(struct udphdr) + AGGBOX_HDR_LEN)

static __always_inline __u64 aggbox_tag(__u32 seq, __u32 chunk)
{
	return ((__u64)seq << 32) | chunk;
}

/* Whether slot tag `a` is of an earlier chunk than tag `b` (sequence numbers
 * compared as serial numbers, so across their wrap; 0 is older than all). */
static __always_inline int aggbox_tag_older(__u64 a, __u64 b)
{
	__u32 a_seq = a >> 32, b_seq = b >> 32;

	if (a == 0)
		return 1;
	if (a_seq != b_seq)
		return (__s32)(a_seq - b_seq) < 0;
	return (__u32)a < (__u32)b;
}

/* RFC 1624: the checksum after a 16-bit field changed from old to new. */
static __always_inline __u16 aggbox_csum_replace2(__u16 check, __u16 old, __u16 new)
{
	__u32 sum = (~bpf_ntohs(check) & 0xffff) + (~bpf_ntohs(old) & 0xffff) + bpf_ntohs(new);

	sum = (sum & 0xffff) + (sum >> 16);
	sum = (sum & 0xffff) + (sum >> 16);
	return bpf_htons(~sum & 0xffff);
}

/* ---- TC egress: fan-out --------------------------------------------------- */

/* Points the skb at `to`: destination MAC, IPv4 address and UDP port, with
 * both checksums fixed. `cur_ip` and `cur_port` (network order) are what it
 * is addressed to now. */
static __always_inline int aggbox_retarget(struct __sk_buff *skb, struct aggbox_member *to,
					   __u32 *cur_ip, __u16 *cur_port)
{
	__u16 port = bpf_htons(to->port);

	if (bpf_skb_store_bytes(skb, AGGBOX_OFF_ETH_DST, to->mac, ETH_ALEN, 0))
		return -1;
	if (bpf_l4_csum_replace(skb, AGGBOX_OFF_UDP_CSUM, *cur_ip, to->ipv4,
				BPF_F_PSEUDO_HDR | BPF_F_MARK_MANGLED_0 | sizeof(__u32)))
		return -1;
	if (bpf_l3_csum_replace(skb, AGGBOX_OFF_IP_CSUM, *cur_ip, to->ipv4, sizeof(__u32)))
		return -1;
	if (bpf_skb_store_bytes(skb, AGGBOX_OFF_IP_DST, &to->ipv4, sizeof(__u32), 0))
		return -1;
	if (bpf_l4_csum_replace(skb, AGGBOX_OFF_UDP_CSUM, *cur_port, port,
				BPF_F_MARK_MANGLED_0 | sizeof(__u16)))
		return -1;
	if (bpf_skb_store_bytes(skb, AGGBOX_OFF_UDP_DPORT, &port, sizeof(__u16), 0))
		return -1;
	*cur_ip = to->ipv4;
	*cur_port = port;
	return 0;
}

/* The clones' loop, run by bpf_loop: its body is verified once, not once
 * per member (an unrolled walk of up to 254 members took the verifier
 * about 260 ms at every attach). */
struct aggbox_clones {
	struct __sk_buff *skb;
	struct aggbox_member_key key;
	__u32 root;
	__u32 size;
	__u32 mark; /* the skb's own, put back after each clone */
	__u32 cur_ip;
	__u32 chunks; /* chunks per copy: a super-chunk's segments, else 1 */
	__u16 cur_port;
	__u16 failed;
};

/* Clone i: to rank (root + 2 + i) % size. */
static long aggbox_tc_clone_one(__u64 i, void *data)
{
	struct aggbox_clones *c = data;
	struct aggbox_member *member;

	if (c->size == 0)
		return 1;
	c->key.rank = (c->root + 2 + (__u32)i) % c->size;
	member = bpf_map_lookup_elem(&ab_members, &c->key);
	if (!member || aggbox_retarget(c->skb, member, &c->cur_ip, &c->cur_port)) {
		c->failed = 1;
		return 1;
	}
	c->skb->mark = AGGBOX_CLONE_MARK;
	if (bpf_clone_redirect(c->skb, c->skb->ifindex, 0) == 0)
		aggbox_bcount_n(AGGBOX_BSTAT_CLONED, c->chunks);
	else
		aggbox_bcount_n(AGGBOX_BSTAT_CLONES_REFUSED, c->chunks);
	c->skb->mark = c->mark;
	return 0;
}

/*
 * A FANOUT chunk leaves the root addressed to rank (root + 1) % size. Clone
 * it to ranks (root + 2) % size … (root + size - 1) % size, then let the
 * original go to its first destination again.
 */
static __always_inline int aggbox_tc_fanout(struct __sk_buff *skb, struct aggbox_pkt *pkt)
{
	struct aggbox_clones clones;
	struct aggbox_member *member;
	struct aggbox_group *group;
	__u32 size;

	if (pkt->ip->ihl != 5)
		return TC_ACT_OK; /* not ours to clone: no options expected */
	clones.skb = skb;
	clones.key.group = pkt->hdr->group;
	clones.root = pkt->hdr->sender;
	clones.mark = skb->mark;
	clones.cur_ip = pkt->ip->daddr;
	clones.cur_port = pkt->udp->dest;
	clones.failed = 0;
	clones.chunks = skb->gso_segs > 1 ? skb->gso_segs : 1;
	group = bpf_map_lookup_elem(&ab_groups, &clones.key.group);
	if (!group)
		return TC_ACT_OK;
	size = group->size;
	if (size > AGGBOX_MAX_RANKS)
		return TC_ACT_OK;
	clones.size = size;

	/* pkt's pointers are invalid from the first helper call on. */
	if (size > 2) {
		bpf_loop(size - 2, aggbox_tc_clone_one, &clones, 0);
		if (clones.failed)
			return TC_ACT_SHOT;
		clones.key.rank = (clones.root + 1) % size;
		member = bpf_map_lookup_elem(&ab_members, &clones.key);
		if (!member || aggbox_retarget(skb, member, &clones.cur_ip, &clones.cur_port))
			return TC_ACT_SHOT;
	}
	aggbox_bcount_n(AGGBOX_BSTAT_CLONED, clones.chunks); /* the original: size - 1 copies in all */
	return TC_ACT_OK;
}

/* ---- TC ingress: answering the chunk of a landed notice --------------------- */

/* Swaps source and destination MAC, IPv4 address and UDP port in place (the
 * IPv4 checksum does not change). The frame has no IP options, and the
 * caller checked that the UDP header is within it. */
static __always_inline void aggbox_swap_ends(struct ethhdr *eth, struct iphdr *ip, struct udphdr *udp)
{
	__u8 mac[ETH_ALEN];
	__u32 addr;
	__u16 port;

	__builtin_memcpy(mac, eth->h_dest, ETH_ALEN);
	__builtin_memcpy(eth->h_dest, eth->h_source, ETH_ALEN);
	__builtin_memcpy(eth->h_source, mac, ETH_ALEN);
	addr = ip->daddr;
	ip->daddr = ip->saddr;
	ip->saddr = addr;
	port = udp->dest;
	udp->dest = udp->source;
	udp->source = port;
}

/* aggbox_swap_ends on an skb. */
static __always_inline int aggbox_tc_swap(struct __sk_buff *skb)
{
	void *data = aggbox_skb_data(skb);
	void *data_end = aggbox_skb_data_end(skb);
	struct ethhdr *eth = data;
	struct iphdr *ip = (void *)(eth + 1);
	struct udphdr *udp = (void *)(ip + 1);

	if ((void *)(udp + 1) > data_end)
		return -1;
	aggbox_swap_ends(eth, ip, udp);
	return 0;
}

static __always_inline struct aggbox_hdr *aggbox_tc_hdr(struct __sk_buff *skb)
{
	void *data = aggbox_skb_data(skb);
	void *data_end = aggbox_skb_data_end(skb);
	struct aggbox_hdr *hdr = data + AGGBOX_OFF_UDP + sizeof(struct udphdr);

	return (void *)(hdr + 1) > data_end ? NULL : hdr;
}

/* Cuts the frame to its AggBox header (IPv4 and UDP lengths fixed, UDP
 * checksum none) and makes it private (a copy was just sent from it), so it
 * can be written directly. Returns the header, or NULL. */
static __always_inline struct aggbox_hdr *aggbox_tc_strip(struct __sk_buff *skb)
{
	void *data, *data_end;
	struct iphdr *ip;
	struct udphdr *udp;
	__u16 old_len, new_len = bpf_htons(sizeof(*ip) + sizeof(*udp) + AGGBOX_HDR_LEN);

	if (bpf_skb_change_tail(skb, AGGBOX_OFF_PAYLOAD, 0) || bpf_skb_pull_data(skb, AGGBOX_OFF_PAYLOAD))
		return NULL;
	data = aggbox_skb_data(skb);
	data_end = aggbox_skb_data_end(skb);
	ip = data + AGGBOX_OFF_IP;
	udp = data + AGGBOX_OFF_UDP;
	if (data + AGGBOX_OFF_PAYLOAD > data_end)
		return NULL;
	old_len = ip->tot_len;
	ip->check = aggbox_csum_replace2(ip->check, old_len, new_len);
	ip->tot_len = new_len;
	udp->len = bpf_htons(sizeof(*udp) + AGGBOX_HDR_LEN);
	udp->check = 0;
	return (void *)(udp + 1);
}

/*
 * A BCAST_LANDED notice XDP passed up (payload already cut, UDP checksum 0):
 * turn it into the chunk's BCAST_ACK, send a copy of that back out of the
 * interface, and turn it back into the notice for the process, flagged
 * ANSWERED so the process does not answer it again.
 */
static __always_inline int aggbox_tc_answer_landed(struct __sk_buff *skb, struct aggbox_pkt *pkt)
{
	struct aggbox_ctl *ctl;
	struct aggbox_hdr *hdr = pkt->hdr;
	__u32 ctl_idx = pkt->ctl;
	__u16 root = hdr->sender, flags = hdr->flags, rank;

	if (pkt->ip->ihl != 5 || (flags & AGGBOX_FLAG_ANSWERED))
		return TC_ACT_OK;
	ctl = bpf_map_lookup_elem(&ab_ctl, &ctl_idx);
	if (!ctl)
		return TC_ACT_OK;
	rank = ctl->rx[hdr->seq & (AGGBOX_RX_PHASES - 1)].rank;
	if (aggbox_tc_swap(skb))
		return TC_ACT_OK;
	hdr = aggbox_tc_hdr(skb);
	if (!hdr)
		return TC_ACT_OK;
	hdr->kind = AGGBOX_KIND_BCAST_ACK;
	hdr->sender = rank;
	hdr->flags = 0;
	if (bpf_clone_redirect(skb, skb->ifindex, 0) == 0) {
		aggbox_bcount(AGGBOX_BSTAT_ACKS_SENT);
		flags |= AGGBOX_FLAG_ANSWERED;
	} /* else not sent: the process answers it */
	/* Back into the notice (the packet's pointers are new after the clone). */
	if (aggbox_tc_swap(skb))
		return TC_ACT_OK;
	hdr = aggbox_tc_hdr(skb);
	if (!hdr)
		return TC_ACT_OK;
	hdr->kind = AGGBOX_KIND_BCAST_LANDED;
	hdr->sender = root;
	hdr->flags = flags;
	return TC_ACT_OK;
}

/* ---- XDP: turning a datagram around ---------------------------------------- */

/*
 * Cuts the payload after the AggBox header off and fixes the IPv4 and UDP
 * lengths (the UDP checksum becomes 0: none, as IPv4 allows). Returns the
 * header, re-derived, or NULL.
 */
static __always_inline struct aggbox_hdr *aggbox_xdp_strip(struct xdp_md *ctx, __u32 payload_len)
{
	void *data, *data_end;
	struct iphdr *ip;
	struct udphdr *udp;
	struct aggbox_hdr *hdr;
	__u16 old_len, new_len;

	if (payload_len && bpf_xdp_adjust_tail(ctx, -(int)payload_len))
		return NULL;
	data = (void *)(long)ctx->data;
	data_end = (void *)(long)ctx->data_end;
	ip = data + sizeof(struct ethhdr);
	udp = (void *)(ip + 1);
	hdr = (void *)(udp + 1);
	if ((void *)(hdr + 1) > data_end)
		return NULL;
	old_len = ip->tot_len;
	new_len = bpf_htons(sizeof(*ip) + sizeof(*udp) + sizeof(*hdr));
	ip->check = aggbox_csum_replace2(ip->check, old_len, new_len);
	ip->tot_len = new_len;
	udp->len = bpf_htons(sizeof(*udp) + sizeof(*hdr));
	udp->check = 0;
	return hdr;
}

/* Sends the (stripped) datagram back where it came from, as `hdr`'s ACK. */
static __always_inline int aggbox_xdp_bounce(struct xdp_md *ctx)
{
	void *data = (void *)(long)ctx->data;
	void *data_end = (void *)(long)ctx->data_end;
	struct ethhdr *eth = data;
	struct iphdr *ip = (void *)(eth + 1);
	struct udphdr *udp = (void *)(ip + 1);

	if ((void *)(udp + 1) > data_end)
		return XDP_DROP;
	aggbox_swap_ends(eth, ip, udp);
	return XDP_TX;
}

/* ---- XDP: placing a chunk in a mapped slot ------------------------------------ */

/* What aggbox_xdp_place did. */
#define AGGBOX_PLACED 0 /* copied in and published: the process may copy it */
#define AGGBOX_PLACE_HELD 1 /* the slot holds this chunk already: a repeat */
#define AGGBOX_PLACE_REFUSED 2 /* not taken: leave it to user space, which places it exactly once */

/*
 * Copies `len` bytes at offset `off` of the packet (`ctx`: an XDP frame, or
 * with `is_skb` an skb) into `slot` as the chunk tagged `tag` (broadcast
 * chunks in a receive window, reduction results in a result window). The
 * slot is taken only from a chunk older than this one that nobody is
 * copying in: never from a CPU still writing (busy), nor from a newer chunk
 * (this one is a stale copy that raced the window forward). The caller
 * checked len against the chunk's size. `is_skb` is a constant at every
 * call, so each program keeps only its own load helper.
 */
static __always_inline int aggbox_place(void *ctx, int is_skb, struct aggbox_rxslot *slot, __u64 tag, __u32 off,
					__u32 len)
{
	__u64 busy = tag | ((__u64)AGGBOX_TAG_BUSY), cur = slot->tag;
	long err;

	if (cur == tag)
		return AGGBOX_PLACE_HELD;
	if ((cur & AGGBOX_TAG_BUSY) || !aggbox_tag_older(cur, tag))
		return AGGBOX_PLACE_REFUSED;
	if (__sync_val_compare_and_swap(&slot->tag, cur, busy) != cur)
		return AGGBOX_PLACE_REFUSED;
	/* The bound again, on the register the copy takes. */
	barrier_var(len);
	err = 0;
	if (len > AGGBOX_CHUNK_MAX)
		err = -1;
	else if (len > 0)
		err = is_skb ? bpf_skb_load_bytes(ctx, off, slot->data, len) : bpf_xdp_load_bytes(ctx, off, slot->data, len);
	if (err) {
		__sync_val_compare_and_swap(&slot->tag, busy, cur); /* give the slot back as it was */
		return AGGBOX_PLACE_REFUSED;
	}
	if (__sync_val_compare_and_swap(&slot->tag, busy, tag) != busy)
		return AGGBOX_PLACE_REFUSED;
	return AGGBOX_PLACED;
}

/* aggbox_place of an XDP frame's payload. */
static __always_inline int aggbox_xdp_place(struct xdp_md *ctx, struct aggbox_rxslot *slot, __u64 tag, __u32 len)
{
	return aggbox_place(ctx, 0, slot, tag, AGGBOX_OFF_PAYLOAD, len);
}

/*
 * Counts one chunk landed (`*landed`, now `*count`); returns whether the
 * process must be told now: on reaching its `*target` (once: `*notified`;
 * the process may have handled some chunks itself, so "complete" is
 * reaching the target), and every `notify` chunks on the way.
 */
static __always_inline int aggbox_count_landed(__u32 *landed, __u32 *target, __u32 *notified, __u32 notify,
					       __u32 *count)
{
	*count = __sync_fetch_and_add(landed, 1) + 1;
	return (*count >= *target && __sync_val_compare_and_swap(notified, 0, 1) == 0) ||
	       (notify && *count % notify == 0);
}

/* ---- XDP: receiver ------------------------------------------------------------ */

/* Bytes of an element of wire dtype `code` (core/src/dtype.rs), 0 if unknown. */
static __always_inline __u32 aggbox_dtype_size(__u8 code)
{
	switch (code) {
	case 0: return 1; /* u8 */
	case 1: case 3: case 5: return 4; /* i32, u32, f32 */
	case 2: case 4: case 6: return 8; /* i64, u64, f64 */
	default: return 0;
	}
}

/*
 * The window was armed ahead for broadcast `hdr->seq`: take its parameters
 * from this first chunk. Only XDP takes the claim: it is BUSY for the few
 * instructions below, in softirq, so never while its holder is
 * descheduled. The process only reads it and checks what was claimed
 * against its call (Windows::claim_for_call); once it has published its
 * call (call_key), a chunk that disagrees with the call does not claim the
 * window but goes to user space, where the process finds the mismatch.
 * Returns 0 when the parameters are set, -1 when this chunk must go to
 * user space (another CPU is setting them, the chunk disagrees with the
 * call, or the header is not a layout of the group's chunk size).
 */
static __always_inline int aggbox_claim(struct aggbox_rxctl *rx, struct aggbox_hdr *hdr)
{
	__u64 bytes, chunk = rx->chunk_bytes, last;
	__u32 size = aggbox_dtype_size(hdr->dtype), nchunks, key;

	if (rx->claim == AGGBOX_CLAIM_SET)
		return 0;
	if (__sync_val_compare_and_swap(&rx->claim, AGGBOX_CLAIM_OPEN, AGGBOX_CLAIM_BUSY) != AGGBOX_CLAIM_OPEN)
		return rx->claim == AGGBOX_CLAIM_SET ? 0 : -1;
	if (rx->seq != hdr->seq) {
		/* A chunk of the broadcast before, whose check raced the window
		 * being armed ahead: it must not claim the next one. */
		rx->claim = AGGBOX_CLAIM_OPEN;
		return -1;
	}
	/* Read after taking the claim (a full barrier); the process publishes
	 * its call before it reads the claim: one of the two sees the other. */
	key = rx->call_key;
	if (key && (key != (AGGBOX_CALL_KNOWN | ((__u32)hdr->sender << 8) | hdr->dtype) ||
		    rx->call_count != hdr->count)) {
		rx->claim = AGGBOX_CLAIM_OPEN; /* the call disagrees: user space fails it */
		return -1;
	}
	bytes = (__u64)hdr->count * size;
	nchunks = chunk ? (bytes + chunk - 1) / chunk : 0;
	if (nchunks == 0)
		nchunks = 1;
	last = bytes - (__u64)(nchunks - 1) * chunk;
	if (!size || !chunk || hdr->nchunks != nchunks || last > chunk) {
		rx->claim = AGGBOX_CLAIM_OPEN; /* not ours to judge: user space */
		return -1;
	}
	rx->root = hdr->sender;
	rx->count = hdr->count;
	rx->dtype = hdr->dtype;
	rx->nchunks = nchunks;
	rx->last_bytes = last;
	/* Armed ahead, target starts at 0 and the process subtracts each
	 * chunk it places itself (wrapping), claimed or not: adding keeps
	 * those. */
	__sync_fetch_and_add(&rx->target, nchunks);
	rx->credit = nchunks < AGGBOX_RX_WINDOW ? nchunks : AGGBOX_RX_WINDOW;
	__sync_lock_test_and_set(&rx->claim, AGGBOX_CLAIM_SET);
	return 0;
}

static __always_inline int aggbox_xdp_bcast_data(struct xdp_md *ctx, struct aggbox_pkt *pkt, __u32 ctl_idx)
{
	struct aggbox_hdr *hdr = pkt->hdr;
	struct aggbox_ctl *ctl;
	struct aggbox_rxctl *rx;
	struct aggbox_rxslot *slot;
	__u32 seq = hdr->seq, chunk = hdr->chunk, len, want, slot_idx, landed;
	__u16 rank;

	ctl = bpf_map_lookup_elem(&ab_ctl, &ctl_idx);
	if (!ctl || pkt->ip->ihl != 5)
		goto to_user;
	rx = &ctl->rx[seq & (AGGBOX_RX_PHASES - 1)];
	len = bpf_ntohs(pkt->udp->len) - sizeof(struct udphdr) - sizeof(*hdr);
	if (rx->seq != 0 && seq == rx->seq && aggbox_claim(rx, hdr))
		goto to_user;
	/* Only the broadcast the process armed, exactly as it called it. */
	if (rx->seq == 0 || seq != rx->seq || hdr->sender != rx->root ||
	    hdr->nchunks != rx->nchunks || hdr->count != rx->count || hdr->dtype != rx->dtype ||
	    chunk >= rx->nchunks || chunk >= rx->credit)
		goto to_user;
	/* Below the window: the process copied it out long ago (credit is the
	 * first chunk it has not copied, plus the window): only ACK it again.
	 * Placing it would overwrite the later chunk that shares its slot. */
	if (chunk + AGGBOX_RX_WINDOW < rx->credit) {
		aggbox_bcount(AGGBOX_BSTAT_DUPLICATES);
		goto ack;
	}
	want = chunk + 1 == rx->nchunks ? rx->last_bytes : rx->chunk_bytes;
	if (len != want || len > AGGBOX_CHUNK_MAX)
		goto to_user;

	slot_idx = ctl_idx * AGGBOX_RX_SLOTS + (seq & (AGGBOX_RX_PHASES - 1)) * AGGBOX_RX_WINDOW +
		   (chunk & (AGGBOX_RX_WINDOW - 1));
	slot = bpf_map_lookup_elem(&ab_rxwin, &slot_idx);
	if (!slot)
		goto to_user;
	switch (aggbox_xdp_place(ctx, slot, aggbox_tag(seq, chunk), len)) {
	case AGGBOX_PLACE_HELD:
		aggbox_bcount(AGGBOX_BSTAT_DUPLICATES); /* its ACK was lost: ACK again */
		goto ack;
	case AGGBOX_PLACED:
		break;
	default:
		goto to_user;
	}
	if (rx->seq != seq)
		goto to_user; /* the window moved on meanwhile: do not count it */
	aggbox_bcount(AGGBOX_BSTAT_PLACED);
	rank = rx->rank;
	/* The one notice at completion, and one per quarter window on the way. */
	if (aggbox_count_landed(&rx->landed, &rx->target, &rx->notified, rx->notify, &landed)) {
		hdr = aggbox_xdp_strip(ctx, len);
		if (!hdr)
			return XDP_DROP;
		hdr->kind = AGGBOX_KIND_BCAST_LANDED;
		hdr->flags = 0;
		hdr->count = landed;
		aggbox_bcount(AGGBOX_BSTAT_LANDED);
		/* The process's one wake-up for these chunks. TC ingress (which,
		 * unlike XDP, can copy a packet) answers the chunk on the way up,
		 * so the root does not wait for this process to run. */
		return XDP_PASS;
	}
	goto reply;

ack:
	rank = rx->rank;
	len = bpf_ntohs(pkt->udp->len) - sizeof(struct udphdr) - sizeof(*hdr);
reply:
	hdr = aggbox_xdp_strip(ctx, len);
	if (!hdr)
		return XDP_DROP;
	hdr->kind = AGGBOX_KIND_BCAST_ACK;
	hdr->sender = rank;
	hdr->flags = 0;
	aggbox_bcount(AGGBOX_BSTAT_ACKS_SENT);
	return aggbox_xdp_bounce(ctx);

to_user:
	aggbox_bcount(AGGBOX_BSTAT_TO_USER);
	return XDP_PASS;
}

/* ---- TC ingress: receiver, one datagram or a super-chunk ------------------------ */

/*
 * A super-chunk is one UDP GSO send of consecutive chunks of a broadcast:
 * every segment is a whole AggBox datagram (header and chunk), at a fixed
 * stride of skb->gso_size UDP payload bytes, the last possibly shorter.
 * Where nothing segments it (veth, a bridge) TC ingress sees one skb of
 * skb->gso_segs segments and walks it here; where something does, it sees
 * the datagrams one by one. A plain datagram is a walk of one segment.
 */
struct aggbox_walk {
	struct __sk_buff *skb;
	struct aggbox_rxctl *rx;
	__u64 words[AGGBOX_HDR_LEN / 8]; /* the first segment's header */
	__u32 hdr_off; /* offset of the first segment's AggBox header */
	__u32 stride; /* UDP payload bytes of a segment */
	__u32 total; /* UDP payload bytes of all segments */
	__u32 first; /* the first segment's chunk */
	__u32 slot_base; /* ab_rxwin index of the phase's first slot */
	__u32 done; /* segments handled: placed, or held already */
	__u32 landed; /* rx->landed after the last placement */
	__u8 notify; /* a placement reached a notification step */
};

/* The header word that holds `seq` (low half) and `chunk` (high half). */
#define AGGBOX_HDR_SEQ_WORD (offsetof(struct aggbox_hdr, seq) / 8)

/* Bytes of chunk payload in segment i. */
static __always_inline __u32 aggbox_seg_len(struct aggbox_walk *w, __u32 i)
{
	__u32 start = i * w->stride, end = start + w->stride;

	if (end > w->total)
		end = w->total;
	return end - start - AGGBOX_HDR_LEN;
}

/*
 * The walk's geometry from the skb: where the first AggBox header is, the
 * UDP payload bytes of all segments and of each (`udp_len`, network order,
 * is the first UDP header's length). Returns the segments (at most `max`),
 * or 0 when the skb disagrees with itself (a length, a stride, a count).
 * The caller checks the stride against its chunk size.
 */
static __always_inline __u32 aggbox_walk_geometry(struct __sk_buff *skb, struct aggbox_walk *w, __u16 udp_len, __u32 max)
{
	__u32 segs;

	w->hdr_off = AGGBOX_OFF_UDP + sizeof(struct udphdr);
	if (skb->len < w->hdr_off || bpf_ntohs(udp_len) != skb->len - AGGBOX_OFF_UDP)
		return 0; /* UDP says another length than the skb has */
	w->total = skb->len - w->hdr_off;
	if (skb->gso_segs <= 1) {
		w->stride = w->total;
		return 1;
	}
	w->stride = skb->gso_size;
	segs = skb->gso_segs;
	if (w->stride <= AGGBOX_HDR_LEN || segs > max || (w->total + w->stride - 1) / w->stride != segs)
		return 0;
	return segs;
}

/* Checks segment i's header against the first's: the same in every field
 * but `chunk`, which counts on (bpf_loop callback). */
static long aggbox_check_seg(__u64 i, void *data)
{
	struct aggbox_walk *w = data;
	__u64 words[AGGBOX_HDR_LEN / 8];
	__u32 k;

	if (bpf_skb_load_bytes(w->skb, w->hdr_off + (__u32)i * w->stride, words, sizeof(words))) {
		w->done = 0;
		return 1;
	}
	for (k = 0; k < AGGBOX_HDR_LEN / 8; k++) {
		__u64 want = w->words[k];

		if (k == AGGBOX_HDR_SEQ_WORD)
			want = (want & 0xffffffffull) | ((__u64)(w->first + (__u32)i) << 32);
		if (words[k] != want) {
			w->done = 0;
			return 1;
		}
	}
	w->done = (__u32)i + 1;
	return 0;
}

/* Whether every one of the walk's `segs` segments has the first's header
 * `hdr` but for its chunk (aggbox_check_seg); keeps `hdr` in the walk. */
static __always_inline int aggbox_walk_segs_agree(struct aggbox_walk *w, struct aggbox_hdr *hdr, __u32 segs)
{
	__builtin_memcpy(w->words, hdr, sizeof(w->words));
	if (segs <= 1)
		return 1;
	bpf_loop(segs, aggbox_check_seg, w, 0);
	return w->done == segs;
}

/* Places segment i (bpf_loop callback; stops at the first it cannot). */
static long aggbox_place_seg(__u64 i, void *data)
{
	struct aggbox_walk *w = data;
	struct aggbox_rxctl *rx = w->rx;
	struct aggbox_rxslot *slot;
	__u32 chunk = w->first + (__u32)i, seq, slot_idx, landed;

	if (!rx)
		return 1;
	seq = rx->seq;
	/* Below the window: copied out long ago; only ACK it again. */
	if (chunk + AGGBOX_RX_WINDOW < rx->credit) {
		aggbox_bcount(AGGBOX_BSTAT_DUPLICATES);
		w->done = (__u32)i + 1;
		return 0;
	}
	slot_idx = w->slot_base + (chunk & (AGGBOX_RX_WINDOW - 1));
	slot = bpf_map_lookup_elem(&ab_rxwin, &slot_idx);
	if (!slot)
		return 1;
	switch (aggbox_place(w->skb, 1, slot, aggbox_tag(seq, chunk), w->hdr_off + (__u32)i * w->stride + AGGBOX_HDR_LEN,
			     aggbox_seg_len(w, (__u32)i))) {
	case AGGBOX_PLACE_HELD:
		aggbox_bcount(AGGBOX_BSTAT_DUPLICATES); /* its ACK was lost: ACK again */
		w->done = (__u32)i + 1;
		return 0;
	case AGGBOX_PLACED:
		break;
	default:
		return 1;
	}
	if (rx->seq != seq)
		return 1; /* the window moved on meanwhile: do not count it */
	aggbox_bcount(AGGBOX_BSTAT_PLACED);
	if (aggbox_count_landed(&rx->landed, &rx->target, &rx->notified, rx->notify, &landed)) {
		w->notify = 1;
		w->landed = landed;
	}
	w->done = (__u32)i + 1;
	return 0;
}

/* Cuts the skb to its first segment's header, as the BCAST_ACK of the
 * chunks [first, first + done) from `rank`; swaps its ends. */
static __always_inline struct aggbox_hdr *aggbox_tc_make_ack(struct __sk_buff *skb, struct aggbox_walk *w, __u16 rank)
{
	struct aggbox_hdr *hdr = aggbox_tc_strip(skb);

	if (!hdr)
		return NULL;
	hdr->kind = AGGBOX_KIND_BCAST_ACK;
	hdr->sender = rank;
	hdr->chunk = w->first;
	hdr->flags = w->done > 1 ? AGGBOX_FLAG_RANGE : 0;
	if (w->done > 1)
		hdr->count = w->done;
	if (aggbox_tc_swap(skb))
		return NULL;
	return aggbox_tc_hdr(skb);
}

/*
 * TC ingress on the TC datapath: a BCAST_DATA (one datagram, or a
 * super-chunk) of the broadcast the process armed. Every segment is checked
 * against the first before anything is placed; each is placed in the
 * receive window; then the skb becomes one ACK of all the chunks it
 * carried, sent back from here (bpf_redirect), or, when it completes a
 * notification step, a copy of that ACK is sent and the skb goes up to the
 * process as its BCAST_LANDED notice, flagged ANSWERED. What the kernel
 * does not take whole (unarmed, beyond the credit, another broadcast, a
 * call that disagrees) goes up to the socket unchanged, as from XDP; a
 * super-chunk whose segments disagree with each other or with the chunk
 * size is dropped and counted.
 */
static __always_inline int aggbox_tc_bcast_data(struct __sk_buff *skb, struct aggbox_pkt *pkt)
{
	struct aggbox_hdr *hdr = pkt->hdr;
	struct aggbox_walk walk = {};
	struct aggbox_ctl *ctl;
	struct aggbox_rxctl *rx;
	__u32 ctl_idx = pkt->ctl, seq = hdr->seq, segs, last, want;
	__u16 rank, root = hdr->sender;

	ctl = bpf_map_lookup_elem(&ab_ctl, &ctl_idx);
	if (!ctl || pkt->ip->ihl != 5)
		goto to_user;
	rx = &ctl->rx[seq & (AGGBOX_RX_PHASES - 1)];
	walk.skb = skb;
	walk.rx = rx;
	walk.first = hdr->chunk;
	segs = aggbox_walk_geometry(skb, &walk, pkt->udp->len, AGGBOX_RX_WINDOW);
	if (segs == 0)
		goto bad;
	if (rx->seq != 0 && seq == rx->seq && aggbox_claim(rx, hdr))
		goto to_user;
	/* Only the broadcast the process armed, exactly as it called it, and
	 * only what the credit admits whole. */
	last = walk.first + segs - 1;
	if (rx->seq == 0 || seq != rx->seq || hdr->sender != rx->root || hdr->nchunks != rx->nchunks ||
	    hdr->count != rx->count || hdr->dtype != rx->dtype || last < walk.first || last >= rx->nchunks ||
	    last >= rx->credit)
		goto to_user;
	/* Every segment but the last is a whole chunk; the last is its chunk. */
	if (segs > 1 && walk.stride != AGGBOX_HDR_LEN + rx->chunk_bytes)
		goto bad;
	want = last + 1 == rx->nchunks ? rx->last_bytes : rx->chunk_bytes;
	if (aggbox_seg_len(&walk, segs - 1) != want || want > AGGBOX_CHUNK_MAX)
		goto bad;
	if (!aggbox_walk_segs_agree(&walk, hdr, segs))
		goto bad;
	walk.slot_base = ctl_idx * AGGBOX_RX_SLOTS + (seq & (AGGBOX_RX_PHASES - 1)) * AGGBOX_RX_WINDOW;
	walk.done = 0;
	rank = rx->rank;
	bpf_loop(segs, aggbox_place_seg, &walk, 0);
	/* pkt's pointers are invalid from here on. */
	if (walk.done == 0)
		goto to_user; /* nothing taken: all of it to user space, which places it exactly once */
	if (walk.done < segs)
		aggbox_bcount_n(AGGBOX_BSTAT_SEGMENTS_REFUSED, segs - walk.done);
	if (segs > 1)
		aggbox_bcount(AGGBOX_BSTAT_SUPERCHUNKS);
	hdr = aggbox_tc_make_ack(skb, &walk, rank);
	if (!hdr)
		return TC_ACT_SHOT; /* a loss: the root resends */
	aggbox_bcount(AGGBOX_BSTAT_ACKS_SENT);
	if (!walk.notify)
		return bpf_redirect(skb->ifindex, 0);
	/* The process's one wake-up for these chunks: a copy of the ACK goes
	 * back to the root, and the skb up as the landed notice. */
	if (bpf_clone_redirect(skb, skb->ifindex, 0))
		walk.notify = 2; /* not sent: the process answers it */
	if (aggbox_tc_swap(skb))
		return TC_ACT_SHOT;
	hdr = aggbox_tc_hdr(skb);
	if (!hdr)
		return TC_ACT_SHOT;
	hdr->kind = AGGBOX_KIND_BCAST_LANDED;
	hdr->sender = root;
	hdr->chunk = walk.first + walk.done - 1;
	hdr->flags = walk.notify == 2 ? 0 : AGGBOX_FLAG_ANSWERED;
	hdr->count = walk.landed;
	aggbox_bcount(AGGBOX_BSTAT_LANDED);
	return TC_ACT_OK;

bad:
	aggbox_bcount(AGGBOX_BSTAT_BAD_SEGMENTS);
	return TC_ACT_SHOT;
to_user:
	aggbox_bcount(AGGBOX_BSTAT_TO_USER);
	return TC_ACT_OK;
}

/* ---- Root: folding ACKs (XDP and TC alike) ----------------------------------- */

/* What aggbox_bcast_fold_ack did with an ACK. */
enum aggbox_fold_verdict {
	AGGBOX_FOLD_CONSUMED = 0, /* folded (or a repeat): drop it */
	AGGBOX_FOLD_GROUP = 1, /* turned into the group-ACK in place: pass it up */
	AGGBOX_FOLD_TO_USER = 2, /* not the kernel's to fold: pass it up unchanged */
};

/* One ACK fold: the chunks [first, first + n) acknowledged by `sender`. */
struct aggbox_fold {
	struct aggbox_ctl *ctl;
	__u32 ctl_idx;
	__u32 seq;
	__u32 first;
	__u32 sender;
	__u32 done; /* the send window's count of chunks held by all, after the last completion */
	__u8 group; /* a completion reached a notification step: let a group-ACK up */
	__u8 to_user; /* a chunk's slot does not track it: user space folds the ACK */
	__u8 folded; /* at least one new bit */
};

/* Folds chunk first + i (bpf_loop callback; stops at the first chunk the
 * send window does not track). */
static long aggbox_fold_one(__u64 i, void *data)
{
	struct aggbox_fold *f = data;
	struct aggbox_ctl *ctl = f->ctl;
	struct aggbox_txslot *slot;
	__u32 chunk = f->first + (__u32)i, slot_idx, word, count, done;
	__u64 bit, old;

	if (!ctl || ctl->tx_seq == 0 || f->seq != ctl->tx_seq || chunk >= ctl->tx_nchunks) {
		f->to_user = 1;
		return 1;
	}
	slot_idx = f->ctl_idx * AGGBOX_TX_SLOTS + (chunk & (AGGBOX_TX_SLOTS - 1));
	slot = bpf_map_lookup_elem(&ab_txwin, &slot_idx);
	if (!slot || slot->tag != aggbox_tag(f->seq, chunk)) {
		f->to_user = 1;
		return 1;
	}
	word = (f->sender / 64) & (AGGBOX_RANK_WORDS - 1);
	bit = 1ULL << (f->sender % 64);
	old = __sync_fetch_and_or(&slot->bits[word], bit);
	if (old & bit) {
		aggbox_bcount(AGGBOX_BSTAT_DUPLICATES);
		return 0;
	}
	if (slot->tag != aggbox_tag(f->seq, chunk)) {
		/* The root readied the slot for a later chunk meanwhile: this bit
		 * is not that chunk's. A genuine ACK lost here is found by a probe. */
		__sync_fetch_and_and(&slot->bits[word], ~bit);
		f->to_user = 1;
		return 1;
	}
	aggbox_bcount(AGGBOX_BSTAT_ACKS_FOLDED);
	f->folded = 1;
	count = __sync_fetch_and_add(&slot->count, 1) + 1;
	if (count != ctl->tx_receivers || ctl->tx_seq != f->seq)
		return 0;
	done = __sync_fetch_and_add(&ctl->tx_done, 1) + 1;
	f->done = done;
	if (done == ctl->tx_nchunks || (ctl->tx_notify && done % ctl->tx_notify == 0))
		f->group = 1;
	return 0;
}

/*
 * At the root: folds a BCAST_ACK (one chunk, or with RANGE `count` chunks
 * from `chunk` on) into the send window with atomic fetch-and-or (a repeat
 * changes nothing); when a chunk is then held by every receiver it counts
 * it, and every notification step and at the last it turns the ACK into one
 * BCAST_ACK(GROUP) in place: the root's wake-up. `pkt`'s pointers are read
 * before the fold and written after it, which calls no helper that moves
 * packet data.
 */
static __always_inline enum aggbox_fold_verdict aggbox_bcast_fold_ack(struct aggbox_pkt *pkt, __u32 ctl_idx)
{
	struct aggbox_hdr *hdr = pkt->hdr;
	struct aggbox_fold fold = {};
	__u32 n = 1;

	if (hdr->flags & ~AGGBOX_FLAG_RANGE)
		goto to_user;
	if (hdr->flags & AGGBOX_FLAG_RANGE) {
		n = hdr->count;
		if (n == 0 || n > AGGBOX_TX_SLOTS)
			goto to_user;
	}
	fold.ctl = bpf_map_lookup_elem(&ab_ctl, &ctl_idx);
	if (!fold.ctl)
		goto to_user;
	fold.ctl_idx = ctl_idx;
	fold.seq = hdr->seq;
	fold.first = hdr->chunk;
	fold.sender = hdr->sender;
	bpf_loop(n, aggbox_fold_one, &fold, 0);
	if (fold.to_user)
		goto to_user; /* user space folds all of it again: repeats change nothing */
	if (!fold.group)
		return AGGBOX_FOLD_CONSUMED;
	/* The group-ACK: the root's one wake-up for these chunks. */
	hdr->flags = AGGBOX_FLAG_GROUP;
	hdr->count = fold.done;
	pkt->udp->check = 0;
	aggbox_bcount(AGGBOX_BSTAT_GROUP_ACKS);
	return AGGBOX_FOLD_GROUP;

to_user:
	aggbox_bcount(AGGBOX_BSTAT_TO_USER);
	return AGGBOX_FOLD_TO_USER;
}

/* XDP's entry to the fold. */
static __always_inline int aggbox_xdp_bcast_ack(struct xdp_md *ctx, struct aggbox_pkt *pkt, __u32 ctl_idx)
{
	return aggbox_bcast_fold_ack(pkt, ctl_idx) == AGGBOX_FOLD_CONSUMED ? XDP_DROP : XDP_PASS;
}

#endif /* AGGBOX_BCAST_H */
