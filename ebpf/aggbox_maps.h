/* SPDX-License-Identifier: Apache-2.0 */
/*
 * Maps shared by every AggBox program on an interface.
 *
 * Each object declares the same maps with LIBBPF_PIN_BY_NAME, so the loader
 * pins them once under /sys/fs/bpf/aggbox/<netns>-<ifindex>/ and every later
 * object and process reuses the same kernel maps. The value layouts are
 * mirrored in core/src/maps.rs (with a layout test).
 */
#ifndef AGGBOX_MAPS_H
#define AGGBOX_MAPS_H

#include <linux/bpf.h>
#include <bpf/bpf_helpers.h>
#include "aggbox_wire.h"

/* How many communicators (local ports) and groups one host serves. */
#define AGGBOX_MAX_PORTS 1024
#define AGGBOX_MAX_GROUPS 1024
#define AGGBOX_MAX_MEMBERS (AGGBOX_MAX_GROUPS * 64)

/* ab_ports: local (IPv4 address, UDP port) of a communicator -> the group it
 * serves. Keyed by address too, so a datagram that merely crosses this
 * interface to another host's port of the same number (forwarded or NATed
 * traffic) is not taken for ours. */
struct aggbox_port_key {
	__u32 ipv4; /* network byte order, as in the IP header */
	__u16 port; /* host byte order */
	__u16 reserved;
};

struct aggbox_port {
	__u32 group;
};

/* ab_groups: group id -> what a datagram of that group must carry. */
struct aggbox_group {
	__u64 token;
	__u32 size; /* ranks in the group */
	__u32 reserved;
};

/* ab_members: (group, rank) -> where that rank's datagrams come from. */
struct aggbox_member_key {
	__u32 group;
	__u32 rank;
};

struct aggbox_member {
	__u32 ipv4; /* network byte order, as in the IP header */
	__u16 port; /* host byte order */
	__u8 mac[6];
};

/* ab_users: (pid, port) of a process using this attachment. Only user space
 * reads and writes it: it is the reference count that decides who detaches,
 * and it lets the next start reclaim what a killed process left. */
struct aggbox_user_key {
	__u32 pid;
	__u16 port;
	__u16 reserved;
};

struct aggbox_user {
	__u64 start_time; /* /proc/<pid>/stat field 22, to tell reused pids apart */
	__u32 group;
	__u32 ipv4; /* the communicator's address (network byte order) */
	__u32 pidns; /* inode of its PID namespace: pids mean nothing elsewhere */
	__u32 reserved;
};

/* Which program a counter belongs to. */
enum aggbox_prog {
	AGGBOX_PROG_XDP_INGRESS = 0,
	AGGBOX_PROG_TC_INGRESS = 1,
	AGGBOX_PROG_TC_EGRESS = 2,
	AGGBOX_PROG_MAX = 3,
};

/* Counters, per program: ab_stats[prog * AGGBOX_STAT_MAX + stat]. */
enum aggbox_stat {
	AGGBOX_STAT_SEEN = 0, /* every frame the program ran on */
	AGGBOX_STAT_PASSED_OTHER = 1, /* not AggBox's: passed untouched */
	AGGBOX_STAT_ACCEPTED = 2, /* valid AggBox datagram */
	AGGBOX_STAT_DROP_TRUNCATED = 3, /* shorter than its headers say */
	AGGBOX_STAT_DROP_BAD_MAGIC = 4,
	AGGBOX_STAT_DROP_BAD_VERSION = 5,
	AGGBOX_STAT_DROP_BAD_KIND = 6,
	AGGBOX_STAT_DROP_UNKNOWN_GROUP = 7, /* not the group of the port */
	AGGBOX_STAT_DROP_BAD_TOKEN = 8,
	AGGBOX_STAT_DROP_NOT_MEMBER = 9, /* sender rank or address not in group */
	AGGBOX_STAT_MAX = 10,
};

struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, AGGBOX_MAX_PORTS);
	__type(key, struct aggbox_port_key);
	__type(value, struct aggbox_port);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} ab_ports SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, AGGBOX_MAX_GROUPS);
	__type(key, __u32);
	__type(value, struct aggbox_group);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} ab_groups SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, AGGBOX_MAX_MEMBERS);
	__type(key, struct aggbox_member_key);
	__type(value, struct aggbox_member);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} ab_members SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, AGGBOX_MAX_PORTS);
	__type(key, struct aggbox_user_key);
	__type(value, struct aggbox_user);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} ab_users SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, AGGBOX_PROG_MAX * AGGBOX_STAT_MAX);
	__type(key, __u32);
	__type(value, __u64);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} ab_stats SEC(".maps");

static __always_inline void aggbox_count(enum aggbox_prog prog, enum aggbox_stat stat)
{
	__u32 idx = (__u32)prog * AGGBOX_STAT_MAX + (__u32)stat;
	__u64 *value = bpf_map_lookup_elem(&ab_stats, &idx);

	if (value)
		*value += 1; /* per-CPU slot: no other CPU writes it */
}

#endif /* AGGBOX_MAPS_H */
