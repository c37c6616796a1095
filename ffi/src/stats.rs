//! `aggbox_stats`: a communicator's counters, from user space and from the
//! BPF programs.

use std::mem::{offset_of, size_of};

use aggbox_core::{
    maps::{Prog, STAT_MAX},
    stats::UserStats,
    Stats,
};

use crate::{
    boundary::{sized_struct_size, status_call},
    comm::{aggbox_comm, CommRef},
    types::{aggbox_datapath, aggbox_status, RawDatapath},
};

/// Number of BPF programs that keep counters: the first index of
/// `aggbox_stats.kernel`.
pub const AGGBOX_PROG_COUNT: usize = 3;
/// Number of counters per BPF program: the second index of
/// `aggbox_stats.kernel`.
pub const AGGBOX_STAT_COUNT: usize = 10;

const _: () = assert!(AGGBOX_PROG_COUNT == Prog::ALL.len() && AGGBOX_STAT_COUNT == STAT_MAX);

/// A BPF program that keeps counters: the first index of
/// `aggbox_stats.kernel`.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum aggbox_prog {
    /// The XDP program on ingress: aggregation, ACK folding, placement.
    AGGBOX_PROG_XDP_INGRESS = 0,
    /// The TC program on ingress: fan-out of results completed in XDP.
    AGGBOX_PROG_TC_INGRESS = 1,
    /// The TC program on egress: broadcast fan-out.
    AGGBOX_PROG_TC_EGRESS = 2,
}

/// A counter of each BPF program: the second index of `aggbox_stats.kernel`.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum aggbox_stat {
    /// Packets the program looked at.
    AGGBOX_STAT_SEEN = 0,
    /// Packets that were not AggBox's, passed untouched.
    AGGBOX_STAT_PASSED_OTHER = 1,
    /// AggBox packets accepted and handled.
    AGGBOX_STAT_ACCEPTED = 2,
    /// Dropped: shorter than the AggBox header.
    AGGBOX_STAT_DROP_TRUNCATED = 3,
    /// Dropped: wrong magic number.
    AGGBOX_STAT_DROP_BAD_MAGIC = 4,
    /// Dropped: unknown wire version.
    AGGBOX_STAT_DROP_BAD_VERSION = 5,
    /// Dropped: unknown packet kind.
    AGGBOX_STAT_DROP_BAD_KIND = 6,
    /// Dropped: no such group on this host.
    AGGBOX_STAT_DROP_UNKNOWN_GROUP = 7,
    /// Dropped: the group token did not match.
    AGGBOX_STAT_DROP_BAD_TOKEN = 8,
    /// Dropped: the sender is not a member of the group.
    AGGBOX_STAT_DROP_NOT_MEMBER = 9,
}

impl aggbox_prog {
    /// Every program, in index order.
    /// cbindgen:ignore
    pub const ALL: [aggbox_prog; AGGBOX_PROG_COUNT] = [
        aggbox_prog::AGGBOX_PROG_XDP_INGRESS,
        aggbox_prog::AGGBOX_PROG_TC_INGRESS,
        aggbox_prog::AGGBOX_PROG_TC_EGRESS,
    ];
}

impl aggbox_stat {
    /// Every counter, in index order.
    /// cbindgen:ignore
    pub const ALL: [aggbox_stat; AGGBOX_STAT_COUNT] = [
        aggbox_stat::AGGBOX_STAT_SEEN,
        aggbox_stat::AGGBOX_STAT_PASSED_OTHER,
        aggbox_stat::AGGBOX_STAT_ACCEPTED,
        aggbox_stat::AGGBOX_STAT_DROP_TRUNCATED,
        aggbox_stat::AGGBOX_STAT_DROP_BAD_MAGIC,
        aggbox_stat::AGGBOX_STAT_DROP_BAD_VERSION,
        aggbox_stat::AGGBOX_STAT_DROP_BAD_KIND,
        aggbox_stat::AGGBOX_STAT_DROP_UNKNOWN_GROUP,
        aggbox_stat::AGGBOX_STAT_DROP_BAD_TOKEN,
        aggbox_stat::AGGBOX_STAT_DROP_NOT_MEMBER,
    ];
}

/// A snapshot of a communicator's counters. Size-versioned: set `size` to
/// `sizeof(aggbox_stats)` before calling `aggbox_comm_stats`. Later versions
/// only append fields (new kernel counters come as new fields, the
/// dimensions of `kernel` stay as they are).
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct aggbox_stats {
    /// `sizeof(aggbox_stats)` as the program was compiled; set by the caller.
    pub size: usize,
    /// The datapath in use (`AGGBOX_DATAPATH_KERNEL` or `AGGBOX_DATAPATH_USER`).
    pub datapath: RawDatapath,
    /// Datagrams sent (every copy, retransmissions included).
    pub packets_sent: u64,
    /// Datagrams received on the communicator's socket.
    pub packets_received: u64,
    /// Datagrams sent again because an answer did not come in time.
    pub retransmits: u64,
    /// Received datagrams that repeated one already handled.
    pub duplicates: u64,
    /// Received datagrams dropped as malformed (truncated, bad
    /// magic/version/kind).
    pub dropped_malformed: u64,
    /// Received datagrams dropped for a wrong group, token or sender.
    pub dropped_foreign: u64,
    /// Barriers completed.
    pub barriers: u64,
    /// Counters of the BPF programs on the communicator's interface, indexed
    /// by `aggbox_prog` and `aggbox_stat`: `kernel[AGGBOX_PROG_XDP_INGRESS]
    /// [AGGBOX_STAT_ACCEPTED]`. They are per interface, shared by every
    /// communicator attached there, and all zero on the user datapath.
    pub kernel: [[u64; AGGBOX_STAT_COUNT]; AGGBOX_PROG_COUNT],
    /// Broadcasts completed (as root or receiver).
    pub broadcasts: u64,
    /// Broadcast chunks sent as root, first transmissions only: one per
    /// chunk and receiver (repeats count in `retransmits`).
    pub bcast_chunks_sent: u64,
    /// Acknowledgments of its own broadcasts' chunks a root received
    /// (repeats included; those also count in `duplicates`).
    pub bcast_acks_received: u64,
    /// Group-ACKs a kernel root received: its wake-ups for chunks the kernel
    /// folded (one per step of its window, and at the last).
    pub bcast_group_acks: u64,
    /// Landed notices a kernel receiver got: its wake-ups for chunks the
    /// kernel placed.
    pub bcast_landed: u64,
    /// Times a kernel receiver copied chunks the kernel placed into its
    /// buffer.
    pub bcast_from_kernel: u64,
    /// Broadcast chunks that reached the socket (repeats included). On the
    /// kernel datapath XDP places chunks in the mapped window instead, so
    /// there this counts only what XDP left to user space.
    pub bcast_chunks_received: u64,
    /// Broadcast chunks a receiver placed from its socket (first copies
    /// only); on the kernel datapath XDP placed the others.
    pub bcast_placed_from_socket: u64,
    /// System calls the communicator made on its socket (sends, receives,
    /// polls).
    pub syscalls: u64,
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
    /// copies only); on the kernel datapath's allreduce XDP places them in
    /// the mapped result window instead.
    pub reduce_results_received: u64,
    /// Results this rank copied out of its kernel result window.
    pub reduce_results_from_kernel: u64,
    /// Agreements decided (`aggbox_agree`).
    pub agreements: u64,
    /// Agreement phases this rank computed from a quorum of values.
    pub agree_phases: u64,
    /// Agreement phases this rank reached by adopting a later phase's value.
    pub agree_jumps: u64,
    /// Agreement calls that resumed from a store (the rank had crashed).
    pub agree_restarts: u64,
    /// Values of the running agreement that reached the socket; on the
    /// kernel datapath XDP folds a phase's values instead.
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
}

/// The smallest `size` accepted: up to and including `datapath`.
const MIN_SIZE: usize = offset_of!(aggbox_stats, datapath) + size_of::<RawDatapath>();

impl aggbox_stats {
    /// The C form of a core snapshot, with `size` set to `size`.
    fn from_core(stats: &Stats, size: usize) -> aggbox_stats {
        // Every field named, so that a new core counter fails to compile
        // here until it has its place in the C struct.
        let UserStats {
            packets_sent,
            packets_received,
            retransmits,
            duplicates,
            dropped_malformed,
            dropped_foreign,
            barriers,
            broadcasts,
            bcast_chunks_sent,
            bcast_acks_received,
            bcast_group_acks,
            bcast_landed,
            bcast_from_kernel,
            bcast_chunks_received,
            bcast_placed_from_socket,
            syscalls,
            reductions,
            reduce_contributions_sent,
            reduce_folded,
            reduce_results_sent,
            reduce_quantized,
            reduce_results_received,
            reduce_results_from_kernel,
            agreements,
            agree_phases,
            agree_jumps,
            agree_restarts,
            agree_values_received,
            agree_quorums_from_kernel,
            agree_answers_sent,
            agree_fanouts,
            socket_waits,
        } = stats.user;
        aggbox_stats {
            size,
            datapath: aggbox_datapath::from(stats.datapath) as RawDatapath,
            packets_sent,
            packets_received,
            retransmits,
            duplicates,
            dropped_malformed,
            dropped_foreign,
            barriers,
            kernel: stats.kernel.counters,
            broadcasts,
            bcast_chunks_sent,
            bcast_acks_received,
            bcast_group_acks,
            bcast_landed,
            bcast_from_kernel,
            bcast_chunks_received,
            bcast_placed_from_socket,
            syscalls,
            reductions,
            reduce_contributions_sent,
            reduce_folded,
            reduce_results_sent,
            reduce_quantized,
            reduce_results_received,
            reduce_results_from_kernel,
            agreements,
            agree_phases,
            agree_jumps,
            agree_restarts,
            agree_values_received,
            agree_quorums_from_kernel,
            agree_answers_sent,
            agree_fanouts,
            socket_waits,
        }
    }

    /// Writes to `out` each field that lies within its first `self.size`
    /// bytes (those of the caller's version of the struct); padding and
    /// anything further are left alone.
    ///
    /// # Safety
    ///
    /// `out` is aligned and valid for writing `self.size` bytes.
    unsafe fn write_to(&self, out: *mut aggbox_stats) {
        macro_rules! write_fields {
            ($($field:ident),*) => {$(
                if offset_of!(aggbox_stats, $field) + size_of_val(&self.$field) <= self.size {
                    // SAFETY: the field lies within the `self.size` writable
                    // bytes at `out` (the caller's promise).
                    unsafe { (&raw mut (*out).$field).write(self.$field) };
                }
            )*};
        }
        write_fields!(
            size,
            datapath,
            packets_sent,
            packets_received,
            retransmits,
            duplicates,
            dropped_malformed,
            dropped_foreign,
            barriers,
            kernel,
            broadcasts,
            bcast_chunks_sent,
            bcast_acks_received,
            bcast_group_acks,
            bcast_landed,
            bcast_from_kernel,
            bcast_chunks_received,
            bcast_placed_from_socket,
            syscalls,
            reductions,
            reduce_contributions_sent,
            reduce_folded,
            reduce_results_sent,
            reduce_quantized,
            reduce_results_received,
            reduce_results_from_kernel,
            agreements,
            agree_phases,
            agree_jumps,
            agree_restarts,
            agree_values_received,
            agree_quorums_from_kernel,
            agree_answers_sent,
            agree_fanouts,
            socket_waits
        );
    }
}

/// Fills `*stats` with a snapshot of the counters of `comm`. The caller sets
/// `stats->size` first; the library writes that many bytes (the fields of
/// the caller's version of the struct), and fails with
/// `AGGBOX_ERR_INVALID_ARGUMENT` when `size` is bigger than the library
/// knows.
///
/// # Safety
///
/// `comm` is NULL or a live communicator; `stats` is NULL or valid for
/// reading and writing `stats->size` bytes.
#[no_mangle]
pub unsafe extern "C" fn aggbox_comm_stats(
    comm: *const aggbox_comm,
    stats: *mut aggbox_stats,
) -> aggbox_status {
    status_call("aggbox_comm_stats", || {
        // SAFETY: the caller's promises.
        let comm = unsafe { CommRef::new(comm) }?;
        let size =
            unsafe { sized_struct_size(stats.cast_const(), "stats", "aggbox_stats", MIN_SIZE) }?;
        let snapshot = comm.progress().run(&comm, |comm| comm.stats())?;
        // SAFETY: `size` bytes are writable (the caller's promise) and
        // within `aggbox_stats` (checked).
        unsafe { aggbox_stats::from_core(&snapshot, size).write_to(stats) };
        Ok(())
    })
}

#[cfg(test)]
mod tests {
    use std::ptr;

    use aggbox_core::{maps::STAT_NAMES, stats::KernelStats, Datapath};

    use super::*;

    #[test]
    fn program_and_counter_indices_are_the_core_ones() {
        for (c, core) in aggbox_prog::ALL.into_iter().zip(Prog::ALL) {
            assert_eq!(c as usize, core as usize);
            assert_eq!(
                format!("{c:?}"),
                format!("AGGBOX_PROG_{}", core.name().to_uppercase())
            );
        }
        for (index, (c, name)) in aggbox_stat::ALL.into_iter().zip(STAT_NAMES).enumerate() {
            assert_eq!(c as usize, index);
            assert_eq!(
                format!("{c:?}"),
                format!("AGGBOX_STAT_{}", name.to_uppercase())
            );
        }
    }

    #[test]
    fn snapshot_converts_and_writes_only_size_bytes() {
        let mut kernel = KernelStats::default();
        kernel.counters[Prog::TcEgress as usize][2] = 77;
        let core = Stats {
            datapath: Datapath::Kernel,
            user: UserStats {
                packets_sent: 1,
                barriers: 9,
                dropped_foreign: 4,
                ..Default::default()
            },
            kernel,
        };
        let full = aggbox_stats::from_core(&core, size_of::<aggbox_stats>());
        assert_eq!(
            full.datapath,
            aggbox_datapath::AGGBOX_DATAPATH_KERNEL as RawDatapath
        );
        assert_eq!(
            (full.packets_sent, full.barriers, full.dropped_foreign),
            (1, 9, 4)
        );
        assert_eq!(
            full.kernel[aggbox_prog::AGGBOX_PROG_TC_EGRESS as usize]
                [aggbox_stat::AGGBOX_STAT_ACCEPTED as usize],
            77
        );

        // An older, smaller struct: nothing is written past its end.
        let size = offset_of!(aggbox_stats, kernel);
        let mut words = [u64::MAX; size_of::<aggbox_stats>() / 8 + 1];
        unsafe { aggbox_stats::from_core(&core, size).write_to(words.as_mut_ptr().cast()) };
        assert_eq!(words[0] as usize, size);
        assert_eq!(
            words[1].to_ne_bytes()[4..],
            [0xff; 4],
            "padding is left alone"
        );
        assert_eq!(words[2], 1, "packets_sent");
        assert_eq!(words[size / 8 - 1], 9, "barriers is the last field written");
        assert!(words[size / 8..].iter().all(|w| *w == u64::MAX));
    }

    #[test]
    fn bad_arguments() {
        let mut stats = aggbox_stats::from_core(
            &Stats {
                datapath: Datapath::User,
                user: UserStats::default(),
                kernel: KernelStats::default(),
            },
            size_of::<aggbox_stats>(),
        );
        let status = unsafe { aggbox_comm_stats(ptr::null(), &mut stats) };
        assert_eq!(status, aggbox_status::AGGBOX_ERR_INVALID_ARGUMENT);
    }
}
