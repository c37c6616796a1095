package aggbox

// #include "aggbox_go.h"
import "C"

// The first index of Stats.Kernel: a BPF program.
const (
	ProgXDPIngress = C.AGGBOX_PROG_XDP_INGRESS
	ProgTCIngress  = C.AGGBOX_PROG_TC_INGRESS
	ProgTCEgress   = C.AGGBOX_PROG_TC_EGRESS
	ProgCount      = C.AGGBOX_PROG_COUNT
)

// The second index of Stats.Kernel: a counter of each BPF program.
const (
	StatSeen             = C.AGGBOX_STAT_SEEN
	StatPassedOther      = C.AGGBOX_STAT_PASSED_OTHER
	StatAccepted         = C.AGGBOX_STAT_ACCEPTED
	StatDropTruncated    = C.AGGBOX_STAT_DROP_TRUNCATED
	StatDropBadMagic     = C.AGGBOX_STAT_DROP_BAD_MAGIC
	StatDropBadVersion   = C.AGGBOX_STAT_DROP_BAD_VERSION
	StatDropBadKind      = C.AGGBOX_STAT_DROP_BAD_KIND
	StatDropUnknownGroup = C.AGGBOX_STAT_DROP_UNKNOWN_GROUP
	StatDropBadToken     = C.AGGBOX_STAT_DROP_BAD_TOKEN
	StatDropNotMember    = C.AGGBOX_STAT_DROP_NOT_MEMBER
	StatCount            = C.AGGBOX_STAT_COUNT
)

// Stats is a snapshot of a communicator's counters (aggbox_stats).
type Stats struct {
	// Datapath is the datapath in use.
	Datapath Datapath
	// PacketsSent: datagrams sent (every copy, retransmissions included).
	PacketsSent uint64
	// PacketsReceived: datagrams received on the communicator's socket.
	PacketsReceived uint64
	// Retransmits: datagrams sent again because an answer did not come in
	// time.
	Retransmits uint64
	// Duplicates: received datagrams that repeated one already handled.
	Duplicates uint64
	// DroppedMalformed: received datagrams dropped as malformed (truncated,
	// bad magic/version/kind).
	DroppedMalformed uint64
	// DroppedForeign: received datagrams dropped for a wrong group, token or
	// sender.
	DroppedForeign uint64
	// Barriers: barriers completed.
	Barriers uint64
	// Kernel holds the counters of the BPF programs on the interface, indexed
	// by program (ProgXDPIngress, ...) and counter (StatSeen, ...); they are
	// shared by every communicator there, and zero on the user datapath.
	Kernel [ProgCount][StatCount]uint64
	// Broadcasts: broadcasts completed (as root or receiver).
	Broadcasts uint64
	// BcastChunksSent: broadcast chunks sent as root, first transmissions
	// only: one per chunk and receiver (repeats count in retransmits).
	BcastChunksSent uint64
	// BcastAcksReceived: acknowledgments of its own broadcasts' chunks a root
	// received (repeats included; those also count in duplicates).
	BcastAcksReceived uint64
	// BcastGroupAcks: group-ACKs a kernel root received: its wake-ups for
	// chunks the kernel folded (one per step of its window, and at the last).
	BcastGroupAcks uint64
	// BcastLanded: landed notices a kernel receiver got: its wake-ups for
	// chunks the kernel placed.
	BcastLanded uint64
	// BcastFromKernel: times a kernel receiver copied chunks the kernel placed
	// into its buffer.
	BcastFromKernel uint64
	// BcastChunksReceived: broadcast chunks that reached the socket (repeats
	// included). On the kernel datapath XDP places chunks in the mapped window
	// instead, so there this counts only what XDP left to user space.
	BcastChunksReceived uint64
	// BcastPlacedFromSocket: broadcast chunks a receiver placed from its
	// socket (first copies only); on the kernel datapath XDP placed the
	// others.
	BcastPlacedFromSocket uint64
	// Syscalls: system calls the communicator made on its socket (sends,
	// receives, polls).
	Syscalls uint64
	// Reductions: reductions completed (allreduce, reduce, reduce-scatter).
	Reductions uint64
	// ReduceContributionsSent: reduction contributions sent to chunks' owners,
	// first transmissions only (repeats count in retransmits).
	ReduceContributionsSent uint64
	// ReduceFolded: contributions this rank folded as a chunk's owner, in user
	// space.
	ReduceFolded uint64
	// ReduceResultsSent: results this rank sent as a chunk's owner (repeats
	// included).
	ReduceResultsSent uint64
	// ReduceQuantized: float sums and averages done as quantized integer sums
	// (the others had NaN, infinite or all-zero inputs and were summed as
	// floats).
	ReduceQuantized uint64
	// ReduceResultsReceived: results of others' chunks this rank took from its
	// socket (first copies only); on the kernel datapath's allreduce XDP
	// places them in the mapped result window instead.
	ReduceResultsReceived uint64
	// ReduceResultsFromKernel: results this rank copied out of its kernel
	// result window.
	ReduceResultsFromKernel uint64
	// Agreements: agreements decided (aggbox_agree).
	Agreements uint64
	// AgreePhases: agreement phases this rank computed from a quorum of
	// values.
	AgreePhases uint64
	// AgreeJumps: agreement phases this rank reached by adopting a later
	// phase's value.
	AgreeJumps uint64
	// AgreeRestarts: agreement calls that resumed from a store (the rank had
	// crashed).
	AgreeRestarts uint64
	// AgreeValuesReceived: values of the running agreement that reached the
	// socket; on the kernel datapath XDP folds a phase's values instead.
	AgreeValuesReceived uint64
	// AgreeQuorumsFromKernel: phase quorums XDP folded and announced with one
	// notice.
	AgreeQuorumsFromKernel uint64
	// AgreeAnswersSent: values sent to ranks that lagged behind.
	AgreeAnswersSent uint64
	// AgreeFanouts: phase values sent once for TC egress to clone to every
	// other rank (the kernel datapath; repeats included).
	AgreeFanouts uint64
	// SocketWaits: times the communicator slept waiting for its socket (woken
	// by a datagram or a timer): its wake-ups.
	SocketWaits uint64
}

// Stats is a snapshot of the communicator's counters; the zero Stats when
// c is nil or closed. Like a collective, it waits for the asynchronous
// operations pending on c.
func (c *Comm) Stats() Stats {
	h, err := c.lock("aggbox_comm_stats")
	if err != nil {
		return Stats{}
	}
	defer c.mu.Unlock()
	var s C.aggbox_stats
	if check(C.agg_comm_stats(h, &s)) != nil {
		return Stats{}
	}
	out := Stats{
		Datapath:                Datapath(s.datapath),
		PacketsSent:             uint64(s.packets_sent),
		PacketsReceived:         uint64(s.packets_received),
		Retransmits:             uint64(s.retransmits),
		Duplicates:              uint64(s.duplicates),
		DroppedMalformed:        uint64(s.dropped_malformed),
		DroppedForeign:          uint64(s.dropped_foreign),
		Barriers:                uint64(s.barriers),
		Broadcasts:              uint64(s.broadcasts),
		BcastChunksSent:         uint64(s.bcast_chunks_sent),
		BcastAcksReceived:       uint64(s.bcast_acks_received),
		BcastGroupAcks:          uint64(s.bcast_group_acks),
		BcastLanded:             uint64(s.bcast_landed),
		BcastFromKernel:         uint64(s.bcast_from_kernel),
		BcastChunksReceived:     uint64(s.bcast_chunks_received),
		BcastPlacedFromSocket:   uint64(s.bcast_placed_from_socket),
		Syscalls:                uint64(s.syscalls),
		Reductions:              uint64(s.reductions),
		ReduceContributionsSent: uint64(s.reduce_contributions_sent),
		ReduceFolded:            uint64(s.reduce_folded),
		ReduceResultsSent:       uint64(s.reduce_results_sent),
		ReduceQuantized:         uint64(s.reduce_quantized),
		ReduceResultsReceived:   uint64(s.reduce_results_received),
		ReduceResultsFromKernel: uint64(s.reduce_results_from_kernel),
		Agreements:              uint64(s.agreements),
		AgreePhases:             uint64(s.agree_phases),
		AgreeJumps:              uint64(s.agree_jumps),
		AgreeRestarts:           uint64(s.agree_restarts),
		AgreeValuesReceived:     uint64(s.agree_values_received),
		AgreeQuorumsFromKernel:  uint64(s.agree_quorums_from_kernel),
		AgreeAnswersSent:        uint64(s.agree_answers_sent),
		AgreeFanouts:            uint64(s.agree_fanouts),
		SocketWaits:             uint64(s.socket_waits),
	}
	for p := range out.Kernel {
		for k := range out.Kernel[p] {
			out.Kernel[p][k] = uint64(s.kernel[p][k])
		}
	}
	return out
}

// KVStats is what a key-value reduce did at this rank (aggbox_kv_stats).
type KVStats struct {
	// PairsEmitted: pairs this rank emitted.
	PairsEmitted uint64
	// PairsLocal: of those, pairs of keys it owns (never sent).
	PairsLocal uint64
	// BatchesSent: batches sent to owners, first transmissions only.
	BatchesSent uint64
	// Retransmits: batches sent again (not acknowledged in time).
	Retransmits uint64
	// Duplicates: batches received again after they were counted (not folded
	// again).
	Duplicates uint64
	// PairsFoldedUser: pairs from other ranks this owner folded in user space.
	PairsFoldedUser uint64
	// PairsFoldedKernel: pairs this owner's XDP folded into the kernel table.
	PairsFoldedKernel uint64
	// Spilled: pairs the kernel left to user space (long keys, a full kernel
	// table).
	Spilled uint64
	// BatchesUnarmed: kernel datapath: batches that reached this owner's
	// socket before it armed the operation (dropped; sent again and folded by
	// XDP).
	BatchesUnarmed uint64
	// PairsCombined: pairs this rank combined into an earlier pair of the same
	// key before sending (aggbox_kv_config.combine).
	PairsCombined uint64
}

func kvStatsOf(s *C.aggbox_kv_stats) KVStats {
	return KVStats{
		PairsEmitted:      uint64(s.pairs_emitted),
		PairsLocal:        uint64(s.pairs_local),
		BatchesSent:       uint64(s.batches_sent),
		Retransmits:       uint64(s.retransmits),
		Duplicates:        uint64(s.duplicates),
		PairsFoldedUser:   uint64(s.pairs_folded_user),
		PairsFoldedKernel: uint64(s.pairs_folded_kernel),
		Spilled:           uint64(s.spilled),
		BatchesUnarmed:    uint64(s.batches_unarmed),
		PairsCombined:     uint64(s.pairs_combined),
	}
}
