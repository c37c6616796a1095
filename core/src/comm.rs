//! The communicator: a group of ranks that run collectives together.
//!
//! A communicator owns one UDP socket (its [`Transport`]), the group made by
//! [`rendezvous`], and, on the kernel datapath, its share of the
//! [`Attachment`] of the BPF programs on its interface. Every collective is a
//! method (`barrier.rs` holds the barrier, `broadcast.rs` the broadcast);
//! they share the validated, batched receive of `Comm::recv_valid`, the
//! answers to late datagrams of finished operations of `Comm::serve_stale`,
//! and the retransmission timer of `Backoff`.

use std::{
    net::SocketAddrV4,
    time::{Duration, Instant},
};

use crate::{
    agree::AgreeState,
    broadcast::BcastState,
    kv::KvState,
    reduce::ReduceState,
    loader::Attachment,
    netif::{self, Interface},
    rendezvous::{self, GroupInfo, PeerInfo},
    stats::{KernelStats, UserStats},
    transport::Transport,
    window::Arrival,
    wire::{self, seq_at_or_before, Header, Kind, HDR_LEN},
    Config, Datapath, Error, Result, Stats,
};

/// First retransmission timeout of a control message.
const RTO_INITIAL: Duration = Duration::from_millis(1);
/// Largest retransmission timeout.
const RTO_MAX: Duration = Duration::from_millis(50);
/// How long rank 0 keeps answering after every rank said it closed, for a
/// rank whose acknowledgment was lost.
const CLOSE_LINGER: Duration = Duration::from_millis(50);
/// Largest gap between repeats of CLOSE: well inside [`CLOSE_LINGER`], so a
/// rank whose acknowledgment was lost asks again while rank 0 still listens.
const CLOSE_RTO_MAX: Duration = Duration::from_millis(10);
/// How long a rank tries to close with a rank 0 that an operation already
/// found unresponsive.
const CLOSE_SUSPECT_WAIT: Duration = Duration::from_millis(500);

/// How much longer than the timeout a rank waits for a silent peer that may
/// itself be waiting for someone (a broadcast's root, a chunk's owner)
/// before blaming it: that peer blames the dead rank after the timeout, and
/// its abort must reach the others before they give up on it.
pub(crate) fn receiver_grace(timeout: Duration) -> Duration {
    (timeout / 8).clamp(Duration::from_millis(200), Duration::from_secs(2))
}

/// Exponential retransmission timer: 1 ms, 2 ms, 4 ms, … up to 50 ms.
pub(crate) struct Backoff {
    rto: Duration,
    max: Duration,
    next: Instant,
}

impl Backoff {
    pub(crate) fn new() -> Backoff {
        Backoff::with_max(RTO_MAX)
    }

    pub(crate) fn with_max(max: Duration) -> Backoff {
        Backoff::starting(RTO_INITIAL, max)
    }

    /// A timer whose first timeout is `initial`, doubling up to `max`.
    pub(crate) fn starting(initial: Duration, max: Duration) -> Backoff {
        Backoff { rto: initial, max, next: Instant::now() + initial }
    }

    /// When the next retransmission is due.
    pub(crate) fn due(&self) -> Instant {
        self.next
    }

    /// The current timeout: how long the timer waits before it fires next.
    pub(crate) fn rto(&self) -> Duration {
        self.rto
    }

    /// Whether it is due now; if so, schedules the next one further out.
    pub(crate) fn fire(&mut self) -> bool {
        let now = Instant::now();
        if now < self.next {
            return false;
        }
        self.rto = (self.rto * 2).min(self.max);
        self.next = now + self.rto;
        true
    }
}

/// A validated datagram of this group, as [`Comm::recv_valid`] returns it.
/// Its bytes are `Comm::payload` until the next receive.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Received {
    pub(crate) header: Header,
    pub(crate) kind: Kind,
    /// Its slot in the transport's receive batch.
    pub(crate) slot: usize,
}

/// A member of a group of ranks. Not `Sync`: one thread at a time runs
/// collectives on a communicator (as in NCCL and MPI); it may move between
/// threads.
pub struct Comm {
    pub(crate) config: Config,
    pub(crate) group: GroupInfo,
    pub(crate) transport: Transport,
    iface: Interface,
    datapath: Datapath,
    datapath_reason: Option<String>,
    pub(crate) attachment: Option<Attachment>,
    pub(crate) user_stats: UserStats,
    /// Datagrams of the transport's receive batch, and the next to read.
    rx_len: usize,
    rx_next: usize,
    /// The group's chunk size (docs/BROADCAST.md): from the smallest MTU.
    pub(crate) chunk: usize,
    /// What broadcast keeps between calls.
    pub(crate) bcast: BcastState,
    /// What the reductions keep between calls.
    pub(crate) red: ReduceState,
    /// What key-value reduce keeps between calls (and its open operation).
    pub(crate) kv: KvState,
    /// What agreement keeps between calls.
    pub(crate) agree: AgreeState,
    /// Sequence number of the last barrier entered.
    pub(crate) barrier_seq: u32,
    /// Sequence number of the last barrier rank 0 completed (released).
    pub(crate) barrier_done: u32,
    /// The last barrier rank 0 gave up on, and the rank it blamed.
    pub(crate) barrier_aborted: Option<(u32, usize)>,
    /// Scratch bitmap of ranks heard from, reused by every operation.
    pub(crate) heard: Vec<bool>,
    /// Ranks that said they closed their communicator.
    pub(crate) closed: Vec<bool>,
    /// Ranks that an operation found dead.
    pub(crate) failed: Vec<bool>,
    /// Longest wait for the others when closing, if shorter than the
    /// timeout: set by an agreement, after which ranks may be gone for good
    /// or restarting (docs/AGREEMENT.md).
    pub(crate) close_wait: Option<Duration>,
}

impl Comm {
    /// Joins the group described by `config`: chooses the interface, binds
    /// the UDP port, sets up the datapath and rendezvouses with every rank.
    pub fn new(config: Config) -> Result<Comm> {
        config.validate()?;
        let iface = netif::choose(config.iface.as_deref(), config.master_addr)?;
        let transport = Transport::bind(iface.ipv4, config.port)?;
        let port = transport.local_addr().port();

        let (datapath, datapath_reason, mut attachment) = match config.datapath {
            Datapath::User => (Datapath::User, None, None),
            requested => match Self::kernel_attachment(&iface, port) {
                Ok(attachment) => {
                    let hooks = attachment.hooks();
                    let what = if hooks.has_xdp() {
                        "every collective has its kernel half, XDP first"
                    } else {
                        "every collective has its kernel half, TC first"
                    };
                    let reason = format!(
                        "the kernel datapath on {}, {} hooks ({}): {what}",
                        iface.name,
                        hooks.name(),
                        attachment.hooks_reason()
                    );
                    (Datapath::Kernel, Some(reason), Some(attachment))
                }
                Err(why) if requested == Datapath::Kernel => {
                    return Err(Error::Unsupported(format!(
                        "AGGBOX_DATAPATH=kernel on {}: {why}",
                        iface.name
                    )))
                }
                Err(why) => {
                    let reason = format!("auto chose the user datapath on {}: {why}", iface.name);
                    tracing::warn!("{reason}");
                    (Datapath::User, Some(reason), None)
                }
            },
        };

        let me = PeerInfo { rank: config.rank, ipv4: iface.ipv4, mac: iface.mac, port, datapath, mtu: iface.mtu };
        // The group is registered in the kernel maps before anyone sends.
        let group = rendezvous::rendezvous_with(&config, me, |group| match attachment.as_mut() {
            Some(attachment) => attachment.register_group(group),
            None => Ok(()),
        })?;
        let n = config.world_size;
        let chunk = wire::chunk_size(group.peers.iter().map(|p| p.mtu).min().unwrap_or(iface.mtu));
        tracing::info!(
            rank = config.rank,
            size = n,
            datapath = datapath.name(),
            iface = %iface.name,
            addr = %transport.local_addr(),
            "communicator ready"
        );
        let comm = Comm {
            config,
            group,
            transport,
            iface,
            datapath,
            datapath_reason,
            attachment,
            user_stats: UserStats::default(),
            rx_len: 0,
            rx_next: 0,
            chunk,
            bcast: BcastState::new(n, chunk),
            red: ReduceState::new(n),
            kv: KvState::new(n),
            agree: AgreeState::default(),
            barrier_seq: 0,
            barrier_done: 0,
            barrier_aborted: None,
            heard: vec![false; n],
            closed: vec![false; n],
            failed: vec![false; n],
            close_wait: None,
        };
        // The first broadcast's root may send before this rank calls it,
        // and the first barrier's arrivals may come before rank 0 enters.
        if let Some(windows) = comm.attachment.as_ref().and_then(|a| a.windows()).filter(|_| datapath == Datapath::Kernel) {
            windows.arm_rx_ahead(1, comm.rank() as u32, chunk as u32);
            if comm.rank() == 0 && n > 1 {
                windows.arm_barrier(n as u32);
            }
        }
        Ok(comm)
    }

    fn kernel_attachment(iface: &Interface, port: u16) -> Result<Attachment, String> {
        if iface.is_loopback() {
            return Err(format!(
                "{} is a loopback interface; the kernel datapath attaches only to a host's network interface",
                iface.name
            ));
        }
        Attachment::acquire(iface, port).map_err(|e| e.to_string())
    }

    /// [`Comm::new`] with [`Config::from_env`].
    pub fn from_env() -> Result<Comm> {
        Comm::new(Config::from_env()?)
    }

    /// This rank.
    pub fn rank(&self) -> usize {
        self.config.rank
    }

    /// Number of ranks.
    pub fn size(&self) -> usize {
        self.config.world_size
    }

    /// The datapath really in use (never `Auto`).
    pub fn datapath(&self) -> Datapath {
        self.datapath
    }

    /// Why the communicator is on its datapath: on the kernel datapath, its
    /// hooks and why; when `Auto` fell back to the user datapath, why. `None`
    /// when the user datapath was asked for.
    pub fn datapath_reason(&self) -> Option<&str> {
        self.datapath_reason.as_deref()
    }

    /// The interface in use.
    pub fn iface(&self) -> &Interface {
        &self.iface
    }

    /// This rank's UDP endpoint.
    pub fn local_addr(&self) -> SocketAddrV4 {
        self.transport.local_addr()
    }

    /// The group as rendezvous made it: its id, token and members.
    pub fn group_info(&self) -> &GroupInfo {
        &self.group
    }

    /// Every rank's address, port and datapath, as rendezvous made them.
    pub fn peers(&self) -> &[PeerInfo] {
        &self.group.peers
    }

    /// The share of the BPF attachment, on the kernel datapath.
    pub fn attachment(&self) -> Option<&Attachment> {
        self.attachment.as_ref()
    }

    /// The timeout of every operation.
    pub fn timeout(&self) -> Duration {
        self.config.timeout
    }

    /// The group's chunk size: the payload bytes of one broadcast datagram,
    /// from the smallest MTU of any rank (docs/BROADCAST.md).
    pub fn chunk_size(&self) -> usize {
        self.chunk
    }

    /// A snapshot of the counters.
    pub fn stats(&self) -> Result<Stats> {
        let kernel = match &self.attachment {
            Some(attachment) => attachment.kernel_stats()?,
            None => KernelStats::default(),
        };
        let user = UserStats { syscalls: self.transport.syscalls(), socket_waits: self.transport.waits(), ..self.user_stats };
        Ok(Stats { datapath: self.datapath, user, kernel })
    }

    /// UDP GSO super-packets this communicator sent, and the datagrams
    /// they carried (see [`crate::transport`]).
    pub fn gso_sends(&self) -> (u64, u64) {
        self.transport.gso_sends()
    }

    /// UDP GRO super-packets this communicator's socket received whole, and
    /// the datagrams they held (see [`crate::transport`]).
    pub fn gro_receives(&self) -> (u64, u64) {
        self.transport.gro_receives()
    }

    /// A header of this group from this rank.
    pub(crate) fn header(&self, kind: Kind, seq: u32) -> Header {
        Header::new(kind, self.group.group, self.group.token, self.config.rank as u16, seq)
    }

    /// Sends a header-only datagram to `rank`.
    pub(crate) fn send_control(&mut self, kind: Kind, seq: u32, rank: usize, retransmit: bool) -> Result<()> {
        let mut header = self.header(kind, seq);
        if retransmit {
            header.flags |= crate::wire::FLAG_RETRANSMIT;
            self.user_stats.retransmits += 1;
        }
        let mut datagram = [0u8; HDR_LEN];
        header.write_to(&mut datagram);
        self.transport.send(&datagram, self.group.peers[rank].addr())?;
        self.user_stats.packets_sent += 1;
        Ok(())
    }

    /// Receives the next datagram of this group until `deadline`. Malformed
    /// datagrams and datagrams of other groups or from non-members are
    /// dropped and counted (the user-space twin of the XDP checks).
    ///
    /// Datagrams come from the transport's receive batch, refilled with one
    /// `recvmmsg` when it is used up. Before sleeping for more, it sends
    /// what is queued on the transport (batched acknowledgments): after
    /// draining what the socket holds.
    pub(crate) fn recv_valid(&mut self, deadline: Instant) -> Result<Option<Received>> {
        loop {
            if self.rx_next == self.rx_len && !self.refill(deadline)? {
                return Ok(None);
            }
            let slot = self.rx_next;
            self.rx_next += 1;
            match self.validate(slot) {
                Some(received) => return Ok(Some(received)),
                // A stream of strays must not stretch the deadline.
                None if Instant::now() >= deadline => return Ok(None),
                None => {}
            }
        }
    }

    /// Whether datagrams of the last receive batch are still unread.
    pub(crate) fn rx_pending(&self) -> bool {
        self.rx_next < self.rx_len
    }

    /// Refills the receive batch, waiting until `deadline` at most; returns
    /// whether it holds datagrams.
    fn refill(&mut self, deadline: Instant) -> Result<bool> {
        loop {
            self.rx_next = 0;
            self.rx_len = self.transport.recv_batch()?;
            if self.rx_len > 0 {
                self.user_stats.packets_received += self.rx_len as u64;
                return Ok(true);
            }
            self.flush_queued()?;
            if !self.transport.wait_readable(deadline)? && Instant::now() >= deadline {
                return Ok(false);
            }
        }
    }

    /// Checks datagram `slot` of the receive batch: a well-formed datagram
    /// of this group from the member it claims to be, or dropped (counted).
    fn validate(&mut self, slot: usize) -> Option<Received> {
        let Some(datagram) = self.transport.datagram(slot) else {
            self.user_stats.dropped_foreign += 1;
            return None;
        };
        let (header, kind) = match Header::read_from(datagram.bytes) {
            Ok(parsed) if !datagram.truncated => parsed,
            _ => {
                self.user_stats.dropped_malformed += 1;
                return None;
            }
        };
        let sender = header.sender as usize;
        let member = header.group == self.group.group
            && header.token == self.group.token
            && sender < self.group.peers.len()
            && self.group.peers[sender].addr() == datagram.from;
        if !member {
            self.user_stats.dropped_foreign += 1;
            return None;
        }
        if kind == Kind::BcastData {
            self.user_stats.bcast_chunks_received += 1;
        }
        Some(Received { header, kind, slot })
    }

    /// The bytes after the header of `got`, a datagram of the current
    /// receive batch.
    pub(crate) fn payload(&self, got: &Received) -> &[u8] {
        match self.transport.datagram(got.slot) {
            Some(datagram) => &datagram.bytes[HDR_LEN..],
            None => &[],
        }
    }

    /// Queues a header-only datagram to `rank` on the transport (sent by
    /// [`Comm::flush_queued`], or when the batch fills).
    pub(crate) fn queue_control(&mut self, header: &Header, rank: usize) -> Result<()> {
        if self.transport.queue(header, 0..0, self.group.peers[rank].addr()) {
            self.flush_queued()?;
        }
        Ok(())
    }

    /// Sends what is queued on the transport (header-only datagrams).
    pub(crate) fn flush_queued(&mut self) -> Result<()> {
        let sent = self.transport.flush(&[])?;
        self.user_stats.packets_sent += sent as u64;
        Ok(())
    }

    /// Answers a datagram that belongs to an operation this rank already
    /// finished (a peer lost our answer and asked again). Returns whether it
    /// was such a datagram.
    pub(crate) fn serve_stale(&mut self, got: &Received) -> Result<bool> {
        let sender = got.header.sender as usize;
        match got.kind {
            Kind::BarrierArrive if self.rank() == 0 && seq_at_or_before(got.header.seq, self.barrier_done) => {
                self.user_stats.duplicates += 1;
                self.send_control(Kind::BarrierRelease, got.header.seq, sender, true)?;
                Ok(true)
            }
            Kind::BarrierArrive if self.rank() == 0 => match self.barrier_aborted {
                Some((seq, blamed)) if seq == got.header.seq => {
                    self.send_abort(seq, blamed, sender)?;
                    Ok(true)
                }
                // An arrival at the next barrier that TC passed up: counted
                // where TC counts (it cannot complete it: rank 0 is not in).
                _ => match self.arrive(got.header.seq, sender) {
                    Arrival::NotOpen => Ok(false),
                    Arrival::Repeat => {
                        self.user_stats.duplicates += 1;
                        Ok(true)
                    }
                    Arrival::Counted => Ok(true),
                    Arrival::Completed => {
                        self.release_all(got.header.seq)?;
                        Ok(true)
                    }
                },
            },
            // A late notice of a barrier rank 0 finished without it.
            Kind::BarrierDone => {
                self.user_stats.duplicates += 1;
                Ok(true)
            }
            Kind::Close if self.rank() == 0 => {
                // Acknowledged once every rank has closed (`close_root`);
                // a repeat after that is acknowledged again.
                self.closed[sender] = true;
                if self.everyone_closed() {
                    self.send_control(Kind::CloseAck, 0, sender, true)?;
                }
                Ok(true)
            }
            Kind::BcastData | Kind::BcastAck | Kind::BcastAbort => self.serve_stale_bcast(got),
            Kind::RedData => self.serve_stale_reduce(got),
            Kind::KvData | Kind::KvAck | Kind::KvFin | Kind::KvFinAck | Kind::KvAbort => self.serve_stale_kv(got),
            Kind::AgreeValue => self.serve_stale_agree(got),
            _ => Ok(false),
        }
    }

    /// Tells `rank` that barrier `seq` failed because of rank `blamed`.
    pub(crate) fn send_abort(&mut self, seq: u32, blamed: usize, rank: usize) -> Result<()> {
        let mut header = self.header(Kind::BarrierAbort, seq);
        header.count = blamed as u32;
        let mut datagram = [0u8; HDR_LEN];
        header.write_to(&mut datagram);
        self.transport.send(&datagram, self.group.peers[rank].addr())?;
        self.user_stats.packets_sent += 1;
        Ok(())
    }

    /// The operation deadline from now.
    pub(crate) fn deadline(&self) -> Instant {
        Instant::now() + self.config.timeout
    }

    /// Whether every rank has closed or is known to have failed.
    fn everyone_closed(&self) -> bool {
        (0..self.size()).all(|r| self.closed[r] || self.failed[r])
    }

    /// Says goodbye, collectively: every other rank tells rank 0 it is done
    /// and waits for its acknowledgment, which rank 0 sends once every live
    /// rank has said so. Until then every rank keeps answering late requests
    /// of finished operations (a lost barrier release, a lost broadcast
    /// acknowledgment), so no rank leaves while another still needs it.
    /// Bounded by the timeout; never fails.
    fn close(&mut self) {
        if self.size() == 1 {
            return;
        }
        let deadline = match self.close_wait {
            Some(wait) => Instant::now() + wait.min(self.config.timeout),
            None => self.deadline(),
        };
        let result = if self.rank() == 0 { self.close_root(deadline) } else { self.close_member(deadline) };
        if let Err(e) = result {
            tracing::warn!(rank = self.rank(), error = %e, "closing the communicator");
        }
    }

    fn close_root(&mut self, deadline: Instant) -> Result<()> {
        self.closed[0] = true;
        let mut linger_until: Option<Instant> = None;
        loop {
            if self.everyone_closed() && linger_until.is_none() {
                linger_until = Some(Instant::now() + CLOSE_LINGER);
                // One more acknowledgment each, for any that was lost.
                for rank in 1..self.size() {
                    if self.closed[rank] {
                        self.send_control(Kind::CloseAck, 0, rank, true)?;
                    }
                }
            }
            let until = linger_until.map_or(deadline, |l| l.min(deadline));
            match self.recv_valid(until)? {
                Some(got) => {
                    self.serve_stale(&got)?;
                }
                None if linger_until.is_some() => return Ok(()),
                None => {
                    // Let those who closed go; name those who did not.
                    for rank in 1..self.size() {
                        if self.closed[rank] {
                            self.send_control(Kind::CloseAck, 0, rank, true)?;
                        }
                    }
                    let missing: Vec<String> = (0..self.size())
                        .filter(|&r| !self.closed[r] && !self.failed[r])
                        .map(|r| r.to_string())
                        .collect();
                    return Err(Error::Timeout(format!(
                        "close: rank(s) {} did not close within {} ms",
                        missing.join(", "),
                        self.config.timeout.as_millis()
                    )));
                }
            }
        }
    }

    fn close_member(&mut self, deadline: Instant) -> Result<()> {
        // Rank 0 may be alive even when an operation blamed it (it may have
        // been waiting for a rank that died): say goodbye anyway, briefly.
        let deadline = if self.failed[0] { deadline.min(Instant::now() + CLOSE_SUSPECT_WAIT) } else { deadline };
        self.send_control(Kind::Close, 0, 0, false)?;
        let mut backoff = Backoff::with_max(CLOSE_RTO_MAX);
        loop {
            if backoff.fire() {
                self.send_control(Kind::Close, 0, 0, true)?;
            }
            match self.recv_valid(backoff.due().min(deadline))? {
                Some(got) if got.kind == Kind::CloseAck => return Ok(()),
                Some(got) => {
                    self.serve_stale(&got)?;
                }
                None if Instant::now() >= deadline => {
                    return Err(Error::PeerFailed {
                        rank: 0,
                        what: "close: rank 0 did not acknowledge within the timeout".into(),
                    })
                }
                None => {}
            }
        }
    }
}

impl Drop for Comm {
    fn drop(&mut self) {
        self.close();
        // Unregister the port (and detach, if last) while the socket still
        // holds it, so no other process can have bound it meanwhile.
        drop(self.attachment.take());
    }
}

/// Ranks on loopback, one thread each, for the collectives' unit tests.
#[cfg(test)]
pub(crate) mod testing {
    use std::{thread, time::Duration};

    use crate::{Comm, Config, Datapath};

    pub(crate) fn loopback(rank: usize, n: usize, master_port: u16, timeout_ms: u64) -> Config {
        Config { rank, world_size: n, master_port, timeout: Duration::from_millis(timeout_ms), ..Config::default() }
    }

    /// Runs `f` on `n` ranks (threads) of one loopback group; returns what
    /// each returned, by rank.
    pub(crate) fn ranks<T: Send + 'static>(
        n: usize,
        port: u16,
        timeout_ms: u64,
        f: impl Fn(usize, &mut Comm) -> T + Send + Sync + 'static,
    ) -> Vec<T> {
        let f = std::sync::Arc::new(f);
        let handles: Vec<_> = (0..n)
            .map(|rank| {
                let f = f.clone();
                thread::spawn(move || {
                    let mut comm = Comm::new(loopback(rank, n, port, timeout_ms)).unwrap();
                    assert_eq!(comm.datapath(), Datapath::User);
                    f(rank, &mut comm)
                })
            })
            .collect();
        handles.into_iter().map(|h| h.join().unwrap()).collect()
    }
}

#[cfg(test)]
mod tests {
    use std::thread;

    use super::*;

    fn loopback(rank: usize, n: usize, master_port: u16) -> Config {
        Config {
            rank,
            world_size: n,
            master_port,
            timeout: Duration::from_secs(10),
            ..Config::default()
        }
    }

    #[test]
    fn barriers_on_loopback_keep_ranks_in_step() {
        use std::sync::atomic::{AtomicUsize, Ordering};
        use std::sync::Arc;
        let n = 4;
        let rounds = 200;
        // counter[i] counts ranks that finished round i's pre-barrier work.
        let counters: Arc<Vec<AtomicUsize>> = Arc::new((0..rounds).map(|_| AtomicUsize::new(0)).collect());
        let handles: Vec<_> = (0..n)
            .map(|rank| {
                let counters = counters.clone();
                thread::spawn(move || {
                    let mut comm = Comm::new(loopback(rank, n, 29_621)).unwrap();
                    assert_eq!(comm.datapath(), Datapath::User);
                    assert!(comm.datapath_reason().unwrap().contains("loopback"));
                    for round in 0..rounds {
                        counters[round].fetch_add(1, Ordering::SeqCst);
                        comm.barrier().unwrap();
                        // Nobody leaves a barrier before everyone entered it.
                        assert_eq!(counters[round].load(Ordering::SeqCst), n);
                    }
                    comm.stats().unwrap().user
                })
            })
            .collect();
        for handle in handles {
            let stats = handle.join().unwrap();
            assert_eq!(stats.barriers, rounds as u64);
        }
    }

    #[test]
    fn dead_member_is_named_by_rank_zero() {
        let survivor = thread::spawn(|| {
            let mut comm = Comm::new(Config { timeout: Duration::from_millis(300), ..loopback(0, 3, 29_622) }).unwrap();
            comm.barrier().unwrap();
            let err = comm.barrier().unwrap_err();
            (err.status(), err.to_string())
        });
        let others: Vec<_> = (1..3)
            .map(|rank| {
                thread::spawn(move || {
                    // A longer timeout than rank 0's, so rank 0 gives up first.
                    let mut comm = Comm::new(Config { timeout: Duration::from_millis(3000), ..loopback(rank, 3, 29_622) }).unwrap();
                    comm.barrier().unwrap();
                    if rank == 2 {
                        // Rank 2 "dies": it never enters barrier #2 and vanishes without closing.
                        std::mem::forget(comm);
                        return None;
                    }
                    Some(comm.barrier().unwrap_err().to_string())
                })
            })
            .collect();
        let (status, message) = survivor.join().unwrap();
        assert_eq!(status, crate::Status::PeerFailed);
        assert!(message.contains("rank 2 failed: barrier #2: rank(s) 2 did not arrive within 300 ms"), "{message}");
        // Rank 1 hears at once that the barrier failed, and whose fault it was.
        let member = others.into_iter().next().unwrap().join().unwrap().unwrap();
        assert!(member.contains("rank 2 failed: barrier #2: rank 0 gave up on it because rank 2 failed"), "{member}");
    }
}
