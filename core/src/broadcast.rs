//! Broadcast over the AggBox UDP transport, as `docs/BROADCAST.md`
//! specifies it (the user datapath; a kernel communicator runs the same
//! algorithm for now, its datagrams checked by the BPF programs).
//!
//! **Root.** Sends chunk after chunk to every receiver (batched with
//! `sendmmsg`), keeping at most [`WINDOW_CHUNKS`] chunks beyond the first
//! one not yet held by every receiver. A ring of window slots holds, per
//! chunk, the set of receivers that have not acknowledged it. A chunk a
//! receiver lacks is resent to it as soon as that receiver acknowledges a
//! transmission sent after the chunk's latest one (datagrams to one
//! receiver arrive in order; the header's `op` numbers the transmissions and
//! acknowledgments echo it). When no acknowledgment made progress for a
//! retransmission timeout (the shared `Backoff`: 1 ms doubling to 50 ms), it
//! probes each receiver that owes acknowledgments with its first missing
//! chunk. A receiver silent for the operation timeout while it owes
//! acknowledgments fails the broadcast, naming it; the other receivers are
//! told (`BCAST_ABORT`).
//!
//! **Receiver.** Copies each chunk of its broadcast from the receive batch
//! to its place in the caller's buffer, marks it in a bitmap (a duplicate is
//! counted and not placed again) and queues its acknowledgment; the queue
//! goes out with one `sendmmsg` when the socket has been drained (or when
//! it holds a batch). It checks every chunk's header against its own call
//! and never places one that disagrees: it sends `BCAST_ABORT(MISMATCH)` and
//! fails instead.
//!
//! **Between operations** (`Comm::serve_stale`, from any operation and
//! while closing): a chunk of an earlier broadcast is acknowledged again (or
//! answered with the abort of a broadcast this rank failed); chunks of the
//! next broadcast are kept, one window's worth, until it is called.
//!
//! Everything a broadcast needs is allocated once (the window, the early
//! chunks) or grows to the largest broadcast seen (the receive bitmap): no
//! datagram allocates.

use std::{
    ops::Range,
    time::{Duration, Instant},
};

use crate::{
    comm::{receiver_grace, Backoff, Received},
    dtype::{as_bytes_mut, Dtype, Element},
    loader::Attachment,
    maps::RX_WINDOW,
    window::{RxArm, Windows},
    wire::{
        seq_at_or_before, Header, Kind, FLAG_ANSWERED, FLAG_FANOUT, FLAG_GROUP, FLAG_MISMATCH, FLAG_RANGE, FLAG_RETRANSMIT, HDR_LEN,
        MAX_RANKS,
    },
    Datapath,
    Comm, Error, Result,
};

/// The root's window: chunks it keeps in flight beyond the first one not
/// yet held by every receiver (`WINDOW_CHUNKS` of docs/BROADCAST.md).
pub const WINDOW_CHUNKS: usize = 256;

/// A kernel root is woken every this many chunks held by every receiver
/// (and at the last): half its window, so it can send the next half.
const KERNEL_TX_NOTIFY: u32 = (WINDOW_CHUNKS / 2) as u32;

/// How often a kernel receiver looks at its window without a notice.
const KERNEL_RX_LOOK: Duration = Duration::from_millis(20);

/// Copies of each `BCAST_ABORT` sent: it is not acknowledged, and a lost one
/// leaves a survivor waiting for the timeout and blaming the wrong rank.
const ABORT_COPIES: usize = 3;

/// Words of a [`RankSet`].
const RANK_WORDS: usize = MAX_RANKS / 64;

/// The number of chunks of a broadcast of `bytes` bytes in chunks of
/// `chunk` bytes: `max(1, ceil(bytes / chunk))` (a 0-byte broadcast is one
/// empty chunk).
pub fn chunk_count(bytes: usize, chunk: usize) -> usize {
    bytes.div_ceil(chunk).max(1)
}

/// The bytes of the buffer that chunk `index` carries:
/// `[index·chunk, min((index+1)·chunk, bytes))`.
pub fn chunk_bytes(index: usize, bytes: usize, chunk: usize) -> Range<usize> {
    let start = index.saturating_mul(chunk).min(bytes);
    start..start.saturating_add(chunk).min(bytes)
}


/// A set of ranks, as a bitmap.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
struct RankSet {
    words: [u64; RANK_WORDS],
}

impl RankSet {
    fn insert(&mut self, rank: usize) {
        self.words[rank / 64] |= 1 << (rank % 64);
    }

    /// Removes `rank`; returns whether it was there.
    fn remove(&mut self, rank: usize) -> bool {
        let bit = 1 << (rank % 64);
        let was = self.words[rank / 64] & bit != 0;
        self.words[rank / 64] &= !bit;
        was
    }

    fn contains(&self, rank: usize) -> bool {
        self.words[rank / 64] & (1 << (rank % 64)) != 0
    }

    fn len(&self) -> usize {
        self.words.iter().map(|w| w.count_ones() as usize).sum()
    }

    fn union(&mut self, other: &RankSet) {
        for (word, more) in self.words.iter_mut().zip(other.words) {
            *word |= more;
        }
    }

    /// The ranks in both sets.
    fn and(mut self, other: RankSet) -> RankSet {
        for (word, both) in self.words.iter_mut().zip(other.words) {
            *word &= both;
        }
        self
    }

    /// The ranks of this set that are not in `other`.
    fn minus(mut self, other: RankSet) -> RankSet {
        for (word, not) in self.words.iter_mut().zip(other.words) {
            *word &= !not;
        }
        self
    }

    fn is_empty(&self) -> bool {
        self.words.iter().all(|w| *w == 0)
    }

    /// The ranks in the set, in order.
    fn iter(self) -> impl Iterator<Item = usize> {
        self.words.into_iter().enumerate().flat_map(|(i, word)| {
            let mut bits = word;
            std::iter::from_fn(move || {
                (bits != 0).then(|| {
                    let bit = bits.trailing_zeros() as usize;
                    bits &= bits - 1;
                    i * 64 + bit
                })
            })
        })
    }

    /// The ranks as "1, 4, 5".
    fn names(self) -> String {
        self.iter().map(|r| r.to_string()).collect::<Vec<_>>().join(", ")
    }
}

/// One rank's broadcast call, against which every datagram is checked.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Call {
    /// The broadcast's sequence number (1, 2, … on every rank).
    seq: u32,
    root: usize,
    dtype: Dtype,
    /// Elements.
    count: u32,
    /// `count × dtype.size()`.
    bytes: usize,
    nchunks: usize,
}

impl Call {
    /// "root 0, dtype u8, count 10".
    fn describe(&self) -> String {
        format!("root {}, dtype {}, count {}", self.root, self.dtype, self.count)
    }
}

/// "dtype f32, count 7" as a `BCAST_DATA` header states them.
fn describe_data(header: &Header) -> String {
    let dtype = Dtype::from_code(header.dtype).map_or_else(|| format!("code {}", header.dtype), |d| d.to_string());
    format!("dtype {dtype}, count {}", header.count)
}

/// A broadcast this rank failed, so that late datagrams of it are answered
/// with its abort, never acknowledged.
#[derive(Clone, Copy, Debug)]
struct Failed {
    seq: u32,
    blamed: usize,
    mismatch: bool,
}

/// The root's per-chunk state, one window slot.
#[derive(Clone, Copy, Debug)]
struct Slot {
    /// The chunk it holds.
    chunk: usize,
    /// Receivers that have not acknowledged the chunk.
    missing: RankSet,
    /// How many they are.
    left: usize,
    /// When the chunk was last sent.
    sent_at: Instant,
    /// Its latest transmission's number (0 the first, saturating), sent in
    /// the header's `op` byte and echoed by acknowledgments, so that an
    /// acknowledgment tells which transmission it answers.
    tx: u8,
    /// The window's send count at its latest transmission: which chunks
    /// went out before which.
    order: u64,
    /// The send count of its first transmission (what an acknowledgment
    /// of an older transmission proves, at least).
    first: u64,
}

impl Slot {
    /// What an acknowledgment echoing transmission number `tx` proves: the
    /// send count of the transmission that arrived (of the first one, when
    /// it cannot tell which).
    fn delivered(&self, tx: u8) -> u64 {
        if tx == self.tx && tx != u8::MAX {
            self.order
        } else {
            self.first
        }
    }
}

/// The root's view of a broadcast in progress.
///
/// Loss is found two ways. Datagrams to one receiver arrive in the order
/// they were sent, so a chunk a receiver lacks that was sent before one it
/// acknowledged is lost ([`Window::lost_to`]), found as soon as that
/// acknowledgment arrives. The retransmission timer covers the rest (a
/// loss with nothing sent after it): it resends each receiver's first
/// missing chunk, and that probe's acknowledgment shows everything older
/// that is missing.
#[derive(Debug)]
struct Window {
    /// `WINDOW_CHUNKS` slots; chunk `c` lives in slot `c % WINDOW_CHUNKS`.
    slots: Vec<Slot>,
    /// First chunk not yet held by every receiver.
    base: usize,
    /// First chunk not sent yet.
    next: usize,
    receivers: RankSet,
    /// When each rank was last heard from (an acknowledgment).
    last_heard: Vec<Instant>,
    /// Chunk transmissions so far, for `Slot::order`.
    sends: u64,
    /// Per rank, the latest send count proven delivered to it: a chunk it
    /// lacks whose latest transmission is older was lost.
    delivered: Vec<u64>,
    /// Receivers whose `delivered` grew since the last loss check.
    news: RankSet,
}

impl Window {
    fn new(ranks: usize) -> Window {
        let now = Instant::now();
        let slot = Slot { chunk: 0, missing: RankSet::default(), left: 0, sent_at: now, tx: 0, order: 0, first: 0 };
        Window {
            slots: vec![slot; WINDOW_CHUNKS],
            base: 0,
            next: 0,
            receivers: RankSet::default(),
            last_heard: vec![now; ranks],
            sends: 0,
            delivered: vec![0; ranks],
            news: RankSet::default(),
        }
    }

    /// Starts a broadcast from `root` to every other of `ranks` ranks.
    fn start(&mut self, ranks: usize, root: usize) {
        self.base = 0;
        self.next = 0;
        self.receivers = RankSet::default();
        (0..ranks).filter(|&r| r != root).for_each(|r| self.receivers.insert(r));
        self.last_heard.fill(Instant::now());
        self.sends = 0;
        self.delivered.fill(0);
        self.news = RankSet::default();
    }

    fn slot(&mut self, chunk: usize) -> &mut Slot {
        &mut self.slots[chunk % WINDOW_CHUNKS]
    }

    /// Records the first transmission of `chunk` (the next one), now, to
    /// every receiver.
    fn sent_fresh(&mut self, now: Instant) {
        let (chunk, missing) = (self.next, self.receivers);
        self.sends += 1;
        let order = self.sends;
        *self.slot(chunk) = Slot { chunk, missing, left: missing.len(), sent_at: now, tx: 0, order, first: order };
        self.next += 1;
    }

    /// Records a transmission of `chunk` again, now; returns its number.
    fn resent(&mut self, chunk: usize, now: Instant) -> u8 {
        self.sends += 1;
        let order = self.sends;
        let slot = self.slot(chunk);
        slot.sent_at = now;
        slot.order = order;
        slot.tx = slot.tx.saturating_add(1);
        slot.tx
    }

    /// Records that `rank` acknowledged transmission `tx` of `chunk`;
    /// returns whether it was news (it had not acknowledged the chunk).
    fn acknowledge(&mut self, chunk: usize, tx: u8, rank: usize) -> bool {
        let index = chunk % WINDOW_CHUNKS;
        if chunk >= self.next || self.slots[index].chunk != chunk {
            return false; // never sent, or long complete
        }
        let delivered = self.slots[index].delivered(tx);
        if delivered > self.delivered[rank] {
            self.delivered[rank] = delivered;
            self.news.insert(rank);
        }
        let slot = &mut self.slots[index];
        if !slot.missing.remove(rank) {
            return false;
        }
        slot.left -= 1;
        while self.base < self.next && self.slots[self.base % WINDOW_CHUNKS].left == 0 {
            self.base += 1;
        }
        true
    }

    /// The receivers `chunk` was lost to: they lack it, and something sent
    /// after its latest transmission reached them (only receivers with
    /// news since the last check are looked at).
    fn lost_to(&self, chunk: usize) -> RankSet {
        let slot = &self.slots[chunk % WINDOW_CHUNKS];
        let mut lost = RankSet::default();
        for rank in slot.missing.and(self.news).iter() {
            if self.delivered[rank] > slot.order {
                lost.insert(rank);
            }
        }
        lost
    }

    /// Receivers that still owe an acknowledgment.
    fn owing(&self) -> RankSet {
        let mut owing = RankSet::default();
        for chunk in self.base..self.next {
            owing.union(&self.slots[chunk % WINDOW_CHUNKS].missing);
        }
        owing
    }

    /// The first chunk `rank` has not acknowledged.
    fn first_missing(&self, rank: usize) -> usize {
        (self.base..self.next).find(|&c| self.slots[c % WINDOW_CHUNKS].missing.contains(rank)).unwrap_or(self.next)
    }
}

/// A receiver's bitmap of the chunks it placed.
#[derive(Debug, Default)]
struct Placed {
    bits: Vec<u64>,
    remaining: usize,
}

impl Placed {
    /// Starts a broadcast of `nchunks` chunks (grows the bitmap only when it
    /// is the largest yet).
    fn start(&mut self, nchunks: usize) {
        self.bits.clear();
        self.bits.resize(nchunks.div_ceil(64), 0);
        self.remaining = nchunks;
    }

    fn has(&self, chunk: usize) -> bool {
        self.bits[chunk / 64] & (1 << (chunk % 64)) != 0
    }

    fn mark(&mut self, chunk: usize) {
        self.bits[chunk / 64] |= 1 << (chunk % 64);
        self.remaining -= 1;
    }
}

/// Chunks of the next broadcast that arrived before it was called: at most
/// one window's worth (chunk indices below [`WINDOW_CHUNKS`], all a root
/// can send before this rank acknowledges anything).
#[derive(Debug, Default)]
struct Early {
    /// The broadcast they belong to.
    seq: u32,
    chunk: usize,
    headers: Vec<Option<Header>>,
    lens: Vec<usize>,
    /// `WINDOW_CHUNKS` × `chunk` bytes.
    data: Vec<u8>,
    held: usize,
}

/// What became of a chunk of the next broadcast.
#[derive(Debug, PartialEq, Eq)]
enum Kept {
    /// Held until that broadcast is called.
    Held,
    /// Held already.
    Duplicate,
    /// Not held: beyond one window, or too long.
    Dropped,
}

impl Early {
    fn new(chunk: usize) -> Early {
        Early {
            seq: 0,
            chunk,
            headers: vec![None; WINDOW_CHUNKS],
            lens: vec![0; WINDOW_CHUNKS],
            data: vec![0; WINDOW_CHUNKS * chunk],
            held: 0,
        }
    }

    /// Forgets every chunk held.
    fn clear(&mut self) {
        if self.held > 0 {
            self.headers.fill(None);
            self.held = 0;
        }
    }

    /// Keeps chunk `header.chunk` of broadcast `header.seq`, forgetting what
    /// it held of another broadcast.
    fn keep(&mut self, header: &Header, payload: &[u8]) -> Kept {
        let index = header.chunk as usize;
        if index >= self.headers.len() || payload.len() > self.chunk {
            return Kept::Dropped;
        }
        if header.seq != self.seq {
            self.clear();
            self.seq = header.seq;
        }
        if self.headers[index].is_some() {
            return Kept::Duplicate;
        }
        self.data[index * self.chunk..][..payload.len()].copy_from_slice(payload);
        self.headers[index] = Some(*header);
        self.lens[index] = payload.len();
        self.held += 1;
        Kept::Held
    }

    /// Chunk `index` held for broadcast `seq`, if any.
    fn get(&self, seq: u32, index: usize) -> Option<(Header, &[u8])> {
        let header = self.headers[index].filter(|_| self.held > 0 && self.seq == seq)?;
        Some((header, &self.data[index * self.chunk..][..self.lens[index]]))
    }
}

/// What broadcast keeps in the communicator between calls.
#[derive(Debug)]
pub(crate) struct BcastState {
    /// Sequence number of the last broadcast called.
    pub(crate) seq: u32,
    failed: Option<Failed>,
    window: Window,
    placed: Placed,
    early: Early,
    /// Kernel receiver: the first chunk not yet placed in `buf`.
    low: usize,
}

impl BcastState {
    /// The state of a communicator of `ranks` ranks whose chunks are
    /// `chunk` bytes.
    pub(crate) fn new(ranks: usize, chunk: usize) -> BcastState {
        BcastState {
            seq: 0,
            failed: None,
            window: Window::new(ranks),
            placed: Placed::default(),
            early: Early::new(chunk),
            low: 0,
        }
    }
}

/// The kernel broadcast windows of `attachment` when `usable` (see
/// `Comm::kernel_windows`); a free function so that it borrows only the
/// attachment, not the whole communicator.
fn windows_if(attachment: Option<&Attachment>, usable: bool) -> Option<&Windows> {
    attachment.filter(|_| usable).and_then(|a| a.windows())
}

/// Where the bytes of a `BCAST_DATA` are.
#[derive(Clone, Copy)]
enum Source<'a> {
    /// In the transport's receive batch.
    Batch(&'a Received),
    /// Kept in [`Early`] (taken out of the communicator meanwhile).
    Early(&'a [u8]),
}

/// What a receiver makes of a `BCAST_DATA` of its broadcast.
#[derive(Debug, PartialEq, Eq)]
enum Verdict {
    /// A chunk it lacks: place it.
    Fresh(usize),
    /// A chunk it placed already.
    Duplicate(usize),
    /// Not a chunk of this broadcast's layout: dropped.
    Malformed,
    /// The sender's call disagrees with this rank's: the message says how.
    Mismatch(String),
}

/// Judges a `BCAST_DATA` of `call`'s sequence number from `header.sender`
/// with `len` payload bytes, for rank `me` (chunks `chunk` bytes).
fn judge(header: &Header, len: usize, call: &Call, me: usize, chunk: usize, placed: &Placed) -> Verdict {
    let sender = header.sender as usize;
    if sender != call.root {
        return Verdict::Mismatch(format!(
            "broadcast #{}: rank {me} called with {}; rank {sender} sent data as root, with {}",
            call.seq,
            call.describe(),
            describe_data(header)
        ));
    }
    if header.dtype != call.dtype.code() || header.count != call.count || header.nchunks as usize != call.nchunks {
        return Verdict::Mismatch(format!(
            "broadcast #{}: rank {me} called with {}; the root (rank {sender}) with {}",
            call.seq,
            call.describe(),
            describe_data(header)
        ));
    }
    let index = header.chunk as usize;
    if index >= call.nchunks || chunk_bytes(index, call.bytes, chunk).len() != len {
        return Verdict::Malformed;
    }
    if placed.has(index) {
        Verdict::Duplicate(index)
    } else {
        Verdict::Fresh(index)
    }
}

impl Comm {
    /// Broadcasts `buf` from rank `root` to every rank, in place: on return
    /// every rank's `buf` holds what the root's held. Every rank calls it
    /// with the same `root`, `dtype` and length, in the same order as its
    /// other collectives. `buf` holds `buf.len() / dtype.size()` elements.
    ///
    /// Fails with [`Error::InvalidArgument`] before sending anything (and
    /// without counting as a broadcast) when `root` is not a rank,
    /// `buf.len()` is not a whole number of elements or exceeds `u32::MAX`
    /// elements; with [`Error::Mismatch`] when the calls disagree (on every
    /// rank, except that a rank whose call agreed and that received every
    /// chunk before the root found out fails its next broadcast instead:
    /// docs/BROADCAST.md); with [`Error::PeerFailed`] naming a rank that
    /// stopped answering within the timeout. After a failure `buf` may hold
    /// part of the root's data.
    pub fn broadcast(&mut self, buf: &mut [u8], dtype: Dtype, root: usize) -> Result<()> {
        let call = self.bcast_call(buf.len(), dtype, root)?;
        self.bcast.seq = call.seq;
        let result = if self.size() == 1 {
            Ok(())
        } else if root == self.rank() {
            self.bcast_root(buf, &call)
        } else {
            self.bcast_receive(buf, &call)
        };
        self.bcast_finish(&call, result)
    }

    /// [`Comm::broadcast`] of a typed buffer.
    pub fn broadcast_slice<T: Element>(&mut self, buf: &mut [T], root: usize) -> Result<()> {
        self.broadcast(as_bytes_mut(buf), T::DTYPE, root)
    }

    /// Checks the arguments and makes the call of the next broadcast.
    fn bcast_call(&self, bytes: usize, dtype: Dtype, root: usize) -> Result<Call> {
        if root >= self.size() {
            return Err(Error::InvalidArgument(format!(
                "broadcast: root {root} is not a rank of this group of {}",
                self.size()
            )));
        }
        if !bytes.is_multiple_of(dtype.size()) {
            return Err(Error::InvalidArgument(format!(
                "broadcast: a buffer of {bytes} bytes is not a whole number of {dtype} elements ({} bytes each)",
                dtype.size()
            )));
        }
        let count = u32::try_from(bytes / dtype.size()).map_err(|_| {
            Error::InvalidArgument(format!(
                "broadcast: {} elements are more than one broadcast carries ({})",
                bytes / dtype.size(),
                u32::MAX
            ))
        })?;
        Ok(Call {
            seq: self.bcast.seq.wrapping_add(1),
            root,
            dtype,
            count,
            bytes,
            nchunks: chunk_count(bytes, self.chunk),
        })
    }

    /// Counts, remembers and returns how broadcast `call` ended.
    fn bcast_finish(&mut self, call: &Call, result: Result<()>) -> Result<()> {
        // Acknowledgments still queued go now, whatever happened.
        let flushed = self.flush_queued();
        let result = result.and(flushed);
        match &result {
            Ok(()) => self.user_stats.broadcasts += 1,
            Err(error) => {
                let (blamed, mismatch) = match error {
                    Error::PeerFailed { rank, .. } => {
                        self.failed[*rank] = true;
                        (*rank, false)
                    }
                    Error::Mismatch(_) => (self.rank(), true),
                    _ => (self.rank(), false),
                };
                self.bcast.failed = Some(Failed { seq: call.seq, blamed, mismatch });
            }
        }
        result
    }

    /// A `BCAST_*` header of broadcast `call`.
    fn bcast_header(&self, kind: Kind, call: &Call) -> Header {
        let mut header = self.header(kind, call.seq);
        header.dtype = call.dtype.code();
        header.count = call.count;
        header.nchunks = call.nchunks as u32;
        header
    }

    /// Sends `BCAST_ABORT(seq, blamed)` to each rank of `to`.
    fn send_bcast_abort(&mut self, seq: u32, blamed: usize, mismatch: bool, to: RankSet) -> Result<()> {
        let mut header = self.header(Kind::BcastAbort, seq);
        header.count = blamed as u32;
        if mismatch {
            header.flags |= FLAG_MISMATCH;
        }
        for _ in 0..ABORT_COPIES {
            for rank in to.iter() {
                self.queue_control(&header, rank)?;
            }
        }
        self.flush_queued()
    }

    /// Every rank but this one.
    fn others(&self) -> RankSet {
        let mut others = RankSet::default();
        (0..self.size()).filter(|&r| r != self.rank()).for_each(|r| others.insert(r));
        others
    }

    /// The error of a `BCAST_ABORT` of `seq` from `sender` blaming
    /// `blamed`, for a rank whose call is `call`.
    fn abort_error(&self, call: &Call, seq: u32, sender: usize, blamed: usize, mismatch: bool) -> Error {
        let which = if seq == call.seq {
            format!("broadcast #{seq}")
        } else {
            format!("broadcast #{} (broadcast #{seq}, which this rank had completed, failed)", call.seq)
        };
        if mismatch {
            Error::Mismatch(format!(
                "{which}: the ranks' calls disagree (rank {blamed} found it; rank {sender} said so); rank {} called with {}",
                self.rank(),
                call.describe()
            ))
        } else {
            Error::PeerFailed { rank: blamed, what: format!("{which}: rank {sender} gave up on it because rank {blamed} failed") }
        }
    }

    /// Whether a `BCAST_ABORT` of `seq` ends broadcast `call`: one of it, or
    /// of the broadcast before it when this rank completed that one (its
    /// root failed it afterwards, so this one cannot complete either).
    fn aborts(&self, call: &Call, seq: u32) -> bool {
        let previous = call.seq.wrapping_sub(1);
        seq == call.seq || (seq == previous && self.bcast.failed.is_none_or(|f| f.seq != previous))
    }

    // ----- root -----

    fn bcast_root(&mut self, buf: &[u8], call: &Call) -> Result<()> {
        self.bcast.window.start(self.size(), self.rank());
        if let Some(windows) = self.kernel_windows() {
            // Armed ahead to receive this broadcast, but this rank is its
            // root: if XDP placed chunks of it already, another rank thinks
            // it is the root too.
            if let Some(other) = windows.disarm_rx_landed(call.seq) {
                return Err(self.two_roots(call, other as usize));
            }
            windows.arm_tx(call.seq, call.nchunks as u32, self.size() as u32 - 1, KERNEL_TX_NOTIFY);
            self.arm_next(call);
        }
        let result = self.bcast_root_loop(buf, call);
        if let Some(windows) = self.kernel_windows() {
            windows.disarm_tx();
            if result.is_err() {
                windows.disarm_rx();
            }
        }
        result
    }

    /// Opens the receive window of the next broadcast (in the other phase)
    /// as this one starts: its root may send before this rank has returned
    /// from this one, even before this rank has been scheduled to copy out
    /// what XDP placed of this one.
    fn arm_next(&self, call: &Call) {
        if let Some(windows) = self.kernel_windows() {
            if call.seq.wrapping_add(1) != 0 {
                windows.arm_rx_ahead(call.seq.wrapping_add(1), self.rank() as u32, self.chunk as u32);
            }
        }
    }

    fn bcast_root_loop(&mut self, buf: &[u8], call: &Call) -> Result<()> {
        self.root_drain_early(call)?;
        let mut backoff = Backoff::new();
        loop {
            if !self.rx_pending() {
                self.resend_lost(buf, call)?;
                self.send_fresh(buf, call)?;
            }
            if self.bcast.window.base == call.nchunks {
                return Ok(());
            }
            if self.kernel_acks_complete(call) {
                continue;
            }
            if let Some(got) = self.recv_valid(backoff.due())? {
                if self.root_on(&got, call)? {
                    backoff = Backoff::new();
                }
            }
            let rto = backoff.rto();
            if backoff.fire() {
                // What the kernel folded reaches us as one group-ACK per
                // step; look at the send window before judging anyone.
                if self.mirror_kernel_acks(call) {
                    backoff = Backoff::new();
                    continue;
                }
                self.fail_silent_receivers(call)?;
                self.probe(buf, call, rto)?;
            }
        }
    }

    /// Chunks of this broadcast kept before it was called came from a rank
    /// that thinks it is root too.
    fn root_drain_early(&mut self, call: &Call) -> Result<()> {
        let early = (0..WINDOW_CHUNKS).find_map(|i| self.bcast.early.get(call.seq, i).map(|(h, _)| h));
        self.bcast.early.clear();
        match early {
            Some(header) => Err(self.two_roots(call, header.sender as usize)),
            None => Ok(()),
        }
    }

    /// Sends the chunks the window has room for, to every receiver.
    fn send_fresh(&mut self, buf: &[u8], call: &Call) -> Result<()> {
        let window = &self.bcast.window;
        if window.next >= call.nchunks || window.next >= window.base + WINDOW_CHUNKS {
            return Ok(());
        }
        let receivers = window.receivers;
        let mut header = self.bcast_header(Kind::BcastData, call);
        // On the kernel datapath each chunk leaves once, to the next rank,
        // and TC egress clones it to the others.
        let fanout = self.kernel_windows().is_some() && self.fanout_reaches_all();
        let mut first = RankSet::default();
        first.insert((self.rank() + 1) % self.size());
        if fanout {
            header.flags |= FLAG_FANOUT;
        }
        let now = Instant::now();
        while self.bcast.window.next < call.nchunks.min(self.bcast.window.base + WINDOW_CHUNKS) {
            let chunk = self.bcast.window.next;
            header.chunk = chunk as u32;
            if fanout {
                if let Some(windows) = self.kernel_windows() {
                    windows.prepare_tx(call.seq, chunk as u32);
                }
                self.queue_chunk(buf, &header, chunk, call, first)?;
                self.user_stats.bcast_chunks_sent += 1;
            } else {
                self.queue_chunk(buf, &header, chunk, call, receivers)?;
                self.user_stats.bcast_chunks_sent += receivers.len() as u64;
            }
            self.bcast.window.sent_fresh(now);
        }
        self.flush_chunks(buf)
    }

    /// Queues chunk `chunk` (its header `header`) to each rank of `to`,
    /// flushing whenever the batch fills.
    fn queue_chunk(&mut self, buf: &[u8], header: &Header, chunk: usize, call: &Call, to: RankSet) -> Result<()> {
        let bytes = chunk_bytes(chunk, call.bytes, self.chunk);
        for rank in to.iter() {
            if self.transport.queue(header, bytes.clone(), self.group.peers[rank].addr()) {
                self.flush_chunks(buf)?;
            }
        }
        Ok(())
    }

    /// Sends the queued chunks of `buf`.
    fn flush_chunks(&mut self, buf: &[u8]) -> Result<()> {
        let sent = self.transport.flush(buf)?;
        self.user_stats.packets_sent += sent as u64;
        Ok(())
    }

    /// Handles a datagram at the root; returns whether it was progress (a
    /// new acknowledgment).
    fn root_on(&mut self, got: &Received, call: &Call) -> Result<bool> {
        let header = got.header;
        let sender = header.sender as usize;
        match got.kind {
            Kind::BcastAck if header.seq == call.seq && header.flags & FLAG_GROUP != 0 => {
                self.user_stats.bcast_group_acks += 1;
                Ok(self.mirror_kernel_acks(call))
            }
            Kind::BcastAck if header.seq == call.seq => {
                // One chunk, or with RANGE the `count` chunks from `chunk`
                // on (TC ingress answers a super-chunk with one ACK).
                let first = header.chunk as usize;
                let n = if header.flags & FLAG_RANGE != 0 { header.count as usize } else { 1 };
                let end = first.saturating_add(n).min(call.nchunks);
                self.user_stats.bcast_acks_received += 1;
                self.bcast.window.last_heard[sender] = Instant::now();
                let mut news = false;
                for chunk in first..end {
                    if let Some(windows) = self.kernel_windows() {
                        // Keep the kernel's count whole: it wakes us when a
                        // step's chunks are held by all, user-space ACKs included.
                        windows.fold_tx(call.seq, chunk as u32, sender, self.size() as u32 - 1);
                    }
                    news |= self.bcast.window.acknowledge(chunk, header.op, sender);
                }
                if !news {
                    self.user_stats.duplicates += 1;
                }
                Ok(news)
            }
            Kind::BcastAbort if self.aborts(call, header.seq) => {
                let blamed = (header.count as usize).min(self.size() - 1);
                let mismatch = header.flags & FLAG_MISMATCH != 0;
                let error = if mismatch && header.seq == call.seq {
                    Error::Mismatch(format!(
                        "broadcast #{}: rank {blamed}'s call disagrees with the root's (rank {}: {})",
                        call.seq,
                        self.rank(),
                        call.describe()
                    ))
                } else {
                    self.abort_error(call, header.seq, sender, blamed, mismatch)
                };
                let mut tell = self.others();
                tell.remove(blamed);
                tell.remove(sender);
                self.send_bcast_abort(call.seq, blamed, mismatch, tell)?;
                Err(error)
            }
            Kind::BcastData if header.seq == call.seq => Err(self.two_roots(call, sender)),
            _ => {
                self.serve_stale(got)?;
                Ok(false)
            }
        }
    }

    /// Rank `other` sent chunks of this root's broadcast: it thinks it is
    /// the root too. Every rank is told; the error.
    fn two_roots(&mut self, call: &Call, other: usize) -> Error {
        let others = self.others();
        if let Err(e) = self.send_bcast_abort(call.seq, other, true, others) {
            tracing::warn!(error = %e, "telling the ranks that broadcast #{} is mismatched", call.seq);
        }
        Error::Mismatch(format!(
            "broadcast #{}: rank {other} sent data as root, but rank {} is the root of this rank's call ({})",
            call.seq,
            self.rank(),
            call.describe()
        ))
    }

    /// Fails the broadcast when a receiver that owes acknowledgments has
    /// been silent for the timeout, telling the others.
    fn fail_silent_receivers(&mut self, call: &Call) -> Result<()> {
        let now = Instant::now();
        let timeout = self.timeout();
        let window = &self.bcast.window;
        let mut silent = RankSet::default();
        for rank in window.owing().iter() {
            if now.duration_since(window.last_heard[rank]) >= timeout {
                silent.insert(rank);
            }
        }
        let Some(blamed) = silent.iter().next() else { return Ok(()) };
        let what = format!(
            "broadcast #{}: rank(s) {} acknowledged nothing for {} ms (rank {blamed} holds chunks 0..{} of {})",
            call.seq,
            silent.names(),
            timeout.as_millis(),
            window.first_missing(blamed),
            call.nchunks
        );
        for rank in silent.iter() {
            self.failed[rank] = true;
        }
        let mut tell = self.bcast.window.receivers;
        silent.iter().for_each(|r| {
            tell.remove(r);
        });
        self.send_bcast_abort(call.seq, blamed, false, tell)?;
        Err(Error::PeerFailed { rank: blamed, what })
    }

    /// Resends at once each chunk to the receivers it was lost to
    /// ([`Window::lost_to`]): no timer, the acknowledgments show the loss.
    fn resend_lost(&mut self, buf: &[u8], call: &Call) -> Result<()> {
        if self.bcast.window.news.is_empty() {
            return Ok(());
        }
        let now = Instant::now();
        for chunk in self.bcast.window.base..self.bcast.window.next {
            let lost = self.bcast.window.lost_to(chunk);
            if !lost.is_empty() {
                self.resend(buf, call, chunk, lost, now)?;
            }
        }
        self.bcast.window.news = RankSet::default();
        self.flush_chunks(buf)
    }

    /// The retransmission timer fired (no acknowledgment made progress for
    /// `rto`): resends to each receiver that owes acknowledgments its first
    /// missing chunk, unless that was sent less than `rto` ago. One probe
    /// per receiver, not the window: a receiver that is only slow gets one
    /// duplicate, and the acknowledgment of the probe shows everything
    /// older that it lacks ([`Comm::resend_lost`]).
    fn probe(&mut self, buf: &[u8], call: &Call, rto: Duration) -> Result<()> {
        let now = Instant::now();
        let mut unprobed = self.bcast.window.owing();
        let mut chunk = self.bcast.window.base;
        while !unprobed.is_empty() && chunk < self.bcast.window.next {
            let slot = *self.bcast.window.slot(chunk);
            let first_missing = slot.missing.and(unprobed);
            unprobed = unprobed.minus(first_missing);
            if !first_missing.is_empty() && now.duration_since(slot.sent_at) >= rto {
                self.resend(buf, call, chunk, first_missing, now)?;
            }
            chunk += 1;
        }
        self.flush_chunks(buf)
    }

    /// Queues `chunk` again, flagged `RETRANSMIT`, to each rank of `to`.
    fn resend(&mut self, buf: &[u8], call: &Call, chunk: usize, to: RankSet, now: Instant) -> Result<()> {
        let mut header = self.bcast_header(Kind::BcastData, call);
        header.flags |= FLAG_RETRANSMIT;
        header.chunk = chunk as u32;
        header.op = self.bcast.window.resent(chunk, now);
        self.queue_chunk(buf, &header, chunk, call, to)?;
        self.user_stats.retransmits += to.len() as u64;
        Ok(())
    }

    // ----- kernel datapath -----

    /// This communicator's kernel broadcast windows, when it runs the
    /// kernel datapath and got a control block.
    pub(crate) fn kernel_windows(&self) -> Option<&Windows> {
        windows_if(self.attachment.as_ref(), self.kernel_usable())
    }

    /// Whether the current broadcast runs on the kernel datapath's windows.
    /// Sequence number 0 (after 2^32 broadcasts) would match a slot tag
    /// never written: that broadcast runs in user space.
    fn kernel_usable(&self) -> bool {
        self.datapath() == Datapath::Kernel && self.bcast.seq != 0
    }

    /// Whether TC egress can fan out to every other rank: each is on this
    /// interface's subnet (its clone gets the rank's own MAC, so a rank
    /// behind a router would lose it) and on another host (a clone to this
    /// host's own address would leave on the wire and never come back).
    pub(crate) fn fanout_reaches_all(&self) -> bool {
        let me = self.iface().ipv4;
        self.peers().iter().filter(|p| p.rank != self.rank()).all(|p| p.ipv4 != me && self.iface().reaches(p.ipv4))
    }

    /// Everything is sent and the kernel folds the ACKs: look at the send
    /// window before sleeping on the socket. The fan-out, the placements
    /// and the folding of a small broadcast all run inside the root's send
    /// call (veth delivers in the sender's softirq), so the broadcast is
    /// usually complete by now. Returns whether every chunk is held by every
    /// receiver.
    fn kernel_acks_complete(&mut self, call: &Call) -> bool {
        let window = &self.bcast.window;
        if window.next != call.nchunks || self.rx_pending() {
            return false;
        }
        let Some(windows) = windows_if(self.attachment.as_ref(), self.kernel_usable()) else { return false };
        windows.tx_done() as usize >= call.nchunks && self.mirror_kernel_acks(call) && self.bcast.window.base == call.nchunks
    }

    /// Copies into the root's view what the XDP program folded into the
    /// send window: each receiver that holds a chunk it is still waiting
    /// for. Returns whether that was news.
    fn mirror_kernel_acks(&mut self, call: &Call) -> bool {
        // Borrows only the attachment, so the window state can be updated.
        let Some(windows) = windows_if(self.attachment.as_ref(), self.kernel_usable()) else { return false };
        let now = Instant::now();
        let mut news = false;
        let window = &mut self.bcast.window;
        let mut chunk = window.base;
        while chunk < window.next {
            let slot = window.slots[chunk % WINDOW_CHUNKS];
            // Which transmission reached it is not known: claim the first,
            // which proves the least (Slot::delivered).
            let tx = if slot.tx == 0 { 0 } else { u8::MAX };
            if slot.chunk == chunk && !slot.missing.is_empty() && windows.tx_tracks(call.seq, chunk as u32) {
                for rank in slot.missing.iter() {
                    if windows.tx_rank_holds(chunk as u32, rank) {
                        window.last_heard[rank] = now;
                        news |= window.acknowledge(chunk, tx, rank);
                    }
                }
            }
            chunk += 1;
        }
        news
    }

    /// Places in `buf` what the XDP program put in the receive window since
    /// the last look, and gives the window room beyond it. Returns whether
    /// anything new was placed.
    fn drain_kernel_window(&mut self, buf: &mut [u8], call: &Call) -> bool {
        let Some(windows) = windows_if(self.attachment.as_ref(), self.kernel_usable()) else { return false };
        // Armed ahead and not claimed yet: XDP placed nothing, and the
        // claim sets the credit. A claim made after this call was published
        // agrees with it (XDP checks); one made before, claim_for_call
        // checked.
        if !windows.rx_claimed(call.seq) {
            return false;
        }
        let state = &mut self.bcast;
        let mut placed_any = false;
        let end = call.nchunks.min(state.low + RX_WINDOW as usize);
        for chunk in state.low..end {
            if !state.placed.has(chunk) && windows.rx_holds(call.seq, chunk as u32) {
                windows.copy_rx(call.seq, chunk as u32, &mut buf[chunk_bytes(chunk, call.bytes, self.chunk)]);
                // Still that chunk after the copy (not retaken meanwhile)?
                if windows.rx_holds(call.seq, chunk as u32) {
                    state.placed.mark(chunk);
                    placed_any = true;
                }
            }
        }
        while state.low < call.nchunks && state.placed.has(state.low) {
            state.low += 1;
        }
        windows.set_rx_credit(call.seq, (state.low + RX_WINDOW as usize).min(u32::MAX as usize) as u32);
        if placed_any {
            self.user_stats.bcast_from_kernel += 1;
        }
        placed_any
    }

    // ----- receiver -----

    fn bcast_receive(&mut self, buf: &mut [u8], call: &Call) -> Result<()> {
        self.bcast.placed.start(call.nchunks);
        self.bcast.low = 0;
        let arm = RxArm {
            seq: call.seq,
            root: call.root as u32,
            rank: self.rank() as u32,
            nchunks: call.nchunks as u32,
            count: call.count,
            dtype: u32::from(call.dtype.code()),
            chunk_bytes: self.chunk as u32,
            last_bytes: chunk_bytes(call.nchunks - 1, call.bytes, self.chunk).len() as u32,
        };
        let claimed = self.kernel_windows().map(|w| w.claim_for_call(&arm));
        let result = match claimed {
            Some(Err((root, count, dtype))) => Err(self.claimed_mismatch(call, root as usize, count, dtype)),
            _ => {
                self.arm_next(call);
                self.bcast_receive_loop(buf, call)
            }
        };
        // On success this broadcast's phase stays armed, so XDP answers
        // late repeats of its chunks, until the one after next takes it.
        if result.is_err() {
            if let Some(windows) = self.kernel_windows() {
                windows.disarm_rx();
            }
        }
        result
    }

    /// The first chunk of this broadcast (placed by XDP while the window
    /// was armed ahead) came from a call that disagrees with this rank's:
    /// tell the sender and the root, and fail. Nothing of it reaches `buf`.
    fn claimed_mismatch(&mut self, call: &Call, sender: usize, count: u32, dtype: u32) -> Error {
        let mut tell = RankSet::default();
        tell.insert(sender.min(self.size() - 1));
        tell.insert(call.root);
        if let Err(e) = self.send_bcast_abort(call.seq, self.rank(), true, tell) {
            tracing::warn!(error = %e, "telling the root that broadcast #{} is mismatched", call.seq);
        }
        let theirs = Dtype::from_code(dtype as u8).map_or_else(|| format!("code {dtype}"), |d| d.to_string());
        Error::Mismatch(format!(
            "broadcast #{}: rank {sender} sent it as root with dtype {theirs}, count {count}; rank {} called with {}",
            call.seq,
            self.rank(),
            call.describe()
        ))
    }

    fn bcast_receive_loop(&mut self, buf: &mut [u8], call: &Call) -> Result<()> {
        self.receive_early(buf, call)?;
        // What XDP placed while the window was armed ahead (its notice may
        // have come while this rank was in another operation).
        if self.kernel_windows().is_some() {
            self.drain_kernel_window(buf, call);
        }
        let silence = self.timeout() + receiver_grace(self.timeout());
        let kernel = self.kernel_windows().is_some();
        let mut heard = Instant::now();
        while self.bcast.placed.remaining > 0 {
            // The kernel places chunks without waking us; look at the window
            // now and then in case a notice was coalesced away.
            let wake = if kernel { (heard + silence).min(Instant::now() + KERNEL_RX_LOOK) } else { heard + silence };
            match self.recv_valid(wake)? {
                Some(got) if got.kind == Kind::BcastLanded && got.header.seq == call.seq => {
                    self.user_stats.bcast_landed += 1;
                    self.drain_kernel_window(buf, call);
                    // XDP passed this chunk up instead of answering it; TC
                    // ingress answers it on the way up when it can.
                    if got.header.flags & FLAG_ANSWERED == 0 {
                        self.queue_ack(&got.header, call.root)?;
                    }
                    heard = Instant::now();
                }
                Some(got) if self.receiver_on(&got, buf, call)? => heard = Instant::now(),
                Some(_) => {}
                None if kernel && self.drain_kernel_window(buf, call) => heard = Instant::now(),
                None if Instant::now() >= heard + silence => {
                    return Err(Error::PeerFailed {
                        rank: call.root,
                        what: format!(
                            "broadcast #{}: nothing from the root for {} ms (rank {} holds {} of {} chunks)",
                            call.seq,
                            silence.as_millis(),
                            self.rank(),
                            call.nchunks - self.bcast.placed.remaining,
                            call.nchunks
                        ),
                    });
                }
                None => {}
            }
        }
        Ok(())
    }

    /// Takes the chunks of this broadcast that arrived before it was called.
    fn receive_early(&mut self, buf: &mut [u8], call: &Call) -> Result<()> {
        // Taken out (no allocation) so that its bytes can be read while the
        // communicator handles them.
        let mut early = std::mem::take(&mut self.bcast.early);
        let mut result = Ok(());
        for index in 0..WINDOW_CHUNKS {
            if let Some((header, payload)) = early.get(call.seq, index) {
                result = self.receive_data(&header, Source::Early(payload), buf, call).map(|_| ());
                if result.is_err() {
                    break;
                }
            }
        }
        early.clear();
        self.bcast.early = early;
        result
    }

    /// Handles a datagram at a receiver; returns whether it was from its
    /// broadcast's root.
    fn receiver_on(&mut self, got: &Received, buf: &mut [u8], call: &Call) -> Result<bool> {
        let header = got.header;
        match got.kind {
            Kind::BcastData if header.seq == call.seq => self.receive_data(&header, Source::Batch(got), buf, call),
            Kind::BcastAbort if self.aborts(call, header.seq) => {
                let blamed = (header.count as usize).min(self.size() - 1);
                let mismatch = header.flags & FLAG_MISMATCH != 0;
                Err(self.abort_error(call, header.seq, header.sender as usize, blamed, mismatch))
            }
            _ => {
                self.serve_stale(got)?;
                Ok(false)
            }
        }
    }

    /// Places (or counts as a duplicate) a `BCAST_DATA` of this broadcast
    /// and queues its acknowledgment; a mismatched one fails the broadcast.
    /// Returns whether it came from the root.
    fn receive_data(&mut self, header: &Header, source: Source<'_>, buf: &mut [u8], call: &Call) -> Result<bool> {
        let len = match source {
            Source::Batch(got) => self.payload(got).len(),
            Source::Early(payload) => payload.len(),
        };
        match judge(header, len, call, self.rank(), self.chunk, &self.bcast.placed) {
            Verdict::Fresh(index) => {
                let payload = match source {
                    Source::Batch(got) => self.payload(got),
                    Source::Early(payload) => payload,
                };
                buf[chunk_bytes(index, call.bytes, self.chunk)].copy_from_slice(payload);
                self.bcast.placed.mark(index);
                self.user_stats.bcast_placed_from_socket += 1;
                // On a kernel receiver, one fewer for XDP to place; if it
                // has placed the rest already, take them now.
                if self.kernel_windows().is_some_and(|w| w.placed_by_process(call.seq)) {
                    self.drain_kernel_window(buf, call);
                }
                self.queue_ack(header, call.root)?;
                Ok(true)
            }
            Verdict::Duplicate(_) => {
                self.user_stats.duplicates += 1;
                self.queue_ack(header, call.root)?;
                Ok(true)
            }
            Verdict::Malformed => {
                self.user_stats.dropped_malformed += 1;
                Ok(false)
            }
            Verdict::Mismatch(what) => {
                let mut tell = RankSet::default();
                tell.insert(header.sender as usize);
                tell.insert(call.root);
                self.send_bcast_abort(call.seq, self.rank(), true, tell)?;
                Err(Error::Mismatch(what))
            }
        }
    }

    /// Queues the `BCAST_ACK` of the `BCAST_DATA` `data` to `root`: its
    /// `seq` and `chunk`, and its `op` (the transmission's number) echoed.
    fn queue_ack(&mut self, data: &Header, root: usize) -> Result<()> {
        let mut header = self.header(Kind::BcastAck, data.seq);
        header.chunk = data.chunk;
        header.op = data.op;
        self.queue_control(&header, root)
    }

    // ----- between broadcasts -----

    /// `Comm::serve_stale` for the broadcast kinds, in any operation and
    /// while closing: a chunk of an earlier broadcast is acknowledged again
    /// (or answered with its abort, if this rank failed it); a chunk of the
    /// next broadcast is kept; late acknowledgments and aborts are dropped.
    /// Returns whether the datagram was one of these.
    pub(crate) fn serve_stale_bcast(&mut self, got: &Received) -> Result<bool> {
        let header = got.header;
        let sender = header.sender as usize;
        match got.kind {
            Kind::BcastData if header.seq == self.bcast.seq.wrapping_add(1) => {
                // The fields, not `Comm::payload`: `early` is borrowed too.
                let payload = match self.transport.datagram(got.slot) {
                    Some(datagram) => &datagram.bytes[HDR_LEN..],
                    None => &[],
                };
                if self.bcast.early.keep(&header, payload) == Kept::Duplicate {
                    self.user_stats.duplicates += 1;
                }
            }
            Kind::BcastData if seq_at_or_before(header.seq, self.bcast.seq) => {
                match self.bcast.failed.filter(|f| f.seq == header.seq) {
                    Some(failed) => {
                        let mut to = RankSet::default();
                        to.insert(sender);
                        self.send_bcast_abort(failed.seq, failed.blamed, failed.mismatch, to)?;
                    }
                    None => {
                        self.user_stats.duplicates += 1;
                        self.queue_ack(&header, sender)?;
                        self.flush_queued()?;
                    }
                }
            }
            // Later than the next broadcast: dropped, and resent.
            Kind::BcastData => {}
            Kind::BcastAck => self.user_stats.duplicates += 1,
            Kind::BcastAbort => {}
            // A landed notice of the broadcast armed ahead, arriving while
            // this rank is in another operation: what landed is taken when
            // that broadcast is called; its chunk is answered now if the
            // kernel could not.
            Kind::BcastLanded => {
                self.user_stats.bcast_landed += 1;
                if header.flags & FLAG_ANSWERED == 0 {
                    self.queue_ack(&header, sender)?;
                    self.flush_queued()?;
                }
            }
            _ => return Ok(false),
        }
        Ok(true)
    }
}

#[cfg(test)]
mod tests {
    use std::{
        net::{Ipv4Addr, SocketAddrV4, UdpSocket},
        thread,
    };

    use super::*;
    use crate::comm::testing::{loopback, ranks};
    use crate::{
        rendezvous::{self, GroupInfo, PeerInfo},
        Datapath, Status,
    };


    /// A buffer of `len` bytes from `seed` (xorshift).
    fn pattern(len: usize, seed: u64) -> Vec<u8> {
        let mut x = seed | 1;
        (0..len)
            .map(|_| {
                x ^= x << 13;
                x ^= x >> 7;
                x ^= x << 17;
                x as u8
            })
            .collect()
    }

    #[test]
    fn chunking_math() {
        assert_eq!(chunk_count(0, 1432), 1);
        assert_eq!(chunk_count(1, 1432), 1);
        assert_eq!(chunk_count(1432, 1432), 1);
        assert_eq!(chunk_count(1433, 1432), 2);
        assert_eq!(chunk_count(64 << 20, 1432), 46_864);
        assert_eq!(chunk_bytes(0, 0, 1432), 0..0);
        assert_eq!(chunk_bytes(0, 1433, 1432), 0..1432);
        assert_eq!(chunk_bytes(1, 1433, 1432), 1432..1433);
        assert_eq!(chunk_bytes(1, 1432, 1432), 1432..1432, "past the end: empty");
        // Every byte in exactly one chunk.
        for bytes in [0, 1, 1431, 1432, 1433, 5000, (1 << 20) + 7] {
            let n = chunk_count(bytes, 1432);
            let total: usize = (0..n).map(|c| chunk_bytes(c, bytes, 1432).len()).sum();
            assert_eq!(total, bytes);
            assert!((0..n).all(|c| c + 1 == n || chunk_bytes(c, bytes, 1432).len() == 1432));
        }
        assert_eq!(receiver_grace(Duration::from_secs(5)), Duration::from_millis(625));
        assert_eq!(receiver_grace(Duration::from_millis(300)), Duration::from_millis(200));
    }

    #[test]
    fn rank_sets() {
        let mut set = RankSet::default();
        for r in [0, 63, 64, 200, 255] {
            set.insert(r);
        }
        assert_eq!(set.iter().collect::<Vec<_>>(), [0, 63, 64, 200, 255]);
        assert_eq!(set.len(), 5);
        assert!(set.remove(64) && !set.remove(64));
        assert_eq!(set.names(), "0, 63, 200, 255");
    }

    #[test]
    fn window_tracks_each_receiver_and_advances() {
        let mut window = Window::new(4);
        window.start(4, 1);
        assert_eq!(window.receivers.iter().collect::<Vec<_>>(), [0, 2, 3]);
        let now = Instant::now();
        for _ in 0..3 {
            window.sent_fresh(now);
        }
        assert_eq!(window.next, 3);
        assert!(window.acknowledge(1, 0, 0));
        assert!(!window.acknowledge(1, 0, 0), "a duplicate is no news");
        assert!(!window.acknowledge(7, 0, 0), "never sent");
        for r in [0, 2, 3] {
            window.acknowledge(0, 0, r);
        }
        assert_eq!(window.base, 1);
        assert_eq!(window.owing().iter().collect::<Vec<_>>(), [0, 2, 3]);
        assert_eq!(window.first_missing(0), 2);
        window.acknowledge(1, 0, 2);
        window.acknowledge(1, 0, 3);
        assert_eq!(window.base, 2);
        assert!(!window.acknowledge(0, 0, 2), "complete already");
    }

    #[test]
    fn a_chunk_overtaken_by_a_later_one_is_lost() {
        let mut window = Window::new(3);
        window.start(3, 0);
        let now = Instant::now();
        for _ in 0..4 {
            window.sent_fresh(now);
        }
        // Rank 1 got chunks 0 and 2, not 1; rank 2 got chunk 0 only.
        window.acknowledge(0, 0, 1);
        window.acknowledge(2, 0, 1);
        window.acknowledge(0, 0, 2);
        assert_eq!(window.lost_to(1).iter().collect::<Vec<_>>(), [1]);
        assert!(window.lost_to(3).is_empty(), "sent after the last one acknowledged");
        // Sent again: not lost until something sent later arrives.
        assert_eq!(window.resent(1, now), 1);
        window.news = RankSet::default();
        assert!(window.lost_to(1).is_empty());
        // Chunk 3 sent again after chunk 1: an acknowledgment of that
        // transmission (echoing its number) shows chunk 1 lost again...
        assert_eq!(window.resent(3, now), 1);
        window.acknowledge(3, 1, 1);
        assert_eq!(window.lost_to(1).iter().collect::<Vec<_>>(), [1], "overtaken by chunk 3's second transmission");
        // ...one of its first transmission does not (it went out before).
        window.news = RankSet::default();
        window.resent(1, now);
        window.acknowledge(3, 0, 2);
        assert!(window.lost_to(1).is_empty(), "{:?}", window.lost_to(1));
    }

    #[test]
    fn early_chunks_are_kept_once_and_for_one_broadcast() {
        let mut early = Early::new(16);
        let mut header = Header::new(Kind::BcastData, 1, 2, 0, 5);
        header.chunk = 3;
        assert_eq!(early.keep(&header, b"abc"), Kept::Held);
        assert_eq!(early.keep(&header, b"abc"), Kept::Duplicate);
        header.chunk = WINDOW_CHUNKS as u32;
        assert_eq!(early.keep(&header, b"abc"), Kept::Dropped, "beyond one window");
        header.chunk = 0;
        assert_eq!(early.keep(&header, &[0; 17]), Kept::Dropped, "longer than a chunk");
        assert_eq!(early.get(5, 3).map(|(h, p)| (h.chunk, p.to_vec())), Some((3, b"abc".to_vec())));
        assert!(early.get(6, 3).is_none());
        header.seq = 6;
        assert_eq!(early.keep(&header, b"x"), Kept::Held);
        assert!(early.get(5, 3).is_none(), "another broadcast replaced it");
    }

    /// Runs `f(rank, comm)` on `n` loopback ranks, each in its thread.

    #[test]
    fn broadcasts_of_every_size_from_every_root() {
        let n = 4;
        let results = ranks(n, 29_631, 10_000, move |rank, comm| {
            let chunk = comm.chunk_size();
            assert_eq!(chunk, crate::wire::CHUNK_MAX, "lo's MTU is large");
            let sizes = [0, 1, chunk - 1, chunk, chunk + 1, 300 * chunk + 5];
            for (i, &size) in sizes.iter().enumerate() {
                for root in 0..n {
                    let seed = (i * 16 + root) as u64 + 1;
                    let mut buf = if rank == root { pattern(size, seed) } else { vec![0xee; size] };
                    comm.broadcast(&mut buf, Dtype::U8, root).unwrap();
                    assert!(buf == pattern(size, seed), "rank {rank}: size {size} from {root}");
                }
            }
            let mut typed = if rank == 2 { vec![1.5f64, -2.0, 3.25] } else { vec![0.0; 3] };
            comm.broadcast_slice(&mut typed, 2).unwrap();
            assert_eq!(typed, [1.5, -2.0, 3.25]);
            comm.stats().unwrap().user
        });
        for (rank, stats) in results.iter().enumerate() {
            assert_eq!(stats.broadcasts, 6 * n as u64 + 1, "rank {rank}");
        }
        // Each root sent each chunk once to each other rank, at least.
        let sent: u64 = results.iter().map(|s| s.bcast_chunks_sent).sum();
        let chunks: u64 = [1u64, 1, 1, 1, 2, 301].iter().sum::<u64>() * n as u64 + 1;
        assert_eq!(sent, chunks * (n as u64 - 1));
        let acks: u64 = results.iter().map(|s| s.bcast_acks_received).sum();
        assert!(acks >= sent, "{acks} acknowledgments for {sent} chunks");
    }

    #[test]
    fn arguments_are_checked_before_anything_is_sent() {
        ranks(2, 29_632, 2000, |rank, comm| {
            let before = comm.stats().unwrap().user.packets_sent;
            let mut buf = [0u8; 6];
            let err = comm.broadcast(&mut buf, Dtype::U8, 2).unwrap_err();
            assert_eq!(err.status(), Status::InvalidArgument);
            assert!(err.to_string().contains("root 2 is not a rank of this group of 2"), "{err}");
            let err = comm.broadcast(&mut buf, Dtype::U32, 0).unwrap_err();
            assert!(err.to_string().contains("not a whole number of u32 elements"), "{err}");
            assert_eq!(comm.stats().unwrap().user.packets_sent, before, "nothing sent");
            assert_eq!(comm.bcast.seq, 0, "a refused call is no broadcast");
            // The group is still in step.
            let mut buf = if rank == 1 { [7u8; 6] } else { [0; 6] };
            comm.broadcast(&mut buf, Dtype::U8, 1).unwrap();
            assert_eq!(buf, [7; 6]);
            assert_eq!(comm.bcast.seq, 1);
        });
    }

    /// A fake rank: a socket that joined the group by rendezvous, driven by
    /// hand to send what no real rank would.
    struct Fake {
        socket: UdpSocket,
        group: GroupInfo,
        rank: usize,
    }

    impl Fake {
        fn join(rank: usize, n: usize, port: u16) -> Fake {
            let socket = UdpSocket::bind((Ipv4Addr::LOCALHOST, 0)).unwrap();
            socket.set_read_timeout(Some(Duration::from_millis(100))).unwrap();
            let me = PeerInfo {
                rank,
                ipv4: Ipv4Addr::LOCALHOST,
                mac: [0; 6],
                port: socket.local_addr().unwrap().port(),
                datapath: Datapath::User,
                mtu: 65536,
            };
            let group = rendezvous::rendezvous(&loopback(rank, n, port, 5000), me).unwrap();
            Fake { socket, group, rank }
        }

        fn header(&self, kind: Kind, seq: u32) -> Header {
            Header::new(kind, self.group.group, self.group.token, self.rank as u16, seq)
        }

        fn send(&self, header: &Header, payload: &[u8], to: usize) {
            let mut datagram = vec![0; HDR_LEN + payload.len()];
            header.write_to(&mut datagram);
            datagram[HDR_LEN..].copy_from_slice(payload);
            let addr: SocketAddrV4 = self.group.peers[to].addr();
            self.socket.send_to(&datagram, addr).unwrap();
        }

        /// Chunk `chunk` of a u8 broadcast `seq` of `data`.
        fn chunk(&self, seq: u32, data: &[u8], chunk: usize, to: usize) {
            let size = crate::wire::CHUNK_MAX;
            let mut header = self.header(Kind::BcastData, seq);
            header.count = data.len() as u32;
            header.nchunks = chunk_count(data.len(), size) as u32;
            header.chunk = chunk as u32;
            self.send(&header, &data[chunk_bytes(chunk, data.len(), size)], to);
        }

        /// The next datagram's header and kind, if one comes within 100 ms.
        fn recv(&self) -> Option<(Header, Kind)> {
            let mut buf = [0u8; 65536];
            let (len, _) = self.socket.recv_from(&mut buf).ok()?;
            Header::read_from(&buf[..len]).ok()
        }

        /// The chunks acknowledged for broadcast `seq` in the next 200 ms
        /// (other datagrams are dropped).
        fn acks(&self, seq: u32) -> Vec<u32> {
            let until = Instant::now() + Duration::from_millis(200);
            std::iter::from_fn(|| (Instant::now() < until).then(|| self.recv()))
                .flatten()
                .filter(|(h, k)| *k == Kind::BcastAck && h.seq == seq)
                .map(|(h, _)| h.chunk)
                .collect()
        }

        /// Plays rank 0 while `ranks` close: acknowledges each one's CLOSE.
        fn serve_close(&self, ranks: &[usize]) {
            let mut left = ranks.to_vec();
            let deadline = Instant::now() + Duration::from_secs(5);
            while !left.is_empty() && Instant::now() < deadline {
                if let Some((header, Kind::Close)) = self.recv() {
                    left.retain(|r| *r != header.sender as usize);
                    self.send(&self.header(Kind::CloseAck, 0), &[], header.sender as usize);
                }
            }
        }
    }

    #[test]
    fn receiver_dedupes_reorders_and_keeps_the_next_broadcast() {
        let port = 29_633;
        let receiver = thread::spawn(move || {
            let mut comm = Comm::new(loopback(1, 2, port, 5000)).unwrap();
            let mut first = vec![0u8; 3 * crate::wire::CHUNK_MAX];
            comm.broadcast(&mut first, Dtype::U8, 0).unwrap();
            // Barrier: chunks of broadcast #2 arrive meanwhile, and a stale
            // chunk of #1 is acknowledged again.
            comm.barrier().unwrap();
            let mut second = vec![0u8; 10];
            comm.broadcast(&mut second, Dtype::U8, 0).unwrap();
            (first, second, comm.stats().unwrap().user)
        });
        let fake = Fake::join(0, 2, port);
        let data = pattern(3 * crate::wire::CHUNK_MAX, 9);
        // Out of order, with duplicates.
        for chunk in [2, 0, 2, 1, 0] {
            fake.chunk(1, &data, chunk, 1);
        }
        let mut acks = fake.acks(1);
        acks.sort();
        assert_eq!(acks, [0, 0, 1, 2, 2], "every copy acknowledged");
        // Broadcast #2 early, then a stale #1 chunk, during the barrier.
        let second = pattern(10, 4);
        fake.chunk(2, &second, 0, 1);
        fake.chunk(2, &second, 0, 1);
        fake.chunk(1, &data, 1, 1);
        assert_eq!(fake.acks(1), [1], "the stale chunk, acknowledged again");
        assert!(fake.acks(2).is_empty(), "#2 is not called yet");
        fake.send(&fake.header(Kind::BarrierRelease, 1), &[], 1);
        assert_eq!(fake.acks(2), [0], "the early chunk, acknowledged when #2 is called");
        fake.serve_close(&[1]);
        let (first, got, stats) = receiver.join().unwrap();
        assert!(first == data);
        assert_eq!(got, second);
        assert_eq!(stats.broadcasts, 2);
        assert_eq!(stats.duplicates, 4, "2 repeats, 1 early repeat, 1 stale");
    }

    #[test]
    fn mismatched_calls_fail_and_nothing_is_placed() {
        let port = 29_634;
        let receiver = thread::spawn(move || {
            let mut comm = Comm::new(loopback(1, 3, port, 5000)).unwrap();
            let mut buf = vec![0u8; 100];
            let err = comm.broadcast(&mut buf, Dtype::U8, 0).unwrap_err();
            (err, buf)
        });
        let other = thread::spawn(move || {
            let mut comm = Comm::new(loopback(2, 3, port, 5000)).unwrap();
            let mut buf = vec![0u8; 100];
            comm.broadcast(&mut buf, Dtype::U8, 0).unwrap_err()
        });
        let fake = Fake::join(0, 3, port);
        // The root's call has 99 elements; rank 1's 100.
        fake.chunk(1, &pattern(99, 3), 0, 1);
        let abort = std::iter::from_fn(|| fake.recv()).find(|(_, k)| *k == Kind::BcastAbort).expect("abort");
        assert_eq!((abort.0.seq, abort.0.count, abort.0.flags & FLAG_MISMATCH), (1, 1, FLAG_MISMATCH));
        // The root tells the others (as a real root would).
        let mut header = fake.header(Kind::BcastAbort, 1);
        header.flags = FLAG_MISMATCH;
        header.count = 1;
        fake.send(&header, &[], 2);
        fake.serve_close(&[1, 2]);
        let (err, buf) = receiver.join().unwrap();
        assert_eq!(err.status(), Status::InvalidArgument);
        assert!(
            err.to_string().contains("broadcast #1: rank 1 called with root 0, dtype u8, count 100; the root (rank 0) with dtype u8, count 99"),
            "{err}"
        );
        assert!(buf.iter().all(|b| *b == 0), "nothing placed");
        let err = other.join().unwrap();
        assert!(matches!(err, Error::Mismatch(_)), "{err}");
        assert!(err.to_string().contains("rank 1 found it"), "{err}");
    }

    #[test]
    fn mismatched_roots_and_counts_fail_every_rank() {
        // Large enough that no receiver completes before the abort (more
        // chunks than one window).
        let size = (WINDOW_CHUNKS + 10) * crate::wire::CHUNK_MAX;
        for (case, port) in [("root", 29_635), ("count", 29_636)] {
            let results = ranks(4, port, 5000, move |rank, comm| {
                let (len, root) = match (case, rank) {
                    ("root", 3) => (size, 3),
                    ("count", 3) => (size + 1, 0),
                    _ => (size, 0),
                };
                let mut buf = vec![rank as u8; len];
                let err = comm.broadcast(&mut buf, Dtype::U8, root).unwrap_err();
                // The communicator stays usable: the next call works.
                let mut next = if rank == 0 { vec![5u8; 3] } else { vec![0; 3] };
                comm.broadcast(&mut next, Dtype::U8, 0).unwrap();
                assert_eq!(next, [5, 5, 5]);
                err
            });
            for (rank, err) in results.iter().enumerate() {
                assert!(matches!(err, Error::Mismatch(_)), "{case}: rank {rank}: {err}");
                assert_eq!(err.status(), Status::InvalidArgument);
            }
        }
    }

    /// A mismatched broadcast that fits in one window: receivers whose call
    /// agrees may complete it before the root learns of the mismatch; their
    /// next broadcast fails instead, on the root's abort. Nobody waits for a
    /// timeout.
    #[test]
    fn a_small_mismatch_fails_the_next_call_of_those_that_completed() {
        let start = Instant::now();
        let results = ranks(4, 29_639, 5000, |rank, comm| {
            let mut first = vec![rank as u8; if rank == 3 { 11 } else { 10 }];
            let first = comm.broadcast(&mut first, Dtype::U8, 0);
            let mut second = [0u8; 4];
            let second = if first.is_ok() { comm.broadcast(&mut second, Dtype::U8, 0) } else { Ok(()) };
            (first, second)
        });
        for (rank, (first, second)) in results.iter().enumerate() {
            let error = first.as_ref().err().or(second.as_ref().err());
            assert!(matches!(error, Some(Error::Mismatch(_))), "rank {rank}: {first:?} then {second:?}");
        }
        assert!(matches!(&results[0].0, Err(Error::Mismatch(_))), "the root fails the mismatched call itself");
        assert!(start.elapsed() < Duration::from_secs(3), "{:?}", start.elapsed());
    }

    #[test]
    fn a_dead_receiver_is_named_by_every_survivor() {
        let results = ranks(3, 29_637, 400, |rank, comm| {
            let mut warmup = [0u8; 4];
            comm.broadcast(&mut warmup, Dtype::U8, 0).unwrap();
            if rank == 2 {
                // Dies: never calls broadcast #2, leaves without closing.
                std::mem::forget(std::mem::replace(comm, Comm::new(loopback(0, 1, 29_699, 400)).unwrap()));
                return None;
            }
            let start = Instant::now();
            // More than a window: rank 1 cannot complete without rank 2.
            let mut buf = vec![1u8; 2 << 20];
            let err = comm.broadcast(&mut buf, Dtype::U8, 0).unwrap_err();
            Some((err, start.elapsed()))
        });
        for (rank, result) in results.into_iter().enumerate().take(2) {
            let (err, elapsed) = result.unwrap();
            assert!(matches!(err, Error::PeerFailed { rank: 2, .. }), "rank {rank}: {err}");
            assert!(elapsed < Duration::from_millis(400 + 300), "rank {rank} took {elapsed:?}");
        }
    }

    #[test]
    fn a_dead_root_is_named_after_the_timeout() {
        let results = ranks(3, 29_638, 300, |rank, comm| {
            if rank == 0 {
                std::mem::forget(std::mem::replace(comm, Comm::new(loopback(0, 1, 29_698, 300)).unwrap()));
                return None;
            }
            let start = Instant::now();
            let mut buf = vec![0u8; 10];
            let err = comm.broadcast(&mut buf, Dtype::U8, 0).unwrap_err();
            Some((err, start.elapsed()))
        });
        for result in results.into_iter().skip(1) {
            let (err, elapsed) = result.unwrap();
            assert!(matches!(err, Error::PeerFailed { rank: 0, .. }), "{err}");
            assert!(err.to_string().contains("nothing from the root for 500 ms"), "{err}");
            assert!(elapsed >= Duration::from_millis(500) && elapsed < Duration::from_secs(2), "{elapsed:?}");
        }
    }
}
