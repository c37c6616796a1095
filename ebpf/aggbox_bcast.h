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
		aggbox_bcount(AGGBOX_BSTAT_CLONED);
	else
		aggbox_bcount(AGGBOX_BSTAT_CLONES_REFUSED);
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
	aggbox_bcount(AGGBOX_BSTAT_CLONED); /* the original: size - 1 copies in all */
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
	void *data = (void *)(long)skb->data;
	void *data_end = (void *)(long)skb->data_end;
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
	void *data = (void *)(long)skb->data;
	void *data_end = (void *)(long)skb->data_end;
	struct aggbox_hdr *hdr = data + AGGBOX_OFF_UDP + sizeof(struct udphdr);

	return (void *)(hdr + 1) > data_end ? NULL : hdr;
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
 * Copies the frame's `len` payload bytes into `slot` as the chunk tagged
 * `tag` (broadcast chunks in a receive window, reduction results in a
 * result window). The slot is taken only from a chunk older than this one
 * that nobody is copying in: never from a CPU still writing (busy), nor
 * from a newer chunk (this one is a stale copy that raced the window
 * forward). The caller checked len against the chunk's size.
 */
static __always_inline int aggbox_xdp_place(struct xdp_md *ctx, struct aggbox_rxslot *slot, __u64 tag, __u32 len)
{
	__u64 busy = tag | ((__u64)AGGBOX_TAG_BUSY), cur = slot->tag;

	if (cur == tag)
		return AGGBOX_PLACE_HELD;
	if ((cur & AGGBOX_TAG_BUSY) || !aggbox_tag_older(cur, tag))
		return AGGBOX_PLACE_REFUSED;
	if (__sync_val_compare_and_swap(&slot->tag, cur, busy) != cur)
		return AGGBOX_PLACE_REFUSED;
	/* The bound again, on the register the copy takes. */
	barrier_var(len);
	if (len > AGGBOX_CHUNK_MAX || (len > 0 && bpf_xdp_load_bytes(ctx, AGGBOX_OFF_PAYLOAD, slot->data, len))) {
		__sync_val_compare_and_swap(&slot->tag, busy, cur); /* give the slot back as it was */
		return AGGBOX_PLACE_REFUSED;
	}
	if (__sync_val_compare_and_swap(&slot->tag, busy, tag) != busy)
		return AGGBOX_PLACE_REFUSED;
	return AGGBOX_PLACED;
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

/* ---- XDP: root ----------------------------------------------------------------- */

static __always_inline int aggbox_xdp_bcast_ack(struct xdp_md *ctx, struct aggbox_pkt *pkt, __u32 ctl_idx)
{
	struct aggbox_hdr *hdr = pkt->hdr;
	struct aggbox_ctl *ctl;
	struct aggbox_txslot *slot;
	__u32 seq = hdr->seq, chunk = hdr->chunk, slot_idx, word, count, done;
	__u64 bit, old;

	ctl = bpf_map_lookup_elem(&ab_ctl, &ctl_idx);
	if (!ctl || hdr->flags || ctl->tx_seq == 0 || seq != ctl->tx_seq || chunk >= ctl->tx_nchunks)
		goto to_user;
	slot_idx = ctl_idx * AGGBOX_TX_SLOTS + (chunk & (AGGBOX_TX_SLOTS - 1));
	slot = bpf_map_lookup_elem(&ab_txwin, &slot_idx);
	if (!slot || slot->tag != aggbox_tag(seq, chunk))
		goto to_user;
	word = (hdr->sender / 64) & (AGGBOX_RANK_WORDS - 1);
	bit = 1ULL << (hdr->sender % 64);
	old = __sync_fetch_and_or(&slot->bits[word], bit);
	if (old & bit) {
		aggbox_bcount(AGGBOX_BSTAT_DUPLICATES);
		return XDP_DROP;
	}
	if (slot->tag != aggbox_tag(seq, chunk)) {
		/* The root readied the slot for a later chunk meanwhile: this bit
		 * is not that chunk's. A genuine ACK lost here is found by a probe. */
		__sync_fetch_and_and(&slot->bits[word], ~bit);
		goto to_user;
	}
	aggbox_bcount(AGGBOX_BSTAT_ACKS_FOLDED);
	count = __sync_fetch_and_add(&slot->count, 1) + 1;
	if (count != ctl->tx_receivers)
		return XDP_DROP;
	if (ctl->tx_seq != seq)
		return XDP_DROP; /* that broadcast is over */
	done = __sync_fetch_and_add(&ctl->tx_done, 1) + 1;
	if (done != ctl->tx_nchunks && (!ctl->tx_notify || done % ctl->tx_notify))
		return XDP_DROP;
	/* The group-ACK: the root's one wake-up for these chunks. */
	hdr->flags = AGGBOX_FLAG_GROUP;
	hdr->count = done;
	pkt->udp->check = 0;
	aggbox_bcount(AGGBOX_BSTAT_GROUP_ACKS);
	return XDP_PASS;

to_user:
	aggbox_bcount(AGGBOX_BSTAT_TO_USER);
	return XDP_PASS;
}

#endif /* AGGBOX_BCAST_H */
