//! Per-communicator counters, from user space and from the kernel maps.

use crate::{
    maps::{Prog, STAT_MAX, STAT_NAMES},
    Datapath,
};

/// Counters the communicator keeps in user space.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct UserStats {
    /// Datagrams sent (every copy, retransmissions included).
    pub packets_sent: u64,
    /// Datagrams received on the communicator's socket.
    pub packets_received: u64,
    /// Datagrams sent again because an answer did not come in time.
    pub retransmits: u64,
    /// Received datagrams that repeated one already handled (a broadcast
    /// chunk received again, an acknowledgment repeated, ...).
    pub duplicates: u64,
    /// Received datagrams dropped as malformed (truncated, bad magic/version/kind).
    pub dropped_malformed: u64,
    /// Received datagrams dropped for a wrong group, token or sender.
    pub dropped_foreign: u64,
    /// Barriers completed.
    pub barriers: u64,
    /// Broadcasts completed (as root or receiver).
    pub broadcasts: u64,
    /// `BCAST_DATA` datagrams sent as root, first transmissions only (one
    /// per chunk and receiver; repeats count in `retransmits`).
    pub bcast_chunks_sent: u64,
    /// `BCAST_ACK` datagrams of its own broadcasts a root received
    /// (repeats included; those also count in `duplicates`).
    pub bcast_acks_received: u64,
    /// Group-ACKs a kernel root received: its wake-ups for chunks the
    /// kernel folded (one per step of the window, and at the last).
    pub bcast_group_acks: u64,
    /// Landed notices a kernel receiver got: its wake-ups for chunks the
    /// kernel placed.
    pub bcast_landed: u64,
    /// Times a kernel receiver copied chunks the kernel placed into its
    /// buffer.
    pub bcast_from_kernel: u64,
    /// `BCAST_DATA` datagrams that reached the socket (repeats included).
    /// On the kernel datapath XDP places chunks in the mapped window
    /// instead, so there this counts only what XDP left to user space.
    pub bcast_chunks_received: u64,
    /// Chunks a receiver placed in its buffer from its socket (first copies
    /// only). On the kernel datapath, XDP placed the others; it leaves a
    /// chunk to user space when the process lags behind the root by a
    /// window or by two broadcasts (docs/BROADCAST.md).
    pub bcast_placed_from_socket: u64,
    /// Reductions completed (allreduce, reduce, reduce-scatter).
    pub reductions: u64,
    /// Reduction contributions sent to chunks' owners, first transmissions
    /// only (repeats count in `retransmits`).
    pub reduce_contributions_sent: u64,
    /// Contributions this rank folded as a chunk's owner, in user space.
    pub reduce_folded: u64,
    /// Results this rank sent as a chunk's owner (repeats included).
    pub reduce_results_sent: u64,
    /// Float sums and averages done as quantized integer sums (the others
    /// had NaN, infinite or all-zero inputs and were summed as floats).
    pub reduce_quantized: u64,
    /// Results of others' chunks this rank took from its socket (first
    /// copies only). On the kernel fan-out path (allreduce) XDP places them
    /// in the mapped result window instead: see `reduce_results_from_kernel`.
    pub reduce_results_received: u64,
    /// Results this rank copied out of its kernel result window, where XDP
    /// placed them.
    pub reduce_results_from_kernel: u64,
    /// Agreements decided (`agree`).
    pub agreements: u64,
    /// Agreement phases this rank computed from a quorum of values.
    pub agree_phases: u64,
    /// Agreement phases this rank reached by adopting a later phase's value.
    pub agree_jumps: u64,
    /// Agreement calls that resumed from a store (the rank had crashed).
    pub agree_restarts: u64,
    /// `AGREE_VALUE` datagrams of the running agreement that reached the
    /// socket. On the kernel datapath XDP folds a phase's values and passes
    /// up one notice instead, so there this counts values of other phases.
    pub agree_values_received: u64,
    /// Phase quorums XDP folded and announced with one notice.
    pub agree_quorums_from_kernel: u64,
    /// Values sent to ranks that lagged behind.
    pub agree_answers_sent: u64,
    /// Phase values sent once for TC egress to clone to every other rank
    /// (the kernel datapath; repeats included).
    pub agree_fanouts: u64,
    /// Times the communicator slept waiting for its socket (woken by a
    /// datagram or a timer): its wake-ups.
    pub socket_waits: u64,
    /// System calls the communicator made on its socket (sends, receives,
    /// polls): divided by the operations, the benchmarks' syscalls per
    /// operation.
    pub syscalls: u64,
}

/// Counters of the BPF programs on the communicator's interface. They are per
/// interface, shared by every communicator attached there.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct KernelStats {
    /// `counters[prog][stat]`, indexed by [`Prog`] and [`STAT_NAMES`].
    pub counters: [[u64; STAT_MAX]; 3],
}

impl KernelStats {
    /// The counter named `stat` (one of [`STAT_NAMES`]) of `prog`.
    pub fn get(&self, prog: Prog, stat: &str) -> u64 {
        let index = STAT_NAMES
            .iter()
            .position(|name| *name == stat)
            .unwrap_or_else(|| panic!("unknown counter {stat}"));
        self.counters[prog as usize][index]
    }
}

/// A snapshot of a communicator's counters.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Stats {
    /// The datapath in use.
    pub datapath: Datapath,
    /// User-space counters.
    pub user: UserStats,
    /// Kernel counters (all zero on the user datapath).
    pub kernel: KernelStats,
}
