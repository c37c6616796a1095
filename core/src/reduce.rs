//! The reduction family: allreduce, reduce, reduce-scatter and allgather
//! (docs/ALLREDUCE.md).
//!
//! Aggregation is sharded. The vector is cut into chunks of the group's
//! chunk size, and each chunk has one owner: the owners take runs of
//! consecutive chunks in turn, chunk `c` is reduced at rank `(c / run) %
//! N` (`Plan::run`: as many chunks as one UDP GSO super-packet carries, or
//! fewer when the vector is short; reduce-scatter: a rank's block). Every
//! other rank sends the owner its contribution (`RED_DATA`), a run of
//! chunks as one super-packet. The owner folds each contribution once (a
//! bitmap of contributors per chunk), and when the last one arrives it sends the
//! result (`RED_RESULT`) to the ranks that need it and `RED_DONE` to the
//! other contributors. A result or a DONE is also the contributor's
//! acknowledgment: a contributor sends its contributions in a window, and
//! on a retransmission timeout it sends again those not yet acknowledged.
//! The owner answers a repeat of a completed chunk with its result (or
//! DONE) again, from a copy it keeps until the operation after next
//! (`acc`, two of them by sequence parity), so a rank that lost a result
//! gets it even after the owner returned. A contribution of the next
//! operation that arrives before this rank called it is kept and replayed
//! when the call comes.
//!
//! Allgather is one broadcast per rank of that rank's block (the
//! broadcast's windows, retransmissions and, on the kernel datapath, its
//! fan-out and placement).
//!
//! On the kernel datapath the datagrams are the same; an owner's XDP folds
//! the contributions of integer lanes (sums, MIN, MAX) into mapped slots
//! (`ebpf/aggbox_reduce.h`). The contribution that completes a chunk
//! becomes its result, which TC ingress sends to the members that get it
//! (and a DONE to the other contributors), and each member's XDP places
//! results (and marks DONEs) in a mapped result window: the process is
//! woken once per operation (and every `RES_SLOTS / 2` chunks of a long
//! one) and reads sums and results from the maps.

use std::{ops::Range, time::Instant};

use crate::{
    comm::{receiver_grace, Backoff, Comm, Received},
    loader::Attachment,
    maps::{RedCtl, FOLD_ADD, FOLD_MAX_S, FOLD_MAX_U, FOLD_MIN_S, FOLD_MIN_U, RED_SLOTS, RES_SLOTS},
    window::Windows,
    Datapath,
    dtype::{as_bytes, as_bytes_mut, Dtype, Element},
    op::{self, ReduceOp},
    quant,
    transport::{GSO_MAX_BYTES, GSO_MAX_SEGMENTS},
    wire::{Header, Kind, FLAG_MISMATCH, FLAG_RETRANSMIT, HDR_LEN},
    Error, Result,
};

/// The most chunks of `chunk` bytes an owner takes in a row: as many
/// datagrams as one UDP GSO super-packet carries, so that a contributor
/// sends each run as one.
fn run_max(chunk: usize) -> usize {
    (GSO_MAX_BYTES / (HDR_LEN + chunk)).clamp(1, GSO_MAX_SEGMENTS)
}

/// Contributions a rank keeps in flight: chunks past the first one not yet
/// acknowledged.
const WINDOW: usize = 256;

/// The first retransmission timeout of a contributor. A contribution is
/// acknowledged only when its chunk is complete, which waits for every
/// rank: with 8 ranks on 2 vCPUs some rank is often not scheduled for a
/// millisecond or more, and a 1 ms timer resent tens of thousands of
/// contributions that were not lost (measured by `bench allreduce`).
const RED_RTO_INITIAL: std::time::Duration = std::time::Duration::from_millis(4);
/// The largest.
const RED_RTO_MAX: std::time::Duration = std::time::Duration::from_millis(50);

/// Contributions sent again per retransmission timeout, the oldest first:
/// the window's head is what holds everyone up.
const RESEND_MAX: usize = 64;
/// The same on the kernel fan-out path, where a timer fires only when
/// nothing landed for its whole period: that is mostly a rank that was not
/// scheduled (8 ranks on 2 vCPUs), rarely a loss, so only the oldest are
/// sent again. Measured, 6 allreduces of 1 Mi f32 on 8 kernel ranks on a
/// loaded machine: 5,660 and 19,111 retransmissions in all with 64; 2,240
/// and 3,016 with 16.
const RESEND_MAX_KERNEL: usize = 16;

/// Copies of each `RED_ABORT` sent (it is not acknowledged).
const ABORT_COPIES: usize = 3;

/// Datagrams of the next operation a rank keeps before calling it.
const EARLY_MAX: usize = 1024;

/// The bit of the header's `op` byte that says the payload holds quantized
/// integers of a float sum (docs/ALLREDUCE.md).
const QUANTIZED: u8 = 0x08;

/// Which collective of the family (the high nibble of the header's `op`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(u8)]
enum Collective {
    Allreduce = 1,
    Reduce = 2,
    ReduceScatter = 3,
}

impl Collective {
    fn name(self) -> &'static str {
        match self {
            Collective::Allreduce => "allreduce",
            Collective::Reduce => "reduce",
            Collective::ReduceScatter => "reduce-scatter",
        }
    }
}

/// The geometry of one call, the same on every rank that agrees on it.
#[derive(Clone, Copy, Debug)]
struct Plan {
    seq: u32,
    coll: Collective,
    /// The call's element type and operator (in the header).
    dtype: Dtype,
    op: ReduceOp,
    /// What the owners fold: `dtype` and `op`, or for a quantized float sum
    /// integer lanes (I32, I64) and SUM.
    lanes: Dtype,
    fold_op: ReduceOp,
    /// This rank's XDP folds the contributions to its chunks (kernel
    /// datapath, an integer lane sum): see `ebpf/aggbox_reduce.h`.
    kernel: bool,
    /// The rank that gets the result (reduce).
    root: usize,
    ranks: usize,
    me: usize,
    /// Elements of the whole vector.
    count: usize,
    /// Reduce-scatter: elements of each rank's block.
    block: usize,
    /// Elements per chunk.
    per_chunk: usize,
    /// Reduce-scatter: chunks per block.
    per_block: usize,
    nchunks: usize,
    /// Chunks an owner takes in a row: chunk `c` is rank `(c / run) %
    /// ranks`'s. Reduce-scatter: `per_block`.
    run: usize,
}

impl Plan {
    fn owner(&self, chunk: usize) -> usize {
        chunk / self.run % self.ranks
    }

    /// The elements of chunk `chunk` in the whole vector.
    fn elements(&self, chunk: usize) -> Range<usize> {
        match self.coll {
            Collective::Allreduce | Collective::Reduce => {
                chunk * self.per_chunk..((chunk + 1) * self.per_chunk).min(self.count)
            }
            Collective::ReduceScatter => {
                let (b, k) = (chunk / self.per_block, chunk % self.per_block);
                b * self.block + k * self.per_chunk..b * self.block + ((k + 1) * self.per_chunk).min(self.block)
            }
        }
    }

    /// The bytes of chunk `chunk` in the whole vector.
    fn bytes(&self, chunk: usize) -> Range<usize> {
        let e = self.elements(chunk);
        e.start * self.dtype.size()..e.end * self.dtype.size()
    }

    /// Whether `rank` gets the result of chunk `chunk` (it is not its owner).
    fn recipient(&self, rank: usize, chunk: usize) -> bool {
        rank != self.owner(chunk)
            && match self.coll {
                Collective::Allreduce => true,
                Collective::Reduce => rank == self.root,
                Collective::ReduceScatter => false,
            }
    }

    /// The chunks this rank owns, in order, and the index of `chunk` among
    /// them (its place in the accumulator).
    fn owned_index(&self, chunk: usize) -> usize {
        chunk / self.run / self.ranks * self.run + chunk % self.run
    }

    fn owned_chunks(&self) -> impl Iterator<Item = usize> + '_ {
        (0..).map_while(move |owned| self.owned_chunk(owned))
    }

    /// The chunk whose owned index (among this rank's chunks) is `owned`.
    fn owned_chunk(&self, owned: usize) -> Option<usize> {
        let chunk = (owned / self.run * self.ranks + self.me) * self.run + owned % self.run;
        (chunk < self.nchunks).then_some(chunk)
    }

    /// What XDP checks a contribution against (`struct aggbox_redctl`).
    fn red_ctl(&self) -> RedCtl {
        // The one owned chunk that may be short: the last of the vector
        // (allreduce, reduce) or of this rank's block (reduce-scatter).
        let short = match self.coll {
            Collective::Allreduce | Collective::Reduce => Some(self.nchunks - 1).filter(|c| self.owner(*c) == self.me),
            Collective::ReduceScatter => Some((self.me + 1) * self.per_block - 1),
        };
        let (owned_last, last_bytes) = match short {
            Some(c) => (self.owned_index(c) as u32, self.bytes(c).len() as u32),
            None => (u32::MAX, 0),
        };
        RedCtl {
            seq: self.seq,
            nchunks: self.nchunks as u32,
            count: self.count as u32,
            dtype: self.dtype.code(),
            op: self.op_code(),
            lane: self.lanes.size() as u8,
            fold: self.fold_code(),
            ranks: self.ranks as u32,
            run: self.run as u32,
            chunk_bytes: (self.per_chunk * self.dtype.size()) as u32,
            last_bytes,
            owned_last,
            rank: self.me as u32,
            fanout: 1,
            result_last: self.bytes(self.nchunks.saturating_sub(1)).len() as u32,
            root: self.root as u32,
            credit: self.nchunks.min(RES_SLOTS as usize) as u32,
            notify: RES_SLOTS / 2,
            landed: 0,
            target: self.nchunks as u32,
            notified: 0,
        }
    }

    /// Where chunk `chunk` starts in the owner's accumulator, in bytes.
    fn acc_offset(&self, chunk: usize) -> usize {
        self.owned_index(chunk) * self.per_chunk * self.dtype.size()
    }

    /// The header's `op` byte: the collective, and the operator, with
    /// [`QUANTIZED`] when the payload holds quantized integers.
    fn op_code(&self) -> u8 {
        let quantized = if self.lanes != self.dtype { QUANTIZED } else { 0 };
        (self.coll as u8) << 4 | quantized | self.op.code()
    }

    fn name(&self) -> String {
        format!("{} #{}", self.coll.name(), self.seq)
    }

    /// The owned index of this rank's first owned chunk at or after `chunk`.
    fn first_owned_from(&self, chunk: usize) -> usize {
        let (cycle, within) = (chunk / (self.run * self.ranks), chunk % (self.run * self.ranks));
        let mine = self.me * self.run;
        cycle * self.run + within.saturating_sub(mine).min(self.run)
    }

    /// Chunks past the first not done a contributor keeps in flight: on
    /// the kernel datapath no more than the result window holds.
    fn window(&self) -> usize {
        if self.kernel {
            RES_SLOTS as usize
        } else {
            WINDOW
        }
    }

    /// How XDP combines this call's lanes (`AGGBOX_FOLD_*`).
    fn fold_code(&self) -> u8 {
        let signed = matches!(self.lanes, Dtype::I32 | Dtype::I64);
        match (self.fold_op, signed) {
            (ReduceOp::Min, true) => FOLD_MIN_S,
            (ReduceOp::Min, false) => FOLD_MIN_U,
            (ReduceOp::Max, true) => FOLD_MAX_S,
            (ReduceOp::Max, false) => FOLD_MAX_U,
            _ => FOLD_ADD,
        }
    }

    fn describe(&self) -> String {
        let root = if self.coll == Collective::Reduce { format!(", root {}", self.root) } else { String::new() };
        format!("{} of {} {} elements, op {}{root}", self.coll.name(), self.count, self.dtype, self.op)
    }
}

/// A datagram of the next operation, kept until it is called.
#[derive(Debug)]
struct Early {
    headers: Vec<Header>,
    /// Their payloads, one `chunk`-sized slot each.
    data: Vec<u8>,
    lens: Vec<usize>,
}

/// What the reduction family keeps in the communicator between calls.
#[derive(Debug)]
pub(crate) struct ReduceState {
    /// Sequence number of the last reduction called.
    seq: u32,
    /// The plan of the last reduction this rank completed, and whether it
    /// did (a repeat of its contribution is answered from `acc`).
    last: Option<Plan>,
    /// The owner's accumulators, by sequence parity.
    acc: [Vec<u8>; 2],
    /// Per chunk: result (or acknowledgment) received; for owned chunks,
    /// complete.
    done: Vec<bool>,
    /// Per owned chunk: contributors folded (bit per rank) and how many.
    folded: Vec<u64>,
    folded_count: Vec<u16>,
    /// Per rank: when a datagram of this operation last came from it.
    heard: Vec<Instant>,
    early: Early,
    /// A quantized float sum's integers in, and out (reduce-scatter).
    quantized: Vec<u8>,
    quantized_out: Vec<u8>,
    /// The kernel arming (and slots used) of the last reduction XDP
    /// folded: if it is the call before the current one, the call after
    /// the current one is armed ahead like it.
    kernel_last: Option<(RedCtl, u32)>,
    /// This call found its slots armed ahead for another call and taken by
    /// contributions to it: the ranks' calls disagree.
    ahead_mismatch: bool,
    /// Owned chunks completed whose results are not sent yet.
    answers: Vec<u32>,
    /// Owned chunks this rank's own contribution completed as it joined
    /// their slots armed ahead (XDP did not complete them: this process
    /// sends their results).
    joined: Vec<usize>,
}

impl ReduceState {
    pub(crate) fn new(ranks: usize) -> ReduceState {
        ReduceState {
            seq: 0,
            last: None,
            acc: [Vec::new(), Vec::new()],
            done: Vec::new(),
            folded: Vec::new(),
            folded_count: Vec::new(),
            heard: vec![Instant::now(); ranks],
            early: Early { headers: Vec::new(), data: Vec::new(), lens: Vec::new() },
            quantized: Vec::new(),
            quantized_out: Vec::new(),
            kernel_last: None,
            ahead_mismatch: false,
            answers: Vec::new(),
            joined: Vec::new(),
        }
    }
}

/// What adding one contribution did.
enum Added {
    /// The sender's contribution was added before.
    Repeat,
    /// Kernel folding, but the chunk's slot is not ready for it.
    Unprepared,
    /// Added; the chunk still waits for others.
    Folded,
    /// The chunk is complete: by this contribution (`folded`), or before
    /// it, in the kernel, with the notice lost.
    Completed { folded: bool },
}

/// The kernel windows of `attachment`, when `plan` is folded by XDP.
fn red_windows<'a>(attachment: Option<&'a Attachment>, plan: &Plan) -> Option<&'a Windows> {
    attachment.filter(|_| plan.kernel).and_then(|a| a.windows())
}

/// Adds `sender`'s contribution `payload` to owned chunk `chunk`: into its
/// kernel slot (with the atomics XDP uses) when XDP folds this call, else
/// into the accumulator. A free function so the payload may be borrowed
/// from the communicator's receive batch meanwhile.
fn add_contribution(
    state: &mut ReduceState,
    windows: Option<&Windows>,
    plan: &Plan,
    chunk: usize,
    sender: usize,
    payload: &[u8],
) -> Added {
    let index = plan.owned_index(chunk);
    if let Some(windows) = windows {
        if !windows.red_holds(index as u32, plan.seq, chunk as u32) {
            return Added::Unprepared;
        }
        return match windows.fold_red(plan.seq, index as u32, sender, payload, &plan.red_ctl()) {
            // XDP completed the chunk, but its RED_SUM notice did not reach
            // the socket (a full receive buffer): complete it now.
            None if windows.red_is_done(plan.seq, index as u32) => Added::Completed { folded: false },
            None => Added::Repeat,
            Some(false) => Added::Folded,
            Some(true) => Added::Completed { folded: true },
        };
    }
    let (word, bit) = (index * words(plan.ranks) + sender / 64, 1u64 << (sender % 64));
    if state.folded[word] & bit != 0 {
        return Added::Repeat;
    }
    state.folded[word] |= bit;
    state.folded_count[index] += 1;
    let at = plan.acc_offset(chunk);
    let acc = &mut state.acc[(plan.seq % 2) as usize][at..at + payload.len()];
    op::fold(plan.lanes, plan.fold_op, acc, payload);
    if usize::from(state.folded_count[index]) + 1 < plan.ranks {
        Added::Folded
    } else {
        Added::Completed { folded: true }
    }
}

/// Words of a contributor bitmap.
fn words(ranks: usize) -> usize {
    ranks.div_ceil(64)
}

/// Where a call's contributions come from and its results go.
enum Bufs<'a> {
    /// Allreduce, and reduce at the root: one buffer, in place.
    InPlace(&'a mut [u8]),
    /// Reduce at another rank: contributions only.
    Input(&'a [u8]),
    /// Reduce-scatter: the whole vector in, this rank's block out.
    Split(&'a [u8], &'a mut [u8]),
}

impl Bufs<'_> {
    fn input(&self) -> &[u8] {
        match self {
            Bufs::InPlace(buf) => buf,
            Bufs::Input(input) | Bufs::Split(input, _) => input,
        }
    }
}

impl Comm {
    /// Reduces `buf` across every rank with `op`, in place: when it returns,
    /// every rank's `buf` holds `op` over the ranks' buffers, element by
    /// element (as `MPI_Allreduce` with `MPI_IN_PLACE`). Every rank calls it
    /// with the same length, `dtype` and `op`, in the same order as its
    /// other collectives.
    pub fn allreduce(&mut self, buf: &mut [u8], dtype: Dtype, op: ReduceOp) -> Result<()> {
        let plan = self.red_plan(Collective::Allreduce, buf.len(), 0, dtype, op, 0)?;
        self.red_dispatch(plan, Bufs::InPlace(buf))
    }

    /// [`Comm::allreduce`] from `send` into `recv` (the same length).
    pub fn allreduce_from(&mut self, send: &[u8], recv: &mut [u8], dtype: Dtype, op: ReduceOp) -> Result<()> {
        if send.len() != recv.len() {
            return Err(Error::InvalidArgument(format!(
                "allreduce: the send buffer has {} bytes and the receive buffer {}",
                send.len(),
                recv.len()
            )));
        }
        let plan = self.red_plan(Collective::Allreduce, recv.len(), 0, dtype, op, 0)?;
        recv.copy_from_slice(send);
        self.red_dispatch(plan, Bufs::InPlace(recv))
    }

    /// [`Comm::allreduce`] of a typed buffer.
    pub fn allreduce_slice<T: Element>(&mut self, buf: &mut [T], op: ReduceOp) -> Result<()> {
        self.allreduce(as_bytes_mut(buf), T::DTYPE, op)
    }

    /// Reduces every rank's `send` with `op` into `recv` at rank `root` (as
    /// `MPI_Reduce`). `recv` has `send`'s length at the root and is not used
    /// elsewhere (it may be empty).
    pub fn reduce_from(&mut self, send: &[u8], recv: &mut [u8], dtype: Dtype, op: ReduceOp, root: usize) -> Result<()> {
        let plan = self.red_plan(Collective::Reduce, send.len(), 0, dtype, op, root)?;
        if self.rank() != root {
            return self.red_dispatch(plan, Bufs::Input(send));
        }
        if recv.len() != send.len() {
            return Err(Error::InvalidArgument(format!(
                "reduce: the root's receive buffer has {} bytes, its send buffer {}",
                recv.len(),
                send.len()
            )));
        }
        recv.copy_from_slice(send);
        self.red_dispatch(plan, Bufs::InPlace(recv))
    }

    /// [`Comm::reduce_from`] in place: at the root `buf` is replaced by the
    /// result; elsewhere it is only read.
    pub fn reduce(&mut self, buf: &mut [u8], dtype: Dtype, op: ReduceOp, root: usize) -> Result<()> {
        let plan = self.red_plan(Collective::Reduce, buf.len(), 0, dtype, op, root)?;
        if self.rank() == root {
            self.red_dispatch(plan, Bufs::InPlace(buf))
        } else {
            self.red_dispatch(plan, Bufs::Input(buf))
        }
    }

    /// Reduces every rank's `send` (N blocks of `recv`'s length) with `op`
    /// and leaves block `rank` of the result in `recv` (as
    /// `MPI_Reduce_scatter_block`).
    pub fn reduce_scatter(&mut self, send: &[u8], recv: &mut [u8], dtype: Dtype, op: ReduceOp) -> Result<()> {
        if recv.len().checked_mul(self.size()) != Some(send.len()) {
            return Err(Error::InvalidArgument(format!(
                "reduce-scatter: the send buffer has {} bytes, not {} ranks × the receive buffer's {}",
                send.len(),
                self.size(),
                recv.len()
            )));
        }
        let plan = self.red_plan(Collective::ReduceScatter, send.len(), recv.len(), dtype, op, 0)?;
        self.red_dispatch(plan, Bufs::Split(send, recv))
    }

    /// Gathers every rank's `send` into `recv`, block `r` from rank `r`, on
    /// every rank (as `MPI_Allgather`). `recv` is N times `send`'s length.
    pub fn allgather(&mut self, send: &[u8], recv: &mut [u8], dtype: Dtype) -> Result<()> {
        let n = self.size();
        if send.len().checked_mul(n) != Some(recv.len()) {
            return Err(Error::InvalidArgument(format!(
                "allgather: the receive buffer has {} bytes, not {n} ranks × the send buffer's {}",
                recv.len(),
                send.len()
            )));
        }
        if !send.len().is_multiple_of(dtype.size()) {
            return Err(Error::InvalidArgument(format!(
                "allgather: {} bytes are not a whole number of {dtype} elements",
                send.len()
            )));
        }
        let block = send.len();
        recv[self.rank() * block..][..block].copy_from_slice(send);
        for root in 0..n {
            self.broadcast(&mut recv[root * block..][..block], dtype, root)
                .map_err(|e| e.context(&format!("allgather of {} {dtype} elements per rank", block / dtype.size())))?;
        }
        Ok(())
    }

    /// [`Comm::allgather`] of typed buffers.
    pub fn allgather_slice<T: Element>(&mut self, send: &[T], recv: &mut [T]) -> Result<()> {
        self.allgather(as_bytes(send), as_bytes_mut(recv), T::DTYPE)
    }

    /// Checks a call's arguments and makes its plan (nothing is sent).
    /// `bytes` is the whole vector's length, `block_bytes` reduce-scatter's
    /// block.
    fn red_plan(
        &self,
        coll: Collective,
        bytes: usize,
        block_bytes: usize,
        dtype: Dtype,
        op: ReduceOp,
        root: usize,
    ) -> Result<Plan> {
        let name = coll.name();
        op.check(dtype).map_err(|e| e.context(name))?;
        if root >= self.size() {
            return Err(Error::InvalidArgument(format!(
                "{name}: root {root} is not a rank of this group of {}",
                self.size()
            )));
        }
        if !bytes.is_multiple_of(dtype.size()) || !block_bytes.is_multiple_of(dtype.size()) {
            return Err(Error::InvalidArgument(format!(
                "{name}: a buffer of {bytes} bytes is not a whole number of {dtype} elements"
            )));
        }
        let count = bytes / dtype.size();
        if u32::try_from(count).is_err() {
            return Err(Error::InvalidArgument(format!(
                "{name}: {count} elements are more than one operation carries ({})",
                u32::MAX
            )));
        }
        let per_chunk = self.chunk / dtype.size();
        let block = block_bytes / dtype.size();
        let (per_block, nchunks) = match coll {
            Collective::ReduceScatter => {
                let per_block = block.div_ceil(per_chunk);
                (per_block, per_block * self.size())
            }
            _ => (0, count.div_ceil(per_chunk)),
        };
        let run = match coll {
            Collective::ReduceScatter => per_block.max(1),
            _ => nchunks.div_ceil(self.size()).clamp(1, run_max(self.chunk)),
        };
        Ok(Plan {
            seq: self.red.seq.wrapping_add(1),
            coll,
            dtype,
            op,
            root,
            lanes: dtype,
            fold_op: op,
            kernel: false,
            ranks: self.size(),
            me: self.rank(),
            count,
            block,
            per_chunk,
            per_block,
            nchunks,
            run,
        })
    }

    /// Runs a checked call: a float SUM or AVG as a quantized integer sum
    /// (after the scale is agreed), a float MIN or MAX on ordered integer
    /// keys, everything else as it is.
    fn red_dispatch(&mut self, plan: Plan, bufs: Bufs<'_>) -> Result<()> {
        let float = quant::lanes(plan.dtype).is_some();
        if !float || plan.count == 0 || plan.ranks == 1 {
            return self.red_run(plan, bufs);
        }
        match plan.op {
            ReduceOp::Sum | ReduceOp::Avg => self.red_quantized(plan, bufs),
            ReduceOp::Min | ReduceOp::Max => self.red_ordered(plan, bufs),
        }
    }

    /// A float SUM or AVG: agree on the scale (a MAX allreduce of each
    /// rank's largest |x|), quantize, sum the integers, and turn the sums
    /// back (docs/ALLREDUCE.md). When some input is NaN or infinite, or all
    /// are zero, the floats are summed as they are (IEEE results).
    fn red_quantized(&mut self, plan: Plan, bufs: Bufs<'_>) -> Result<()> {
        let name = plan.coll.name();
        // A MAX of non-negative floats (NaN positive) is the MAX of their
        // bit patterns as unsigned integers, which XDP folds.
        let mut max = [quant::max_abs(plan.dtype, bufs.input()).to_bits()];
        self.allreduce_slice(&mut max, ReduceOp::Max).map_err(|e| e.context(&format!("{name}: agreeing on the scale")))?;
        let max = f64::from_bits(max[0]);
        // The scale's reduction took a sequence number: plan anew.
        let again = |comm: &Comm, p: &Plan| {
            comm.red_plan(p.coll, p.count * p.dtype.size(), p.block * p.dtype.size(), p.dtype, p.op, p.root)
        };
        let mut plan = again(self, &plan)?;
        if !(max.is_finite() && max > 0.0) {
            return self.red_run(plan, bufs);
        }
        let (lanes, _) = quant::lanes(plan.dtype).expect("a float");
        let e = quant::scale_exponent(max);
        plan.lanes = lanes;
        plan.fold_op = ReduceOp::Sum;
        let divisor = if plan.op == ReduceOp::Avg { plan.ranks } else { 1 };
        let dtype = plan.dtype;
        let result = self.red_run_as_lanes(
            plan,
            bufs,
            |src, dst| quant::quantize(dtype, src, dst, e),
            |src, dst| quant::dequantize(dtype, src, dst, e, divisor),
        );
        if result.is_ok() {
            self.user_stats.reduce_quantized += 1;
        }
        result
    }

    /// A float MIN or MAX, as the unsigned MIN or MAX of ordered integer
    /// keys (exact; `quant::to_ordered`), which the owners' kernels fold.
    fn red_ordered(&mut self, mut plan: Plan, bufs: Bufs<'_>) -> Result<()> {
        let (dtype, op) = (plan.dtype, plan.op);
        plan.lanes = quant::ordered_lanes(dtype).expect("a float");
        self.red_run_as_lanes(
            plan,
            bufs,
            |src, dst| quant::to_ordered(dtype, op, src, dst),
            |src, dst| quant::from_ordered(dtype, src, dst),
        )
    }

    /// Runs `plan` on the integer lanes `to` makes of the call's input, and
    /// turns the lanes of the result back with `back` into the call's
    /// output.
    fn red_run_as_lanes(
        &mut self,
        plan: Plan,
        mut bufs: Bufs<'_>,
        to: impl Fn(&[u8], &mut [u8]),
        back: impl Fn(&[u8], &mut [u8]),
    ) -> Result<()> {
        let mut q = std::mem::take(&mut self.red.quantized);
        q.clear();
        q.resize(bufs.input().len(), 0);
        to(bufs.input(), &mut q);
        let result = match &mut bufs {
            Bufs::InPlace(buf) => self.red_run(plan, Bufs::InPlace(&mut q)).map(|()| back(&q, buf)),
            Bufs::Input(_) => self.red_run(plan, Bufs::Input(&q)),
            Bufs::Split(_, out) => {
                let mut q_out = std::mem::take(&mut self.red.quantized_out);
                q_out.clear();
                q_out.resize(out.len(), 0);
                let result = self.red_run(plan, Bufs::Split(&q, &mut q_out));
                if result.is_ok() {
                    back(&q_out, out);
                }
                self.red.quantized_out = q_out;
                result
            }
        };
        self.red.quantized = q;
        result
    }

    /// Runs a planned call and counts it.
    fn red_run(&mut self, mut plan: Plan, mut bufs: Bufs<'_>) -> Result<()> {
        self.red.seq = plan.seq;
        plan.kernel = self.datapath() == Datapath::Kernel
            && plan.seq != 0
            && matches!(plan.fold_op, ReduceOp::Sum | ReduceOp::Min | ReduceOp::Max)
            && matches!(plan.lanes, Dtype::I32 | Dtype::U32 | Dtype::I64 | Dtype::U64)
            && plan.count > 0
            && self.attachment.as_ref().is_some_and(|a| a.windows().is_some());
        let result = if plan.count == 0 {
            Ok(())
        } else if plan.ranks == 1 {
            if let Bufs::Split(send, recv) = &mut bufs {
                recv.copy_from_slice(send);
            }
            if let Bufs::InPlace(buf) | Bufs::Split(_, buf) = &mut bufs {
                op::finish(plan.lanes, plan.fold_op, buf, 1);
            }
            Ok(())
        } else {
            self.red_start(&plan, &bufs);
            self.red_loop(&plan, &mut bufs)
        };
        match result {
            Ok(()) => {
                self.red.last = Some(plan);
                self.user_stats.reductions += 1;
                Ok(())
            }
            Err(e) => {
                if let Some(windows) = red_windows(self.attachment.as_ref(), &plan) {
                    windows.disarm_red();
                }
                self.red.last = None;
                Err(e)
            }
        }
    }

    /// Sets up the per-chunk state and the accumulator of the owned chunks
    /// (this rank's own contribution folded in first).
    fn red_start(&mut self, plan: &Plan, bufs: &Bufs<'_>) {
        let state = &mut self.red;
        state.answers.clear();
        state.joined.clear();
        state.done.clear();
        state.done.resize(plan.nchunks, false);
        let owned = plan.owned_chunks().count();
        state.folded.clear();
        state.folded.resize(owned * words(plan.ranks), 0);
        state.folded_count.clear();
        state.folded_count.resize(owned, 0);
        let now = Instant::now();
        state.heard.iter_mut().for_each(|h| *h = now);
        let acc = &mut state.acc[(plan.seq % 2) as usize];
        acc.clear();
        acc.resize(owned * plan.per_chunk * plan.dtype.size(), 0);
        let input = bufs.input();
        if let Some(windows) = red_windows(self.attachment.as_ref(), plan) {
            let (ctl, first) = (plan.red_ctl(), plan.owned_chunks().take(RED_SLOTS as usize));
            let armed = windows.red_armed(plan.seq);
            if armed == Some(ctl) {
                // Armed ahead for exactly this call: XDP may have folded
                // contributions already; this rank's own joins them.
                for (owned, chunk) in first.enumerate() {
                    let own = &input[plan.bytes(chunk)];
                    if windows.join_red_ahead(plan.seq, owned as u32, chunk as u32, plan.me, own) {
                        state.joined.push(chunk);
                    }
                }
            } else {
                let owned = plan.owned_chunks().count().min(RED_SLOTS as usize) as u32;
                if armed.is_some() && (0..owned).any(|o| windows.red_ahead_taken(plan.seq, o)) {
                    // Contributions came for the call guessed, not this one.
                    self.red.ahead_mismatch = true;
                }
                // XDP sums: each owned chunk in flight starts from this
                // rank's own contribution in its slot (the accumulator gets
                // the sum when the chunk is complete). Slots first, then the
                // arming: a slot armed ahead for a wrong guess is tagged
                // for this seq and would take a contribution into its
                // zeros while it is being prepared.
                for (owned, chunk) in first.enumerate() {
                    windows.prepare_red(owned as u32, plan.seq, chunk as u32, plan.me, &input[plan.bytes(chunk)]);
                }
                windows.arm_red(&ctl);
            }
            self.red_arm_next(plan);
            self.red.kernel_last = Some((ctl, plan.owned_chunks().count().min(RED_SLOTS as usize) as u32));
            return;
        }
        self.red_arm_next(plan);
        let acc = &mut self.red.acc[(plan.seq % 2) as usize];
        for chunk in plan.owned_chunks() {
            let bytes = plan.bytes(chunk);
            acc[plan.acc_offset(chunk)..][..bytes.len()].copy_from_slice(&input[bytes]);
        }
    }

    /// On the kernel datapath, arms the call after `plan` ahead, guessing
    /// it repeats the one before `plan` when XDP folded that one (a training
    /// loop repeats its calls; a float sum alternates with its scale's MAX),
    /// else `plan` itself.
    fn red_arm_next(&self, plan: &Plan) {
        let next = plan.seq.wrapping_add(1);
        let Some(windows) = self.attachment.as_ref().and_then(|a| a.windows()) else {
            return;
        };
        if self.datapath() != Datapath::Kernel || next == 0 {
            return;
        }
        // No call before this one that XDP folded: guess this one repeats.
        let this = plan.kernel.then(|| (plan.red_ctl(), plan.owned_chunks().count().min(RED_SLOTS as usize) as u32));
        let guess = self.red.kernel_last.filter(|(c, _)| c.seq == plan.seq.wrapping_sub(1)).or(this);
        if let Some((before, owned)) = guess {
            windows.arm_red_ahead(&RedCtl { seq: next, ..before }, owned);
        }
    }

    fn red_loop(&mut self, plan: &Plan, bufs: &mut Bufs<'_>) -> Result<()> {
        // What this rank waits for: its contributions acknowledged (by a
        // result or a DONE) and its owned chunks complete.
        let mut remaining = plan.nchunks;
        let mut low = 0; // first chunk not done
        let mut next = 0; // first chunk whose contribution is not sent yet
        if std::mem::take(&mut self.red.ahead_mismatch) {
            self.red_abort(plan, plan.me, true)?;
            return Err(Error::Mismatch(format!(
                "{}: contributions came for another call (the one before it); rank {} called {}: mismatched collective calls",
                plan.name(),
                plan.me,
                plan.describe()
            )));
        }
        // Chunks this rank's own contribution completed as it joined the
        // ranks ahead of it (those XDP completed are found by the scan).
        for i in 0..self.red.joined.len() {
            let chunk = self.red.joined[i];
            if !self.red.done[chunk] {
                self.red_complete(plan, bufs, chunk, &mut remaining, true)?;
            }
        }
        self.red_replay_early(plan, bufs, &mut remaining)?;
        let timeout = self.timeout();
        let silence = timeout + receiver_grace(timeout);
        let mut backoff = Backoff::starting(RED_RTO_INITIAL, RED_RTO_MAX);
        // On the fan-out path, what XDP landed is read from the maps: at
        // the start, on a RED_LANDED notice, and when the timer fires.
        let mut scan = plan.kernel;
        let mut landed_seen = 0;
        loop {
            if std::mem::take(&mut scan) {
                self.red_scan(plan, bufs, low, next, &mut remaining)?;
            }
            while low < plan.nchunks && self.red.done[low] {
                low += 1;
            }
            if !self.rx_pending() {
                self.red_send_answers(plan)?;
            }
            if remaining == 0 {
                return self.red_send_answers(plan);
            }
            // Fresh contributions within the window.
            let end = plan.nchunks.min(low + plan.window());
            if next < end {
                // Their results have room in the result window.
                if let Some(windows) = red_windows(self.attachment.as_ref(), plan) {
                    windows.set_red_credit(plan.seq, end as u32);
                }
                self.red_send_data(plan, bufs, next..end, false)?;
                next = end;
            }
            if let Some(got) = self.recv_valid(backoff.due())? {
                if got.kind == Kind::RedLanded && got.header.seq == plan.seq {
                    scan = plan.kernel;
                    backoff = Backoff::starting(RED_RTO_INITIAL, RED_RTO_MAX);
                } else if self.red_on(plan, bufs, &got, &mut remaining)? {
                    backoff = Backoff::starting(RED_RTO_INITIAL, RED_RTO_MAX);
                    // A chunk this process handled itself lowers the
                    // kernel's target: if what landed already reaches it,
                    // no notice will come for those, so look now.
                    scan = plan.kernel;
                }
            }
            if backoff.fire() {
                if let Some(windows) = red_windows(self.attachment.as_ref(), plan) {
                    // Chunks landing in the kernel are progress too (it
                    // wakes this process only at the end): only a stall
                    // means something was lost. And a notice may have been
                    // lost (a full socket buffer).
                    let landed = windows.red_landed(plan.seq);
                    let before = remaining;
                    self.red_scan(plan, bufs, low, next, &mut remaining)?;
                    if remaining < before || landed != std::mem::replace(&mut landed_seen, landed) {
                        backoff = Backoff::starting(RED_RTO_INITIAL, RED_RTO_MAX);
                        continue;
                    }
                }
                self.red_check_silent(plan, low, next, timeout, silence)?;
                // Again what is not acknowledged yet, of what was sent.
                self.red_send_data(plan, bufs, low..next, true)?;
            }
        }
    }

    /// The fan-out path: takes what XDP landed since the last look, the
    /// results it placed in the result window (chunks `low..next`, whose
    /// contributions were sent) and the owned chunks it completed (whose
    /// results it sent). When the completion notice went up with chunks
    /// still missing (the process counted one of them as well), lets XDP
    /// send it again, and looks once more.
    fn red_scan(&mut self, plan: &Plan, bufs: &mut Bufs<'_>, low: usize, next: usize, remaining: &mut usize) -> Result<()> {
        if red_windows(self.attachment.as_ref(), plan).is_none() {
            return Ok(());
        }
        loop {
            let now = Instant::now();
            let windows = red_windows(self.attachment.as_ref(), plan).expect("checked above");
            for chunk in low..next {
                let owner = plan.owner(chunk);
                if self.red.done[chunk] || owner == plan.me || !windows.res_holds(plan.seq, chunk as u32) {
                    continue;
                }
                if let Bufs::InPlace(buf) = bufs {
                    windows.copy_res(plan.seq, chunk as u32, &mut buf[plan.bytes(chunk)]);
                }
                self.red.done[chunk] = true;
                self.red.heard[owner] = now;
                self.user_stats.reduce_results_from_kernel += 1;
                *remaining -= 1;
            }
            // Owned chunks from the first at or after `low`, while their
            // slots are prepared.
            let first = plan.first_owned_from(low);
            for owned in first..first + RED_SLOTS as usize {
                let Some(chunk) = plan.owned_chunk(owned) else { break };
                if self.red.done[chunk] {
                    continue;
                }
                let windows = red_windows(self.attachment.as_ref(), plan).expect("checked above");
                if !windows.red_holds(owned as u32, plan.seq, chunk as u32) {
                    break;
                }
                if windows.red_is_done(plan.seq, owned as u32) {
                    let send = windows.red_left_to_process(plan.seq, owned as u32);
                    self.red_complete(plan, bufs, chunk, remaining, send)?;
                    self.red.heard.iter_mut().for_each(|h| *h = now);
                }
            }
            let windows = red_windows(self.attachment.as_ref(), plan).expect("checked above");
            if *remaining == 0 || !windows.red_notified(plan.seq) {
                return Ok(());
            }
            windows.rearm_red_notice(plan.seq);
        }
    }

    /// Sends this rank's contributions to the chunks of `chunks` that are
    /// not done and that it does not own.
    fn red_send_data(&mut self, plan: &Plan, bufs: &Bufs<'_>, chunks: Range<usize>, again: bool) -> Result<()> {
        let mut header = self.red_header(Kind::RedData, plan);
        if again {
            header.flags |= FLAG_RETRANSMIT;
        }
        let input = bufs.input();
        let mut resent = 0;
        for chunk in chunks {
            let owner = plan.owner(chunk);
            if owner == plan.me || self.red.done[chunk] {
                continue;
            }
            if again {
                if resent == if plan.kernel { RESEND_MAX_KERNEL } else { RESEND_MAX } {
                    break;
                }
                resent += 1;
            }
            header.chunk = chunk as u32;
            if self.transport.queue(&header, plan.bytes(chunk), self.group.peers[owner].addr()) {
                self.packets_flushed(input)?;
            }
            if again {
                self.user_stats.retransmits += 1;
            } else {
                self.user_stats.reduce_contributions_sent += 1;
            }
        }
        self.packets_flushed(input)
    }

    /// Sends what the transport queued, its payloads from `source`.
    fn packets_flushed(&mut self, source: &[u8]) -> Result<()> {
        let sent = self.transport.flush(source)?;
        self.user_stats.packets_sent += sent as u64;
        Ok(())
    }

    fn red_header(&self, kind: Kind, plan: &Plan) -> Header {
        let mut header = self.header(kind, plan.seq);
        header.dtype = plan.dtype.code();
        header.op = plan.op_code();
        header.count = plan.count as u32;
        header.nchunks = plan.nchunks as u32;
        header
    }

    /// Handles a datagram during call `plan`; returns whether it was
    /// progress.
    fn red_on(&mut self, plan: &Plan, bufs: &mut Bufs<'_>, got: &Received, remaining: &mut usize) -> Result<bool> {
        let header = got.header;
        let sender = header.sender as usize;
        match got.kind {
            Kind::RedSum if header.seq == plan.seq && plan.kernel => {
                let chunk = header.chunk as usize;
                if chunk >= plan.nchunks || plan.owner(chunk) != plan.me || self.red.done[chunk] {
                    return Ok(false);
                }
                self.red_complete(plan, bufs, chunk, remaining, true)?;
                Ok(true)
            }
            Kind::RedData | Kind::RedResult | Kind::RedDone if header.seq == plan.seq => {
                self.red.heard[sender] = Instant::now();
                self.red_check(plan, &header, got.kind, self.payload(got).len())?;
                let chunk = header.chunk as usize;
                match got.kind {
                    Kind::RedData => self.red_fold(plan, bufs, &header, got, remaining),
                    Kind::RedResult => {
                        if self.red.done[chunk] {
                            self.user_stats.duplicates += 1;
                            return Ok(false);
                        }
                        let bytes = plan.bytes(chunk);
                        let payload = self.payload(got);
                        if let Bufs::InPlace(buf) = bufs {
                            buf[bytes].copy_from_slice(payload);
                        }
                        self.red.done[chunk] = true;
                        self.user_stats.reduce_results_received += 1;
                        *remaining -= 1;
                        if let Some(windows) = red_windows(self.attachment.as_ref(), plan) {
                            // Not one XDP placed (and counted) as well.
                            if !windows.res_holds(plan.seq, chunk as u32) {
                                windows.red_handled(plan.seq);
                            }
                        }
                        Ok(true)
                    }
                    _ => {
                        if self.red.done[chunk] {
                            self.user_stats.duplicates += 1;
                            return Ok(false);
                        }
                        self.red.done[chunk] = true;
                        *remaining -= 1;
                        if let Some(windows) = red_windows(self.attachment.as_ref(), plan) {
                            // Not one XDP marked (and counted) as well.
                            if !windows.res_holds(plan.seq, chunk as u32) {
                                windows.red_handled(plan.seq);
                            }
                        }
                        Ok(true)
                    }
                }
            }
            Kind::RedAbort if header.seq == plan.seq => {
                let blamed = header.count as usize;
                Err(if header.flags & FLAG_MISMATCH != 0 {
                    Error::Mismatch(format!(
                        "{}: the ranks' calls disagree (rank {blamed} found it; rank {sender} said so); rank {} called {}",
                        plan.name(),
                        plan.me,
                        plan.describe()
                    ))
                } else {
                    Error::PeerFailed {
                        rank: blamed,
                        what: format!("{}: rank {sender} gave up on it because rank {blamed} failed", plan.name()),
                    }
                })
            }
            _ => {
                self.serve_stale(got)?;
                Ok(false)
            }
        }
    }

    /// Checks a datagram of this call against the call: on a mismatch,
    /// tells every rank and fails.
    fn red_check(&mut self, plan: &Plan, header: &Header, kind: Kind, payload_len: usize) -> Result<()> {
        let chunk = header.chunk as usize;
        let theirs = (header.count as usize, header.dtype, header.op, header.nchunks as usize);
        let ours = (plan.count, plan.dtype.code(), plan.op_code(), plan.nchunks);
        let mut wrong = if theirs != ours {
            Some(format!(
                "rank {} sent count {}, dtype code {}, op code {:#04x}",
                header.sender, header.count, header.dtype, header.op
            ))
        } else if chunk >= plan.nchunks {
            Some(format!("rank {} sent chunk {chunk} of {}", header.sender, plan.nchunks))
        } else {
            None
        };
        if wrong.is_none() {
            let to_me = match kind {
                Kind::RedData => plan.owner(chunk) == plan.me,
                Kind::RedResult => plan.recipient(plan.me, chunk),
                _ => plan.owner(chunk) != plan.me,
            };
            let len_ok = kind == Kind::RedDone || payload_len == plan.bytes(chunk).len();
            if !to_me || !len_ok {
                wrong = Some(format!("rank {} sent chunk {chunk} that is not this rank's to get", header.sender));
            }
        }
        let Some(what) = wrong else { return Ok(()) };
        self.red_abort(plan, plan.me, true)?;
        Err(Error::Mismatch(format!(
            "{}: {what}; rank {} called {}: mismatched collective calls",
            plan.name(),
            plan.me,
            plan.describe()
        )))
    }

    /// Folds a contribution into an owned chunk; the last one completes it.
    fn red_fold(
        &mut self,
        plan: &Plan,
        bufs: &mut Bufs<'_>,
        header: &Header,
        got: &Received,
        remaining: &mut usize,
    ) -> Result<bool> {
        let chunk = header.chunk as usize;
        let sender = header.sender as usize;
        if self.red.done[chunk] {
            // The sender lost the answer: answer again.
            self.user_stats.duplicates += 1;
            self.red_answer(plan, chunk, sender, true)?;
            return Ok(false);
        }
        let payload = match self.transport.datagram(got.slot) {
            Some(datagram) => &datagram.bytes[HDR_LEN..],
            None => &[],
        };
        let added = add_contribution(
            &mut self.red,
            red_windows(self.attachment.as_ref(), plan),
            plan,
            chunk,
            sender,
            payload,
        );
        self.red_added(plan, bufs, chunk, added, remaining)
    }

    /// Counts what [`add_contribution`] did; completes the chunk when that
    /// made it complete. Returns whether it was progress.
    fn red_added(&mut self, plan: &Plan, bufs: &mut Bufs<'_>, chunk: usize, added: Added, remaining: &mut usize) -> Result<bool> {
        match added {
            Added::Repeat => {
                self.user_stats.duplicates += 1;
                Ok(false)
            }
            Added::Unprepared => {
                // Cannot happen while contributors keep to their window;
                // dropped, it will be sent again.
                tracing::debug!(chunk, "a contribution to a chunk whose kernel slot is not ready");
                Ok(false)
            }
            Added::Folded => {
                self.user_stats.reduce_folded += 1;
                Ok(true)
            }
            Added::Completed { folded } => {
                self.user_stats.reduce_folded += u64::from(folded);
                self.red_complete(plan, bufs, chunk, remaining, true)?;
                Ok(true)
            }
        }
    }

    /// Owned chunk `chunk` is complete (its sum in the accumulator, or in
    /// its kernel slot): the result goes to this rank's buffer and to
    /// whoever needs it, and its kernel slot to the owned chunk after it.
    /// `send`: this process completed it, and sends its results (else XDP
    /// completed it and they are on their way from the kernel).
    fn red_complete(
        &mut self,
        plan: &Plan,
        bufs: &mut Bufs<'_>,
        chunk: usize,
        remaining: &mut usize,
        send: bool,
    ) -> Result<()> {
        let len = plan.bytes(chunk).len();
        let at = plan.acc_offset(chunk);
        let parity = (plan.seq % 2) as usize;
        let owned = plan.owned_index(chunk);
        if let Some(windows) = red_windows(self.attachment.as_ref(), plan) {
            windows.copy_red(plan.seq, owned as u32, &mut self.red.acc[parity][at..at + len]);
            // The slot's next chunk, before anyone can have its result.
            if let Some(next) = plan.owned_chunk(owned + RED_SLOTS as usize) {
                let own = &bufs.input()[plan.bytes(next)];
                windows.prepare_red((owned + RED_SLOTS as usize) as u32, plan.seq, next as u32, plan.me, own);
            }
        }
        op::finish(plan.lanes, plan.fold_op, &mut self.red.acc[parity][at..at + len], plan.ranks);
        match bufs {
            Bufs::InPlace(buf) => buf[plan.bytes(chunk)].copy_from_slice(&self.red.acc[parity][at..at + len]),
            Bufs::Split(_, out) => {
                let start = plan.bytes(chunk).start - plan.me * plan.block * plan.dtype.size();
                out[start..start + len].copy_from_slice(&self.red.acc[parity][at..at + len]);
            }
            Bufs::Input(_) => {}
        }
        self.red.done[chunk] = true;
        *remaining -= 1;
        if !send {
            return Ok(());
        }
        if let Some(windows) = red_windows(self.attachment.as_ref(), plan) {
            windows.red_handled(plan.seq);
        }
        // Answered with the other chunks completed by this receive batch
        // (`red_send_answers`): one sendmmsg for many chunks' results.
        self.red.answers.push(chunk as u32);
        Ok(())
    }

    /// Sends every other rank the answers to its contributions to the
    /// chunks completed since the last call, batched: rank by rank, in
    /// chunk order, so that a run of results to one rank leaves as one
    /// super-packet.
    fn red_send_answers(&mut self, plan: &Plan) -> Result<()> {
        if self.red.answers.is_empty() {
            return Ok(());
        }
        let mut answers = std::mem::take(&mut self.red.answers);
        answers.sort_unstable();
        let result = (|| {
            for rank in (0..plan.ranks).filter(|&r| r != plan.me) {
                for &chunk in &answers {
                    self.red_answer(plan, chunk as usize, rank, false)?;
                }
            }
            self.red_flush_acc(plan)
        })();
        self.red.answers = answers;
        self.red.answers.clear();
        result
    }

    /// Sends what is queued, the payloads from `plan`'s accumulator.
    fn red_flush_acc(&mut self, plan: &Plan) -> Result<()> {
        let sent = self.transport.flush(&self.red.acc[(plan.seq % 2) as usize])?;
        self.user_stats.packets_sent += sent as u64;
        Ok(())
    }

    /// Queues to `rank` the answer to its contribution to completed chunk
    /// `chunk` of `plan`: the result if it is a recipient, else DONE. A
    /// repeat (`again`) is sent at once; otherwise the caller flushes with
    /// [`Comm::red_flush_acc`] (the payload is in the accumulator).
    fn red_answer(&mut self, plan: &Plan, chunk: usize, rank: usize, again: bool) -> Result<()> {
        let addr = self.group.peers[rank].addr();
        let mut header = self.red_header(if plan.recipient(rank, chunk) { Kind::RedResult } else { Kind::RedDone }, plan);
        header.chunk = chunk as u32;
        if again {
            header.flags |= FLAG_RETRANSMIT;
        }
        let at = plan.acc_offset(chunk);
        let payload = if header.kind == Kind::RedResult as u8 { at..at + plan.bytes(chunk).len() } else { 0..0 };
        if header.kind == Kind::RedResult as u8 {
            self.user_stats.reduce_results_sent += 1;
        }
        if self.transport.queue(&header, payload, addr) || again {
            self.red_flush_acc(plan)?;
        }
        Ok(())
    }

    /// Fails the call when a rank it waits for has been silent too long:
    /// a contributor to an owned chunk for the timeout, an owner of a chunk
    /// this rank waits for for the timeout and a grace (it may itself be
    /// waiting for someone, and will say so).
    fn red_check_silent(
        &mut self,
        plan: &Plan,
        low: usize,
        next: usize,
        timeout: std::time::Duration,
        silence: std::time::Duration,
    ) -> Result<()> {
        let now = Instant::now();
        let mut blamed = None;
        let windows = red_windows(self.attachment.as_ref(), plan);
        for chunk in plan.owned_chunks().filter(|&c| !self.red.done[c]) {
            let index = plan.owned_index(chunk);
            for rank in (0..plan.ranks).filter(|&r| r != plan.me) {
                let folded = match windows {
                    // XDP folds them: the slot's bits say who contributed
                    // (a slot not prepared yet has nobody's but this rank's).
                    Some(w) if w.red_holds(index as u32, plan.seq, chunk as u32) => w.red_has(plan.seq, index as u32, rank),
                    Some(_) => true,
                    None => self.red.folded[index * words(plan.ranks) + rank / 64] & (1 << (rank % 64)) != 0,
                };
                if !folded && now.duration_since(self.red.heard[rank]) >= timeout {
                    blamed = Some((rank, format!("its contribution to chunk {chunk} did not come")));
                    break;
                }
            }
            if blamed.is_some() {
                break;
            }
        }
        if blamed.is_none() {
            for chunk in (low..next).filter(|&c| !self.red.done[c]) {
                let owner = plan.owner(chunk);
                if owner != plan.me && now.duration_since(self.red.heard[owner]) >= silence {
                    blamed = Some((owner, format!("it did not answer for chunk {chunk}")));
                    break;
                }
            }
        }
        let Some((rank, why)) = blamed else { return Ok(()) };
        self.red_abort(plan, rank, false)?;
        Err(Error::PeerFailed {
            rank,
            what: format!("{}: {why} within {} ms (rank {} gave up)", plan.name(), timeout.as_millis(), plan.me),
        })
    }

    /// Tells every other rank that call `plan` failed because of `blamed`.
    fn red_abort(&mut self, plan: &Plan, blamed: usize, mismatch: bool) -> Result<()> {
        let mut header = self.red_header(Kind::RedAbort, plan);
        header.count = blamed as u32;
        if mismatch {
            header.flags |= FLAG_MISMATCH;
        }
        for _ in 0..ABORT_COPIES {
            for rank in (0..plan.ranks).filter(|&r| r != plan.me) {
                self.queue_control(&header, rank)?;
            }
        }
        self.flush_queued()
    }

    /// Handles what was kept of this call before it was made.
    fn red_replay_early(&mut self, plan: &Plan, bufs: &mut Bufs<'_>, remaining: &mut usize) -> Result<()> {
        let kept = self.red.early.headers.len();
        if kept == 0 {
            return Ok(());
        }
        let early = std::mem::replace(&mut self.red.early, Early { headers: Vec::new(), data: Vec::new(), lens: Vec::new() });
        let result = (|| {
            for (i, header) in early.headers.iter().enumerate() {
                if header.seq != plan.seq {
                    continue;
                }
                let payload = &early.data[i * self.chunk..][..early.lens[i]];
                self.red_on_early(plan, bufs, header, payload, remaining)?;
            }
            Ok(())
        })();
        self.red.early = early;
        self.red.early.headers.clear();
        self.red.early.lens.clear();
        result
    }

    /// [`Comm::red_fold`] of a contribution kept before the call.
    fn red_on_early(
        &mut self,
        plan: &Plan,
        bufs: &mut Bufs<'_>,
        header: &Header,
        payload: &[u8],
        remaining: &mut usize,
    ) -> Result<()> {
        let chunk = header.chunk as usize;
        let sender = header.sender as usize;
        self.red_check(plan, header, Kind::RedData, payload.len())?;
        if self.red.done[chunk] {
            self.user_stats.duplicates += 1;
            return Ok(());
        }
        let added = add_contribution(&mut self.red, red_windows(self.attachment.as_ref(), plan), plan, chunk, sender, payload);
        self.red_added(plan, bufs, chunk, added, remaining).map(drop)
    }

    /// A reduction datagram outside a call of it: a repeat of a contribution
    /// to the last completed one (answered from its accumulator), or a
    /// contribution to the next one (kept). Returns whether it was one.
    pub(crate) fn serve_stale_reduce(&mut self, got: &Received) -> Result<bool> {
        let header = got.header;
        let sender = header.sender as usize;
        if got.kind != Kind::RedData {
            return Ok(false);
        }
        if let Some(last) = self.red.last.filter(|p| p.seq == header.seq) {
            let chunk = header.chunk as usize;
            if chunk < last.nchunks && last.owner(chunk) == self.rank() {
                self.user_stats.duplicates += 1;
                self.red_answer(&last, chunk, sender, true)?;
                return Ok(true);
            }
            return Ok(false);
        }
        if header.seq == self.red.seq.wrapping_add(1) {
            let early = &mut self.red.early;
            let payload_len = self.transport.datagram(got.slot).map_or(0, |d| d.bytes.len() - HDR_LEN);
            if early.headers.len() >= EARLY_MAX || payload_len > self.chunk {
                return Ok(false); // it will be sent again
            }
            if early.data.is_empty() {
                early.data = vec![0; EARLY_MAX * self.chunk];
                early.headers.reserve(EARLY_MAX);
                early.lens.reserve(EARLY_MAX);
            }
            let i = early.headers.len();
            if let Some(datagram) = self.transport.datagram(got.slot) {
                early.data[i * self.chunk..][..payload_len].copy_from_slice(&datagram.bytes[HDR_LEN..]);
            }
            early.headers.push(header);
            early.lens.push(payload_len);
            return Ok(true);
        }
        Ok(false)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::comm::testing::ranks;

    /// The owners' geometry (runs of chunks) against a plain loop over
    /// every chunk: which chunks a rank owns, in what order, their owned
    /// indices, and the first owned at or after any chunk.
    #[test]
    fn runs_of_chunks_match_a_plain_loop() {
        for (nchunks, ranks, run) in [(1, 1, 1), (7, 3, 1), (7, 3, 2), (100, 8, 44), (353, 8, 44), (12, 4, 3)] {
            for me in 0..ranks {
                let plan = Plan {
                    seq: 1,
                    coll: Collective::Allreduce,
                    dtype: Dtype::I32,
                    op: ReduceOp::Sum,
                    lanes: Dtype::I32,
                    fold_op: ReduceOp::Sum,
                    kernel: false,
                    root: 0,
                    ranks,
                    me,
                    count: nchunks,
                    block: 0,
                    per_chunk: 1,
                    per_block: 0,
                    nchunks,
                    run,
                };
                let mine: Vec<usize> = (0..nchunks).filter(|c| (c / run) % ranks == me).collect();
                assert_eq!(plan.owned_chunks().collect::<Vec<_>>(), mine, "{nchunks} chunks, {ranks} ranks, run {run}, rank {me}");
                for (i, &c) in mine.iter().enumerate() {
                    assert_eq!(plan.owner(c), me);
                    assert_eq!(plan.owned_index(c), i);
                    assert_eq!(plan.owned_chunk(i), Some(c));
                }
                assert_eq!(plan.owned_chunk(mine.len()), None);
                for c in 0..=nchunks {
                    assert_eq!(plan.first_owned_from(c), mine.iter().filter(|&&m| m < c).count(), "first owned from {c}");
                }
            }
        }
    }

    /// Rank `rank`'s input: distinct per rank and element.
    fn input(rank: usize, len: usize) -> Vec<i64> {
        (0..len).map(|i| (i as i64 * 7919 + rank as i64 * 104_729) % 1_000_003 - 500_000).collect()
    }

    #[test]
    fn allreduce_reduce_and_reduce_scatter_match_a_plain_loop() {
        let n = 3;
        let results = ranks(n, 29_641, 10_000, move |rank, comm| {
            let chunk = comm.chunk_size() / 8;
            for len in [0, 1, chunk - 1, chunk, chunk + 1, 5 * chunk * n + 3] {
                let mut buf = input(rank, len);
                comm.allreduce_slice(&mut buf, ReduceOp::Sum).unwrap();
                let want: Vec<i64> = (0..len).map(|i| (0..n).map(|r| input(r, len)[i]).sum()).collect();
                assert_eq!(buf, want, "rank {rank}: allreduce sum of {len}");
                let mut buf = input(rank, len);
                comm.allreduce_slice(&mut buf, ReduceOp::Max).unwrap();
                let want: Vec<i64> = (0..len).map(|i| (0..n).map(|r| input(r, len)[i]).max().unwrap()).collect();
                assert_eq!(buf, want, "rank {rank}: allreduce max of {len}");
                for root in 0..n {
                    let send = input(rank, len);
                    let mut recv = if rank == root { vec![0i64; len] } else { Vec::new() };
                    comm.reduce_from(as_bytes(&send), as_bytes_mut(&mut recv), Dtype::I64, ReduceOp::Min, root).unwrap();
                    if rank == root {
                        let want: Vec<i64> = (0..len).map(|i| (0..n).map(|r| input(r, len)[i]).min().unwrap()).collect();
                        assert_eq!(recv, want, "rank {rank}: reduce min of {len} to {root}");
                    }
                }
                let send = input(rank, len * n);
                let mut recv = vec![0i64; len];
                comm.reduce_scatter(as_bytes(&send), as_bytes_mut(&mut recv), Dtype::I64, ReduceOp::Sum).unwrap();
                let want: Vec<i64> = (0..len).map(|i| (0..n).map(|r| input(r, len * n)[rank * len + i]).sum()).collect();
                assert_eq!(recv, want, "rank {rank}: reduce-scatter of {len}");
                let send = input(rank, len);
                let mut recv = vec![0i64; len * n];
                comm.allgather_slice(&send, &mut recv).unwrap();
                let want: Vec<i64> = (0..n).flat_map(|r| input(r, len)).collect();
                assert_eq!(recv, want, "rank {rank}: allgather of {len}");
            }
            comm.stats().unwrap().user
        });
        assert!(results.iter().all(|s| s.reductions > 0 && s.reduce_folded > 0));
    }

    #[test]
    fn float_average_and_bad_arguments() {
        let n = 2;
        ranks(n, 29_642, 10_000, move |rank, comm| {
            let mut buf = vec![rank as f32 + 1.0, -3.0 * rank as f32, f32::INFINITY];
            comm.allreduce_slice(&mut buf, ReduceOp::Avg).unwrap();
            assert_eq!(buf, vec![1.5, -1.5, f32::INFINITY]);
            let mut ints = vec![1i32; 4];
            let err = comm.allreduce_slice(&mut ints, ReduceOp::Avg).unwrap_err();
            assert_eq!(err.status(), crate::Status::InvalidArgument);
            let err = comm.reduce(&mut [0u8; 8], Dtype::I64, ReduceOp::Sum, 5).unwrap_err();
            assert!(err.to_string().contains("root 5"), "{err}");
            let err = comm.reduce_scatter(&[0u8; 8], &mut [0u8; 8], Dtype::I32, ReduceOp::Sum).unwrap_err();
            assert!(err.to_string().contains("reduce-scatter"), "{err}");
            // Still in step after the refused calls.
            let mut buf = vec![rank as u64; 3];
            comm.allreduce_slice(&mut buf, ReduceOp::Sum).unwrap();
            assert_eq!(buf, vec![1; 3]);
        });
    }
}
