//! Barrier over the AggBox UDP transport.
//!
//! Centralized at rank 0, two message kinds, driven by the waiting ranks:
//! every other rank sends `BARRIER_ARRIVE(seq)` to rank 0 and repeats it on
//! an exponential timer until `BARRIER_RELEASE(seq)` comes back. Rank 0
//! counts arrivals in a bitmap and, when every rank is in, sends one release
//! to each. A rank whose release was lost asks again; rank 0 answers an
//! arrive for any barrier it already completed with that barrier's release,
//! in whatever operation it is in by then (`Comm::serve_stale`), and after
//! the last one while closing. Duplicates change nothing: arrivals are a
//! bitmap, and a release for an older barrier is ignored.
//!
//! A rank can be at most one barrier ahead of rank 0's view, so sequence
//! numbers never need a window. Rank 0 keeps no per-rank timers at all.
//!
//! On the kernel datapath rank 0's TC ingress counts the arrivals instead
//! (ebpf/aggbox_barrier.h, armed by `Comm::new`): the one that completes a
//! barrier goes out as every member's release, and up to rank 0's process
//! as one `BARRIER_DONE`, its only wake-up of the barrier. Rank 0 counts
//! itself, and any arrival TC passed up, with the same atomics on the
//! mapped block (`Windows::arrive`); when its own count completes the
//! barrier it sends the releases. Members do not change: their release
//! is a release.
//!
//! When rank 0 gives up on a barrier (a rank did not arrive in time, or
//! closed its communicator instead), it sends `BARRIER_ABORT(seq, rank)` to
//! every rank that arrived and answers later arrivals for that barrier the
//! same way, so every survivor fails at once, naming the same rank. Only a
//! barrier rank 0 completed is ever released.

use std::time::Instant;

use crate::{
    comm::Backoff,
    window::{Arrival, Windows},
    wire::{Kind, FLAG_ANSWERED},
    Comm, Error, Result,
};

impl Comm {
    /// Blocks until every rank has called `barrier`.
    pub fn barrier(&mut self) -> Result<()> {
        self.barrier_seq = self.barrier_seq.wrapping_add(1);
        let seq = self.barrier_seq;
        let result = if self.size() == 1 {
            Ok(())
        } else if self.rank() == 0 && self.barrier_windows().is_some() {
            self.barrier_root_kernel(seq)
        } else if self.rank() == 0 {
            self.barrier_root(seq)
        } else {
            self.barrier_member(seq)
        };
        match &result {
            Ok(()) => self.user_stats.barriers += 1,
            Err(Error::PeerFailed { rank, .. }) => self.failed[*rank] = true,
            Err(_) => {}
        }
        result
    }

    /// Rank 0 gives up on barrier `seq`, blaming `blamed` (and marking every
    /// rank in `late` failed): the ranks that arrived hear it at once, and
    /// any that asks again later is told the same.
    fn abort_barrier(&mut self, seq: u32, blamed: usize, late: &[usize], what: String) -> Error {
        for &rank in late {
            self.failed[rank] = true;
        }
        self.barrier_aborted = Some((seq, blamed));
        for rank in 1..self.size() {
            if self.heard[rank] {
                let _ = self.send_abort(seq, blamed, rank);
            }
        }
        Error::PeerFailed { rank: blamed, what }
    }

    fn barrier_root(&mut self, seq: u32) -> Result<()> {
        let n = self.size();
        self.heard.iter_mut().for_each(|h| *h = false);
        self.heard[0] = true;
        let mut missing = n - 1;
        let deadline = self.deadline();
        while missing > 0 {
            if let Some(gone) = (1..n).find(|&r| !self.heard[r] && self.closed[r]) {
                let what = format!("barrier #{seq}: rank {gone} closed its communicator without entering the barrier");
                return Err(self.abort_barrier(seq, gone, &[gone], what));
            }
            let Some(got) = self.recv_valid(deadline)? else {
                let late: Vec<usize> = (0..n).filter(|&r| !self.heard[r]).collect();
                let names: Vec<String> = late.iter().map(|r| r.to_string()).collect();
                let what = format!(
                    "barrier #{seq}: rank(s) {} did not arrive within {} ms",
                    names.join(", "),
                    self.timeout().as_millis()
                );
                return Err(self.abort_barrier(seq, late[0], &late, what));
            };
            let sender = got.header.sender as usize;
            match got.kind {
                Kind::BarrierArrive if got.header.seq == seq => {
                    if self.heard[sender] {
                        self.user_stats.duplicates += 1;
                    } else {
                        self.heard[sender] = true;
                        missing -= 1;
                    }
                }
                _ => {
                    self.serve_stale(&got)?;
                }
            }
        }
        for rank in 1..n {
            self.send_control(Kind::BarrierRelease, seq, rank, false)?;
        }
        self.barrier_done = seq;
        Ok(())
    }

    /// Rank 0's kernel barrier windows, while the kernel counts arrivals.
    pub(crate) fn barrier_windows(&self) -> Option<&Windows> {
        self.attachment.as_ref().and_then(|a| a.windows()).filter(|w| self.rank() == 0 && w.barrier_armed())
    }

    /// Counts `rank`'s arrival at barrier `seq` in the kernel's block.
    pub(crate) fn arrive(&self, seq: u32, rank: usize) -> Arrival {
        self.barrier_windows().map_or(Arrival::NotOpen, |w| w.arrive(seq, rank))
    }

    /// Releases every other rank from barrier `seq` (one batch of sends).
    pub(crate) fn release_all(&mut self, seq: u32) -> Result<()> {
        for rank in 1..self.size() {
            let header = self.header(Kind::BarrierRelease, seq);
            self.queue_control(&header, rank)?;
        }
        self.flush_queued()
    }

    /// Rank 0 on the kernel datapath: counts itself, then waits for TC's
    /// `BARRIER_DONE` (or completes the barrier itself).
    fn barrier_root_kernel(&mut self, seq: u32) -> Result<()> {
        let n = self.size();
        let done = |comm: &mut Comm, release: bool| -> Result<()> {
            if release {
                comm.release_all(seq)?;
            }
            comm.barrier_done = seq;
            Ok(())
        };
        match self.arrive(seq, 0) {
            Arrival::Completed => return done(self, true),
            Arrival::Counted => {}
            other => {
                // Only an abort closes the kernel's barrier, and an abort
                // disarms it: the block and the process disagree.
                let open = self.barrier_windows().map_or(0, |w| w.barrier_open());
                return Err(Error::Internal(format!("barrier #{seq}: the kernel's barrier is #{open} ({other:?})")));
            }
        }
        let deadline = self.deadline();
        loop {
            let arrived = |comm: &Comm, r: usize| comm.barrier_windows().is_some_and(|w| w.barrier_arrived(seq, r));
            if let Some(gone) = (1..n).find(|&r| self.closed[r] && !arrived(self, r)) {
                let what = format!("barrier #{seq}: rank {gone} closed its communicator without entering the barrier");
                match self.abort_kernel_barrier(seq) {
                    true => return Err(self.abort_barrier(seq, gone, &[gone], what)),
                    false => return done(self, true),
                }
            }
            let Some(got) = self.recv_valid(deadline)? else {
                if !self.abort_kernel_barrier(seq) {
                    // Completed meanwhile; its notice may have been lost
                    // (the releases too): send them.
                    return done(self, true);
                }
                let late: Vec<usize> = (0..n).filter(|&r| !self.heard[r]).collect();
                let names: Vec<String> = late.iter().map(|r| r.to_string()).collect();
                let what = format!(
                    "barrier #{seq}: rank(s) {} did not arrive within {} ms",
                    names.join(", "),
                    self.timeout().as_millis()
                );
                return Err(self.abort_barrier(seq, late[0], &late, what));
            };
            match got.kind {
                Kind::BarrierDone if got.header.seq == seq => return done(self, got.header.flags & FLAG_ANSWERED == 0),
                Kind::BarrierDone => self.user_stats.duplicates += 1,
                Kind::BarrierArrive if got.header.seq == seq => match self.arrive(seq, got.header.sender as usize) {
                    Arrival::Completed => return done(self, true),
                    Arrival::Repeat => self.user_stats.duplicates += 1,
                    Arrival::Counted | Arrival::NotOpen => {}
                },
                _ => {
                    self.serve_stale(&got)?;
                }
            }
        }
    }

    /// Closes the kernel's barrier `seq` for good (later barriers run in
    /// user space) and records who had arrived in `heard`. Returns false
    /// when it completed first.
    fn abort_kernel_barrier(&mut self, seq: u32) -> bool {
        let Some(windows) = self.barrier_windows() else { return true };
        if !windows.abort_barrier(seq) {
            return false;
        }
        windows.disarm_barrier();
        let heard: Vec<bool> = (0..self.size()).map(|r| r == 0 || windows.barrier_arrived(seq, r)).collect();
        self.heard = heard;
        true
    }

    fn barrier_member(&mut self, seq: u32) -> Result<()> {
        let deadline = self.deadline();
        self.send_control(Kind::BarrierArrive, seq, 0, false)?;
        let mut backoff = Backoff::new();
        loop {
            if backoff.fire() {
                self.send_control(Kind::BarrierArrive, seq, 0, true)?;
            }
            let wait = backoff.due().min(deadline);
            match self.recv_valid(wait)? {
                Some(got) if got.kind == Kind::BarrierRelease && got.header.seq == seq => return Ok(()),
                Some(got) if got.kind == Kind::BarrierRelease => self.user_stats.duplicates += 1,
                Some(got) if got.kind == Kind::BarrierAbort && got.header.seq == seq => {
                    let blamed = (got.header.count as usize).min(self.size() - 1);
                    return Err(Error::PeerFailed {
                        rank: blamed,
                        what: format!("barrier #{seq}: rank 0 gave up on it because rank {blamed} failed"),
                    });
                }
                // A late request of a finished operation (a retransmitted
                // broadcast chunk whose acknowledgment was lost), or a
                // chunk of the next broadcast: answered or kept.
                Some(got) => {
                    self.serve_stale(&got)?;
                }
                None if Instant::now() >= deadline => {
                    return Err(Error::PeerFailed {
                        rank: 0,
                        what: format!(
                            "barrier #{seq}: rank 0 did not release it within {} ms (rank 0, or a rank it waits for, is gone)",
                            self.timeout().as_millis()
                        ),
                    })
                }
                None => {}
            }
        }
    }
}
