// SPDX-License-Identifier: GPL-2.0 OR Apache-2.0
/*
 * A bare XDP_PASS for the bridge-side veth of each virtual host: a veth only
 * accepts the XDP_TX frames of its peer when an XDP program is attached to it.
 */
#include <linux/bpf.h>
#include <bpf/bpf_helpers.h>

SEC("xdp")
int aggbox_xdp_pass(struct xdp_md *ctx)
{
	return XDP_PASS;
}

char LICENSE[] SEC("license") = "Dual BSD/GPL";
