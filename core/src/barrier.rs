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
//! When rank 0 gives up on a barrier (a rank did not arrive in time, or
//! closed its communicator instead), it sends `BARRIER_ABORT(seq, rank)` to
//! every rank that arrived and answers later arrivals for that barrier the
//! same way, so every survivor fails at once, naming the same rank. Only a
//! barrier rank 0 completed is ever released.

use std::time::Instant;

use crate::{comm::Backoff, wire::Kind, Comm, Error, Result};

impl Comm {
    /// Blocks until every rank has called `barrier`.
    pub fn barrier(&mut self) -> Result<()> {
        self.barrier_seq = self.barrier_seq.wrapping_add(1);
        let seq = self.barrier_seq;
        let result = if self.size() == 1 {
            Ok(())
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
