//! The UDP socket a communicator sends and receives its datagrams on.
//!
//! The socket is non-blocking: a receive first tries `recvfrom` and sleeps in
//! `poll` only when nothing is queued, so a datagram that is already there
//! costs one system call and no wake-up.
//!
//! Bulk traffic (broadcast chunks and their acknowledgments) moves in
//! batches of up to [`BATCH`] datagrams per system call: datagrams are
//! [queued](Transport::queue) and [flushed](Transport::flush) with
//! `sendmmsg`, and received with `recvmmsg` into [`BATCH`] slots
//! ([`Transport::recv_batch`], [`Transport::datagram`]). The message and
//! I/O-vector arrays of both live in the transport and are reused: a batch
//! allocates nothing.
//!
//! A flush sends a run of consecutive queued datagrams to one destination
//! whose headers differ only in a chunk number that counts on, all of one
//! size (the last may be shorter), as one UDP GSO super-packet
//! (`UDP_SEGMENT`): one skb through the sender's stack, its TC egress and,
//! where nothing segments it (veth, bridges), all the way to the
//! receiver's TC ingress, which walks it segment by segment. Every segment
//! is a whole AggBox datagram, so wherever something does segment it the
//! receiver still gets valid datagrams. The socket takes super-packets
//! whole too (`UDP_GRO`): one message of a `recvmmsg` may hold up to
//! [`GSO_MAX_SEGMENTS`] datagrams, which [`Transport::recv_batch`] lists
//! one by one. `AGGBOX_GSO=0` turns both off; a kernel or route that
//! refuses GSO turns sending it off for the socket.

use std::{
    cell::Cell,
    io,
    net::{Ipv4Addr, SocketAddr, SocketAddrV4, UdpSocket},
    ops::Range,
    os::fd::AsRawFd,
    time::Instant,
};

use crate::{
    config::{DEFAULT_PORT_BASE, DEFAULT_PORT_SPAN},
    wire::{Header, CHUNK_MAX, HDR_LEN},
    Error, Result,
};

/// Most datagrams one `sendmmsg` or `recvmmsg` call moves.
pub const BATCH: usize = 64;

/// Bytes of each receive slot: the largest datagram AggBox sends (a header
/// and the largest chunk). A longer datagram is received truncated.
pub const RECV_SLOT: usize = HDR_LEN + CHUNK_MAX;

/// Datagrams queued for one `sendmmsg`: each a header, a payload (a range
/// of the source slice given to [`Transport::flush`]) and a destination.
/// A message sends one datagram, or a run of them as one super-packet: its
/// I/O vector is their iovecs, which lie back to back in `iov`.
struct SendBatch {
    headers: [[u8; HDR_LEN]; BATCH],
    payloads: [(usize, usize); BATCH],
    dests: [libc::sockaddr_in; BATCH],
    /// Whether each datagram must leave alone, never in a super-packet.
    alone: [bool; BATCH],
    iov: [[libc::iovec; 2]; BATCH],
    msgs: [libc::mmsghdr; BATCH],
    /// The `UDP_SEGMENT` control message of each super-packet message.
    cmsgs: [SegmentCmsg; BATCH],
    /// How many datagrams each message carries.
    segments: [usize; BATCH],
    len: usize,
}

/// `SOL_UDP`, `UDP_SEGMENT` (linux/udp.h; the segment size is a u16).
const SOL_UDP: libc::c_int = 17;
const UDP_SEGMENT: libc::c_int = 103;

/// Most datagrams in one super-packet (the kernel's `UDP_MAX_SEGMENTS` is
/// at least this).
pub const GSO_MAX_SEGMENTS: usize = 64;

/// Most UDP payload bytes of one super-packet (an IPv4 datagram's).
pub const GSO_MAX_BYTES: usize = 65_507;

/// `UDP_GRO` (linux/udp.h): a socket option, and the control message that
/// gives a coalesced receive's segment size (an int).
const UDP_GRO: libc::c_int = 104;

/// Bytes of a receive slot when the socket takes super-packets whole
/// (`UDP_GRO`): the largest IPv4 UDP payload fits.
const GRO_SLOT: usize = 1 << 16;

/// One `cmsghdr` with a u16 of data, padded as `CMSG_SPACE(2)`.
#[repr(C, align(8))]
#[derive(Clone, Copy)]
struct SegmentCmsg {
    bytes: [u8; SEGMENT_CMSG_SPACE],
}

/// `CMSG_SPACE(sizeof(u16))` on 64-bit Linux.
const SEGMENT_CMSG_SPACE: usize = 24;

impl SegmentCmsg {
    /// Fills it as `UDP_SEGMENT` of `size` bytes; returns its length.
    fn set(&mut self, size: u16) -> usize {
        // SAFETY: CMSG_LEN/CMSG_SPACE are pure arithmetic.
        let (len, space) = unsafe { (libc::CMSG_LEN(2) as usize, libc::CMSG_SPACE(2) as usize) };
        debug_assert_eq!(space, SEGMENT_CMSG_SPACE);
        let header = libc::cmsghdr { cmsg_len: len as _, cmsg_level: SOL_UDP, cmsg_type: UDP_SEGMENT };
        let header_len = std::mem::size_of::<libc::cmsghdr>();
        // SAFETY: `bytes` is 8-aligned and holds a cmsghdr and 2 bytes of data.
        unsafe { std::ptr::write(self.bytes.as_mut_ptr().cast::<libc::cmsghdr>(), header) };
        self.bytes[header_len..header_len + 2].copy_from_slice(&size.to_ne_bytes());
        space
    }
}

impl RecvBatch {
    /// Points every message at its slot and address, once: they are heap
    /// allocations of the batch, which never move.
    fn point_at_slots(&mut self) {
        let slots = self.slots.as_mut_ptr();
        let slot_len = self.slot_len;
        for i in 0..BATCH {
            // SAFETY: slot i lies within `slots` (BATCH * slot_len bytes).
            self.iov[i] = libc::iovec { iov_base: unsafe { slots.add(i * slot_len) }.cast(), iov_len: slot_len };
            let msg = &mut self.msgs[i];
            msg.msg_hdr = zeroed();
            msg.msg_hdr.msg_name = (&raw mut self.addrs[i]).cast();
            msg.msg_hdr.msg_namelen = std::mem::size_of::<libc::sockaddr_in>() as libc::socklen_t;
            msg.msg_hdr.msg_iov = &raw mut self.iov[i];
            msg.msg_hdr.msg_iovlen = 1;
            msg.msg_hdr.msg_control = self.cmsgs[i].bytes.as_mut_ptr().cast();
            msg.msg_hdr.msg_controllen = SEGMENT_CMSG_SPACE as _;
        }
    }

    /// The `UDP_GRO` segment size of message `i`, if the kernel gave one.
    fn gro_size(&self, i: usize) -> Option<usize> {
        let hdr = &self.msgs[i].msg_hdr;
        // SAFETY: the CMSG_* walk stays within the control buffer the
        // kernel filled (msg_control, msg_controllen), as cmsg(3) shows.
        unsafe {
            let mut cmsg = libc::CMSG_FIRSTHDR(hdr);
            while !cmsg.is_null() {
                if (*cmsg).cmsg_level == SOL_UDP && (*cmsg).cmsg_type == UDP_GRO {
                    let size = std::ptr::read_unaligned(libc::CMSG_DATA(cmsg).cast::<libc::c_int>());
                    return usize::try_from(size).ok().filter(|&s| s > 0);
                }
                cmsg = libc::CMSG_NXTHDR(hdr, cmsg);
            }
        }
        None
    }

    /// Lists the datagrams of the `filled` messages just received.
    fn split_segments(&mut self) {
        self.segments.clear();
        for i in 0..self.filled {
            let len = self.msgs[i].msg_len as usize;
            let stride = self.gro_size(i).unwrap_or(len.max(1));
            let (mut offset, first) = (0, self.segments.len());
            loop {
                let seg = stride.min(len - offset);
                self.segments.push((i as u32, offset as u32, seg as u32));
                offset += seg;
                if offset >= len || self.segments.len() == self.segments.capacity() {
                    break;
                }
            }
            let held = (self.segments.len() - first) as u64;
            if held > 1 {
                self.gro_packets += 1;
                self.gro_segments += held;
            }
        }
    }
}

/// The slots one `recvmmsg` fills, and what it said about each.
///
/// With `UDP_GRO` on, a message may be a super-packet of several
/// datagrams at a stride its control message gives; `segments` lists every
/// datagram of the last batch, so callers see datagrams either way.
struct RecvBatch {
    /// `BATCH` slots of `slot_len` bytes.
    slots: Vec<u8>,
    /// [`RECV_SLOT`], or [`GRO_SLOT`] when super-packets come whole.
    slot_len: usize,
    addrs: [libc::sockaddr_in; BATCH],
    iov: [libc::iovec; BATCH],
    msgs: [libc::mmsghdr; BATCH],
    /// Each message's control buffer (the `UDP_GRO` segment size).
    cmsgs: [SegmentCmsg; BATCH],
    /// The datagrams of the last `recvmmsg`: (message, offset in its slot,
    /// length). Its capacity (`BATCH * GSO_MAX_SEGMENTS`) is reserved once.
    segments: Vec<(u32, u32, u32)>,
    /// Messages the last `recvmmsg` returned.
    filled: usize,
    /// Messages so far that were super-packets (more than one datagram),
    /// and the datagrams they held.
    gro_packets: u64,
    gro_segments: u64,
}

// SAFETY: the raw pointers in `iov` and `msgs` point only into the batch's
// own heap allocations (which never move) and, for a send, into the slice
// passed to that `flush` (written right before the system call); Rust code
// never reads through them: between calls they are stale numbers, which any
// thread may own.
unsafe impl Send for SendBatch {}
// SAFETY: as for `SendBatch`.
unsafe impl Send for RecvBatch {}

/// The all-zero value of a C struct of integers and pointers (a valid one:
/// zero integers, null pointers).
fn zeroed<T>() -> T {
    // SAFETY: used only for libc's plain C structs and arrays of them, for
    // which all-zero bytes are a valid value.
    unsafe { std::mem::zeroed() }
}

/// `addr` as the kernel takes it.
fn sockaddr_from(addr: SocketAddrV4) -> libc::sockaddr_in {
    libc::sockaddr_in {
        sin_family: libc::AF_INET as libc::sa_family_t,
        sin_port: addr.port().to_be(),
        sin_addr: libc::in_addr { s_addr: u32::from(*addr.ip()).to_be() },
        sin_zero: [0; 8],
    }
}

/// The address the kernel wrote, if it is IPv4.
fn sockaddr_to(addr: &libc::sockaddr_in, len: libc::socklen_t) -> Option<SocketAddrV4> {
    if addr.sin_family != libc::AF_INET as libc::sa_family_t
        || (len as usize) < std::mem::size_of::<libc::sockaddr_in>()
    {
        return None;
    }
    Some(SocketAddrV4::new(Ipv4Addr::from(u32::from_be(addr.sin_addr.s_addr)), u16::from_be(addr.sin_port)))
}

/// A datagram of the last [`Transport::recv_batch`].
#[derive(Debug)]
pub struct Datagram<'a> {
    /// Its bytes (at most [`RECV_SLOT`]).
    pub bytes: &'a [u8],
    /// Who sent it.
    pub from: SocketAddrV4,
    /// Whether it was longer than [`RECV_SLOT`] and cut.
    pub truncated: bool,
}

/// Longest wait for room in a full socket send buffer.
pub const SEND_STALL: std::time::Duration = std::time::Duration::from_secs(1);

/// Socket receive buffer asked for, so bursts from many ranks are not lost.
const RECV_BUFFER_BYTES: libc::c_int = 4 << 20;

/// A bound UDP socket, with its reusable send and receive batches.
pub struct Transport {
    socket: UdpSocket,
    local: SocketAddrV4,
    tx: Box<SendBatch>,
    rx: Box<RecvBatch>,
    /// System calls made on the socket (sends, receives, polls), counted
    /// for the benchmarks' syscalls-per-operation figure.
    syscalls: Cell<u64>,
    /// Times the owner slept waiting for the socket (`wait_readable`).
    waits: Cell<u64>,
    /// Whether flushes send runs of datagrams as UDP GSO super-packets.
    gso: bool,
    /// Super-packets sent, and the datagrams they carried.
    gso_sends: Cell<u64>,
    gso_segments: Cell<u64>,
}

/// Sets an int socket option.
fn set_int_option(socket: &UdpSocket, level: libc::c_int, name: libc::c_int, value: libc::c_int) -> io::Result<()> {
    // SAFETY: setsockopt on our own socket with a c_int value.
    let rc = unsafe {
        libc::setsockopt(
            socket.as_raw_fd(),
            level,
            name,
            (&value as *const libc::c_int).cast(),
            std::mem::size_of::<libc::c_int>() as libc::socklen_t,
        )
    };
    if rc == 0 { Ok(()) } else { Err(io::Error::last_os_error()) }
}

/// Whether `AGGBOX_GSO` leaves UDP GSO on (unset, or anything but `0`).
fn gso_wanted() -> bool {
    std::env::var("AGGBOX_GSO").map_or(true, |v| v.trim() != "0")
}

impl Transport {
    /// Binds `ip:port`; port 0 takes the first free port from
    /// [`DEFAULT_PORT_BASE`] on.
    pub fn bind(ip: Ipv4Addr, port: u16) -> Result<Transport> {
        let socket = if port != 0 {
            UdpSocket::bind((ip, port))
                .map_err(|e| Error::system(format!("binding UDP {ip}:{port}"), e))?
        } else {
            (DEFAULT_PORT_BASE..DEFAULT_PORT_BASE + DEFAULT_PORT_SPAN)
                .find_map(|p| UdpSocket::bind((ip, p)).ok())
                .ok_or_else(|| {
                    Error::system(
                        format!(
                            "binding UDP on {ip}: ports {DEFAULT_PORT_BASE}..{} are all taken (set AGGBOX_PORT)",
                            DEFAULT_PORT_BASE + DEFAULT_PORT_SPAN
                        ),
                        io::Error::from(io::ErrorKind::AddrInUse),
                    )
                })?
        };
        socket
            .set_nonblocking(true)
            .map_err(|e| Error::system("making the UDP socket non-blocking", e))?;
        // SAFETY: setsockopt on our own socket with a c_int value.
        unsafe {
            libc::setsockopt(
                socket.as_raw_fd(),
                libc::SOL_SOCKET,
                libc::SO_RCVBUF,
                (&RECV_BUFFER_BYTES as *const libc::c_int).cast(),
                std::mem::size_of::<libc::c_int>() as libc::socklen_t,
            );
        }
        let local = match socket.local_addr() {
            Ok(SocketAddr::V4(addr)) => addr,
            Ok(other) => return Err(Error::Internal(format!("bound to non-IPv4 {other}"))),
            Err(e) => return Err(Error::system("reading the UDP socket's address", e)),
        };
        let tx = Box::new(SendBatch {
            headers: [[0; HDR_LEN]; BATCH],
            payloads: [(0, 0); BATCH],
            dests: zeroed(),
            alone: [false; BATCH],
            iov: zeroed(),
            msgs: zeroed(),
            cmsgs: [SegmentCmsg { bytes: [0; SEGMENT_CMSG_SPACE] }; BATCH],
            segments: [0; BATCH],
            len: 0,
        });
        // Super-packets whole (UDP_GRO): one receive for up to
        // GSO_MAX_SEGMENTS datagrams. Without it the kernel cuts each into
        // its datagrams before they are queued.
        let gro = gso_wanted() && set_int_option(&socket, SOL_UDP, UDP_GRO, 1).is_ok();
        let slot_len = if gro { GRO_SLOT } else { RECV_SLOT };
        let mut rx = Box::new(RecvBatch {
            slots: vec![0; BATCH * slot_len],
            slot_len,
            addrs: zeroed(),
            iov: zeroed(),
            msgs: zeroed(),
            cmsgs: [SegmentCmsg { bytes: [0; SEGMENT_CMSG_SPACE] }; BATCH],
            segments: Vec::with_capacity(BATCH * GSO_MAX_SEGMENTS),
            gro_packets: 0,
            gro_segments: 0,
            filled: 0,
        });
        rx.point_at_slots();
        Ok(Transport {
            socket,
            local,
            tx,
            rx,
            syscalls: Cell::new(0),
            waits: Cell::new(0),
            gso: gso_wanted(),
            gso_sends: Cell::new(0),
            gso_segments: Cell::new(0),
        })
    }

    /// The bound address.
    pub fn local_addr(&self) -> SocketAddrV4 {
        self.local
    }

    /// Times the owner waited for a datagram (each a sleep until one came,
    /// or the deadline): how often it was woken by its socket.
    pub fn waits(&self) -> u64 {
        self.waits.get()
    }

    /// UDP GSO super-packets sent so far, and the datagrams they carried.
    pub fn gso_sends(&self) -> (u64, u64) {
        (self.gso_sends.get(), self.gso_segments.get())
    }

    /// UDP GRO super-packets [`Transport::recv_batch`] received so far (each
    /// one message holding several datagrams), and the datagrams they held.
    pub fn gro_receives(&self) -> (u64, u64) {
        (self.rx.gro_packets, self.rx.gro_segments)
    }

    /// System calls made on the socket so far.
    pub fn syscalls(&self) -> u64 {
        self.syscalls.get()
    }

    fn count_syscall(&self) {
        self.syscalls.set(self.syscalls.get() + 1);
    }

    /// Sends one datagram. While the socket buffer is full it waits for
    /// room, for [`SEND_STALL`] at most; other errors are returned.
    pub fn send(&self, datagram: &[u8], to: SocketAddrV4) -> Result<()> {
        let mut stalled_since: Option<Instant> = None;
        loop {
            self.count_syscall();
            match self.socket.send_to(datagram, to) {
                Ok(_) => return Ok(()),
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                    let since = *stalled_since.get_or_insert_with(Instant::now);
                    if since.elapsed() >= SEND_STALL {
                        return Err(Error::system(format!("sending to {to}: no room in the socket buffer"), e));
                    }
                    self.poll(libc::POLLOUT, 1)?;
                }
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) => return Err(Error::system(format!("sending to {to}"), e)),
            }
        }
    }

    /// Receives one datagram into `buf`, waiting until `deadline` at most.
    /// Returns its length and sender, or `None` when the deadline passed.
    /// With [`Transport::gro`] a super-packet comes whole (its datagrams
    /// back to back, each but the last of the same size): a buffer of
    /// [`GSO_MAX_BYTES`] holds any. The collectives use
    /// [`Transport::recv_batch`], which splits them.
    pub fn recv(&self, buf: &mut [u8], deadline: Instant) -> Result<Option<(usize, SocketAddrV4)>> {
        loop {
            self.count_syscall();
            match self.socket.recv_from(buf) {
                Ok((len, SocketAddr::V4(from))) => return Ok(Some((len, from))),
                Ok((_, SocketAddr::V6(_))) => continue,
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                    let now = Instant::now();
                    if now >= deadline {
                        return Ok(None);
                    }
                    let wait = deadline - now;
                    // Round up so a sub-millisecond wait still sleeps.
                    let ms = (wait.as_micros().div_ceil(1000)).min(i32::MAX as u128) as i32;
                    self.poll(libc::POLLIN, ms)?;
                }
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                // An ICMP error from an earlier send (port unreachable while a
                // peer is not up yet): not this receive's problem.
                Err(e) if e.kind() == io::ErrorKind::ConnectionRefused => {}
                Err(e) => return Err(Error::system("receiving a datagram", e)),
            }
        }
    }

    /// Queues a datagram for the next [`Transport::flush`]: `header`, then
    /// the bytes `payload` of the source slice given to that flush, to `to`.
    /// Returns whether the batch is now full (flush it before queueing more).
    ///
    /// # Panics
    ///
    /// If the batch is already full (a bug of the caller).
    pub fn queue(&mut self, header: &Header, payload: Range<usize>, to: SocketAddrV4) -> bool {
        self.queue_as(header, payload, to, false)
    }

    /// As [`Transport::queue`], for a datagram that leaves alone, never as
    /// a segment of a super-packet (a receiver whose kernel takes such
    /// datagrams one at a time).
    pub fn queue_alone(&mut self, header: &Header, payload: Range<usize>, to: SocketAddrV4) -> bool {
        self.queue_as(header, payload, to, true)
    }

    fn queue_as(&mut self, header: &Header, payload: Range<usize>, to: SocketAddrV4, alone: bool) -> bool {
        let tx = &mut *self.tx;
        assert!(tx.len < BATCH, "send batch overflow: flush when queue() says it is full");
        header.write_to(&mut tx.headers[tx.len]);
        tx.payloads[tx.len] = (payload.start, payload.end);
        tx.dests[tx.len] = sockaddr_from(to);
        tx.alone[tx.len] = alone;
        tx.len += 1;
        tx.len == BATCH
    }

    /// How many datagrams are queued.
    pub fn queued(&self) -> usize {
        self.tx.len
    }

    /// Sends every queued datagram with `sendmmsg`, their payloads taken
    /// from `source`, and returns how many were sent. While the socket
    /// buffer is full it waits for room, for [`SEND_STALL`] at most. On an
    /// error the batch is emptied (what was not sent is lost, as a dropped
    /// datagram is).
    pub fn flush(&mut self, source: &[u8]) -> Result<usize> {
        let count = self.tx.len;
        self.tx.len = 0;
        if count == 0 {
            return Ok(0);
        }
        let messages = self.prepare_send(count, source)?;
        let mut sent = 0;
        let mut stalled_since: Option<Instant> = None;
        while sent < messages {
            self.count_syscall();
            // SAFETY: `msgs[sent..messages]` were just made to point at live
            // headers, addresses, control messages and `source` (prepare_send).
            let rc = unsafe {
                libc::sendmmsg(
                    self.socket.as_raw_fd(),
                    self.tx.msgs[sent..messages].as_mut_ptr(),
                    (messages - sent) as libc::c_uint,
                    0,
                )
            };
            if rc >= 0 {
                for m in sent..sent + rc as usize {
                    if self.tx.segments[m] > 1 {
                        self.gso_sends.set(self.gso_sends.get() + 1);
                        self.gso_segments.set(self.gso_segments.get() + self.tx.segments[m] as u64);
                    }
                }
                sent += rc as usize;
                stalled_since = None;
                continue;
            }
            let err = io::Error::last_os_error();
            match err.kind() {
                io::ErrorKind::WouldBlock => {
                    let since = *stalled_since.get_or_insert_with(Instant::now);
                    if since.elapsed() >= SEND_STALL {
                        return Err(Error::system("sendmmsg: no room in the socket buffer", err));
                    }
                    self.poll(libc::POLLOUT, 1)?;
                }
                // An ICMP error of an earlier datagram: not this batch's.
                io::ErrorKind::Interrupted | io::ErrorKind::ConnectionRefused => {}
                // The kernel or the route refuses UDP GSO (no checksum
                // offload, IPsec): send the rest, and everything after, one
                // datagram per message.
                _ if self.gso && self.tx.segments[sent] > 1 && matches!(err.raw_os_error(), Some(libc::EIO | libc::EINVAL)) => {
                    tracing::info!(error = %err, "UDP GSO refused; sending datagrams one by one");
                    self.gso = false;
                    let done: usize = self.tx.segments[..sent].iter().sum();
                    self.move_unsent_down(done, count);
                    return Ok(done + self.flush(source)?);
                }
                _ => return Err(Error::system(format!("sendmmsg of {} messages", messages - sent), err)),
            }
        }
        Ok(count)
    }

    /// Makes the queued datagrams `done..count` the whole queue again.
    fn move_unsent_down(&mut self, done: usize, count: usize) {
        let tx = &mut *self.tx;
        tx.headers.copy_within(done..count, 0);
        tx.payloads.copy_within(done..count, 0);
        tx.dests.copy_within(done..count, 0);
        tx.alone.copy_within(done..count, 0);
        tx.len = count - done;
    }

    /// Whether queued datagram `k` can follow datagram `first` (`n`
    /// datagrams after it so far) in one super-packet of `size`-byte
    /// segments: the same destination, the same header but for a chunk
    /// number `n` further on, and a payload of the same size (or, ending
    /// the run, a shorter one).
    fn continues_run(&self, first: usize, k: usize, size: usize, bytes: usize) -> bool {
        let tx = &*self.tx;
        const CHUNK: Range<usize> = 28..32;
        let (a, b) = (&tx.headers[first], &tx.headers[k]);
        let (start, end) = tx.payloads[k];
        let len = HDR_LEN + (end - start);
        let chunk = |h: &[u8; HDR_LEN]| u32::from_le_bytes(h[CHUNK].try_into().expect("4 bytes"));
        let (da, db) = (&tx.dests[first], &tx.dests[k]);
        end > start
            && !tx.alone[first]
            && !tx.alone[k]
            && len <= size
            && bytes + len <= GSO_MAX_BYTES
            && k - first < GSO_MAX_SEGMENTS
            && da.sin_addr.s_addr == db.sin_addr.s_addr
            && da.sin_port == db.sin_port
            && a[..CHUNK.start] == b[..CHUNK.start]
            && a[CHUNK.end..] == b[CHUNK.end..]
            && chunk(b) == chunk(a).wrapping_add((k - first) as u32)
    }

    /// Points a message header at each datagram of the first `count`
    /// queued, or at each run of them that makes one super-packet; returns
    /// how many messages.
    fn prepare_send(&mut self, count: usize, source: &[u8]) -> Result<usize> {
        let tx = &mut *self.tx;
        for i in 0..count {
            let (start, end) = tx.payloads[i];
            let payload = source.get(start..end).ok_or_else(|| {
                Error::Internal(format!("queued payload {start}..{end} is outside the {}-byte source", source.len()))
            })?;
            tx.iov[i] = [
                libc::iovec { iov_base: tx.headers[i].as_mut_ptr().cast(), iov_len: HDR_LEN },
                // The kernel only reads through it (sendmmsg).
                libc::iovec { iov_base: payload.as_ptr().cast_mut().cast(), iov_len: payload.len() },
            ];
        }
        let mut messages = 0;
        let mut i = 0;
        while i < count {
            let (start, end) = self.tx.payloads[i];
            let size = HDR_LEN + (end - start);
            let mut bytes = size;
            let mut j = i + 1;
            if self.gso && end > start {
                while j < count && self.continues_run(i, j, size, bytes) {
                    let (s, e) = self.tx.payloads[j];
                    bytes += HDR_LEN + (e - s);
                    j += 1;
                    if HDR_LEN + (e - s) < size {
                        break; // a shorter segment ends the run
                    }
                }
            }
            let tx = &mut *self.tx;
            let msg = &mut tx.msgs[messages];
            msg.msg_hdr = zeroed();
            msg.msg_hdr.msg_name = (&raw mut tx.dests[i]).cast();
            msg.msg_hdr.msg_namelen = std::mem::size_of::<libc::sockaddr_in>() as libc::socklen_t;
            msg.msg_hdr.msg_iov = tx.iov[i].as_mut_ptr();
            if j - i > 1 {
                // Every datagram of the run has both iovecs, back to back.
                msg.msg_hdr.msg_iovlen = 2 * (j - i);
                let len = tx.cmsgs[messages].set(size as u16);
                msg.msg_hdr.msg_control = tx.cmsgs[messages].bytes.as_mut_ptr().cast();
                msg.msg_hdr.msg_controllen = len as _;
            } else {
                msg.msg_hdr.msg_iovlen = if end == start { 1 } else { 2 };
            }
            msg.msg_len = 0;
            tx.segments[messages] = j - i;
            messages += 1;
            i = j;
        }
        Ok(messages)
    }

    /// Receives up to [`BATCH`] messages already queued on the socket with
    /// one `recvmmsg`, without waiting; returns how many datagrams they
    /// held (0 when none is queued; with [`Transport::gro`] up to
    /// `BATCH * GSO_MAX_SEGMENTS`). They stay readable with [`Transport::datagram`] until the
    /// next call.
    pub fn recv_batch(&mut self) -> Result<usize> {
        self.prepare_recv();
        self.rx.filled = 0;
        loop {
            self.count_syscall();
            // SAFETY: `msgs` point at BATCH slots of slot_len bytes and
            // BATCH addresses, all owned by `self.rx` (point_at_slots).
            let rc = unsafe {
                libc::recvmmsg(
                    self.socket.as_raw_fd(),
                    self.rx.msgs.as_mut_ptr(),
                    BATCH as libc::c_uint,
                    libc::MSG_DONTWAIT,
                    std::ptr::null_mut(),
                )
            };
            if rc >= 0 {
                self.rx.filled = rc as usize;
                self.rx.split_segments();
                return Ok(self.rx.segments.len());
            }
            let err = io::Error::last_os_error();
            match err.kind() {
                io::ErrorKind::WouldBlock => return Ok(0),
                // See `recv`: an ICMP error of an earlier send.
                io::ErrorKind::Interrupted | io::ErrorKind::ConnectionRefused => {}
                _ => return Err(Error::system("recvmmsg", err)),
            }
        }
    }

    /// Resets what `recvmmsg` wrote into the messages of the last batch.
    fn prepare_recv(&mut self) {
        for msg in &mut self.rx.msgs[..self.rx.filled] {
            msg.msg_hdr.msg_namelen = std::mem::size_of::<libc::sockaddr_in>() as libc::socklen_t;
            msg.msg_hdr.msg_controllen = SEGMENT_CMSG_SPACE as _;
            msg.msg_hdr.msg_flags = 0;
            msg.msg_len = 0;
        }
        self.rx.segments.clear();
    }

    /// Datagram `i` of the last [`Transport::recv_batch`], or `None` when
    /// it came from a non-IPv4 address.
    ///
    /// # Panics
    ///
    /// If `i` is not below what that call returned.
    pub fn datagram(&self, i: usize) -> Option<Datagram<'_>> {
        let rx = &*self.rx;
        assert!(i < rx.segments.len(), "datagram {i} of a batch of {}", rx.segments.len());
        let (m, offset, len) = rx.segments[i];
        let (m, offset, len) = (m as usize, offset as usize, len as usize);
        let msg = &rx.msgs[m];
        let from = sockaddr_to(&rx.addrs[m], msg.msg_hdr.msg_namelen)?;
        let start = m * rx.slot_len + offset;
        let kept = len.min(RECV_SLOT);
        let truncated = len > RECV_SLOT || msg.msg_hdr.msg_flags & libc::MSG_TRUNC != 0;
        Some(Datagram { bytes: &rx.slots[start..start + kept], from, truncated })
    }

    /// Whether the socket takes super-packets whole (`UDP_GRO`; off with
    /// `AGGBOX_GSO=0`): [`Transport::recv_batch`] splits them, and
    /// [`Transport::recv`] returns one whole.
    pub fn gro(&self) -> bool {
        self.rx.slot_len == GRO_SLOT
    }

    /// Waits until a datagram is queued on the socket or `deadline` passes;
    /// returns whether one may be there (a signal may wake it early).
    pub fn wait_readable(&self, deadline: Instant) -> Result<bool> {
        let now = Instant::now();
        if now >= deadline {
            return Ok(false);
        }
        self.waits.set(self.waits.get() + 1);
        // Round up so a sub-millisecond wait still sleeps.
        let ms = ((deadline - now).as_micros().div_ceil(1000)).min(i32::MAX as u128) as i32;
        self.poll(libc::POLLIN, ms)
    }

    /// Polls the socket for `events`; returns whether it is ready.
    fn poll(&self, events: libc::c_short, timeout_ms: i32) -> Result<bool> {
        let mut fd = libc::pollfd { fd: self.socket.as_raw_fd(), events, revents: 0 };
        self.count_syscall();
        // SAFETY: one valid pollfd.
        let rc = unsafe { libc::poll(&mut fd, 1, timeout_ms) };
        if rc < 0 {
            let err = io::Error::last_os_error();
            if err.kind() != io::ErrorKind::Interrupted {
                return Err(Error::system("poll on the UDP socket", err));
            }
        }
        Ok(rc > 0)
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    #[test]
    fn loopback_send_and_timed_receive() {
        let a = Transport::bind(Ipv4Addr::LOCALHOST, 0).unwrap();
        let b = Transport::bind(Ipv4Addr::LOCALHOST, 0).unwrap();
        assert_ne!(a.local_addr().port(), b.local_addr().port());
        a.send(b"hello", b.local_addr()).unwrap();
        let mut buf = [0u8; 64];
        let got = b.recv(&mut buf, Instant::now() + Duration::from_secs(5)).unwrap();
        assert_eq!(got, Some((5, a.local_addr())));
        assert_eq!(&buf[..5], b"hello");

        let start = Instant::now();
        let none = b.recv(&mut buf, start + Duration::from_millis(20)).unwrap();
        assert_eq!(none, None);
        assert!(start.elapsed() >= Duration::from_millis(20));
    }

    /// Everything in the batches received so far, as (header chunk, payload).
    fn drain(b: &mut Transport, want: usize) -> Vec<(u32, Vec<u8>)> {
        let mut got = Vec::new();
        let deadline = Instant::now() + Duration::from_secs(5);
        while got.len() < want && Instant::now() < deadline {
            let n = b.recv_batch().unwrap();
            assert!(n <= BATCH * GSO_MAX_SEGMENTS);
            if n == 0 {
                b.wait_readable(deadline).unwrap();
            }
            for i in 0..n {
                let datagram = b.datagram(i).unwrap();
                let (header, _) = Header::read_from(datagram.bytes).unwrap();
                assert!(!datagram.truncated);
                got.push((header.chunk, datagram.bytes[HDR_LEN..].to_vec()));
            }
        }
        got
    }

    #[test]
    fn batches_of_datagrams_with_payloads_from_a_source() {
        let mut a = Transport::bind(Ipv4Addr::LOCALHOST, 0).unwrap();
        let mut b = Transport::bind(Ipv4Addr::LOCALHOST, 0).unwrap();
        let source: Vec<u8> = (0..=255).collect();
        let mut header = Header::new(crate::wire::Kind::BcastData, 1, 2, 0, 3);
        for i in 0..(BATCH + 6) {
            header.chunk = i as u32;
            let payload = if i % 2 == 0 { i..i + 10 } else { 0..0 };
            if a.queue(&header, payload, b.local_addr()) {
                assert_eq!(a.queued(), BATCH);
                assert_eq!(a.flush(&source).unwrap(), BATCH);
            }
        }
        assert_eq!(a.flush(&source).unwrap(), 6);
        assert_eq!(a.queued(), 0);
        let got = drain(&mut b, BATCH + 6);
        assert_eq!(got.len(), BATCH + 6);
        for (i, (chunk, payload)) in got.iter().enumerate() {
            assert_eq!(*chunk as usize, i, "in order");
            let want: Vec<u8> = if i % 2 == 0 { (i as u8..i as u8 + 10).collect() } else { vec![] };
            assert_eq!(payload, &want);
        }
        assert_eq!(b.datagram(0).unwrap().from, a.local_addr());

        // A payload outside the source is refused, not sent.
        a.queue(&header, 250..260, b.local_addr());
        let err = a.flush(&source).unwrap_err();
        assert_eq!(err.status(), crate::Status::Internal);
        assert_eq!(a.queued(), 0);

        // Longer than a slot: received cut, and said so.
        let big = vec![7u8; RECV_SLOT + 100];
        a.send(&big, b.local_addr()).unwrap();
        b.wait_readable(Instant::now() + Duration::from_secs(5)).unwrap();
        assert_eq!(b.recv_batch().unwrap(), 1);
        let datagram = b.datagram(0).unwrap();
        assert!(datagram.truncated);
        assert_eq!(datagram.bytes.len(), RECV_SLOT);
        assert_eq!(b.recv_batch().unwrap(), 0, "nothing more");
    }

    /// Runs of equal datagrams to one destination leave as super-packets
    /// and arrive as the datagrams they are made of, in order; anything
    /// that breaks a run (another destination, a header that differs, a
    /// chunk out of line, a shorter payload, an empty one) starts a new one.
    #[test]
    fn runs_of_datagrams_leave_as_udp_gso_super_packets() {
        let mut a = Transport::bind(Ipv4Addr::LOCALHOST, 0).unwrap();
        let mut b = Transport::bind(Ipv4Addr::LOCALHOST, 0).unwrap();
        let mut c = Transport::bind(Ipv4Addr::LOCALHOST, 0).unwrap();
        let source: Vec<u8> = (0..4096u32).map(|i| (i * 13 + 5) as u8).collect();
        let mut header = Header::new(crate::wire::Kind::BcastData, 1, 2, 0, 3);
        // (chunk, payload, to c instead of b, retransmit flag)
        let plan: Vec<(u32, Range<usize>, bool, bool)> = vec![
            (0, 0..100, false, false),
            (1, 100..200, false, false),
            (2, 200..300, false, false),
            (3, 300..340, false, false), // shorter: ends the run
            (4, 400..500, false, false),
            (5, 500..600, true, false),  // another destination
            (6, 600..700, false, false),
            (7, 700..800, false, true),  // another header
            (9, 900..1000, false, false), // out of line
            (10, 0..0, false, false),    // header only
            (11, 1100..1200, false, false),
            (12, 1200..1300, false, false),
        ];
        for (chunk, payload, to_c, retransmit) in &plan {
            header.chunk = *chunk;
            header.flags = if *retransmit { crate::wire::FLAG_RETRANSMIT } else { 0 };
            a.queue(&header, payload.clone(), if *to_c { c.local_addr() } else { b.local_addr() });
        }
        assert_eq!(a.flush(&source).unwrap(), plan.len());
        let to_b = plan.iter().filter(|p| !p.2).count();
        let got = drain(&mut b, to_b);
        let want: Vec<(u32, Vec<u8>)> =
            plan.iter().filter(|p| !p.2).map(|(chunk, payload, _, _)| (*chunk, source[payload.clone()].to_vec())).collect();
        assert_eq!(got, want, "every datagram, whole and in order");
        assert_eq!(drain(&mut c, 1), vec![(5, source[500..600].to_vec())]);
        // Runs: 0..=3, then 11..=12; the rest alone.
        assert_eq!(a.gso_sends(), (2, 6));
        // Queued to leave alone: a run in every other respect, sent as
        // single datagrams.
        header.flags = 0;
        for chunk in 13..16u32 {
            header.chunk = chunk;
            let at = chunk as usize * 100;
            a.queue_alone(&header, at..at + 100, b.local_addr());
        }
        assert_eq!(a.flush(&source).unwrap(), 3);
        let want: Vec<(u32, Vec<u8>)> = (13..16u32).map(|c| (c, source[c as usize * 100..c as usize * 100 + 100].to_vec())).collect();
        assert_eq!(drain(&mut b, 3), want);
        assert_eq!(a.gso_sends(), (2, 6), "no super-packet more");
    }

    /// A full batch of 1472-byte datagrams to one destination: super-packets
    /// of at most GSO_MAX_BYTES.
    #[test]
    fn a_batch_of_full_datagrams_splits_at_the_size_of_an_ip_datagram() {
        let mut a = Transport::bind(Ipv4Addr::LOCALHOST, 0).unwrap();
        let mut b = Transport::bind(Ipv4Addr::LOCALHOST, 0).unwrap();
        let chunk = 1432;
        let source: Vec<u8> = (0..BATCH * chunk).map(|i| (i % 251) as u8).collect();
        let mut header = Header::new(crate::wire::Kind::BcastData, 1, 2, 0, 3);
        for i in 0..BATCH {
            header.chunk = i as u32;
            a.queue(&header, i * chunk..(i + 1) * chunk, b.local_addr());
        }
        assert_eq!(a.flush(&source).unwrap(), BATCH);
        let per = GSO_MAX_BYTES / (HDR_LEN + chunk);
        assert_eq!(a.gso_sends(), (BATCH.div_ceil(per) as u64, BATCH as u64));
        let got = drain(&mut b, BATCH);
        assert_eq!(got.len(), BATCH);
        for (i, (c, payload)) in got.iter().enumerate() {
            assert_eq!((*c as usize, payload.as_slice()), (i, &source[i * chunk..(i + 1) * chunk]));
        }
    }
    /// With UDP_GRO a message holds a whole super-packet: one `recvmmsg`
    /// returns more datagrams than it has messages, each whole, in order.
    #[test]
    fn super_packets_are_received_whole_and_split_into_their_datagrams() {
        let mut a = Transport::bind(Ipv4Addr::LOCALHOST, 0).unwrap();
        let mut b = Transport::bind(Ipv4Addr::LOCALHOST, 0).unwrap();
        assert!(b.gro(), "UDP_GRO is on by default");
        let chunk = 1432;
        let total = 3 * BATCH;
        let source: Vec<u8> = (0..total * chunk).map(|i| (i % 241) as u8).collect();
        let mut header = Header::new(crate::wire::Kind::BcastData, 1, 2, 0, 3);
        for batch in 0..3 {
            for i in batch * BATCH..(batch + 1) * BATCH {
                header.chunk = i as u32;
                a.queue(&header, i * chunk..(i + 1) * chunk, b.local_addr());
            }
            assert_eq!(a.flush(&source).unwrap(), BATCH);
        }
        assert!(b.wait_readable(Instant::now() + std::time::Duration::from_secs(5)).unwrap());
        let n = b.recv_batch().unwrap();
        assert_eq!(n, total, "{} super-packets, all in one recvmmsg", a.gso_sends().0);
        for i in 0..n {
            let d = b.datagram(i).unwrap();
            assert!(!d.truncated);
            let (got, _) = Header::read_from(d.bytes).unwrap();
            assert_eq!(got.chunk as usize, i);
            assert_eq!(&d.bytes[HDR_LEN..], &source[i * chunk..(i + 1) * chunk], "datagram {i}");
        }
        assert_eq!(b.gro_receives(), a.gso_sends(), "every super-packet sent was received whole");
    }
}
