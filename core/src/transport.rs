//! The UDP socket a communicator sends and receives its datagrams on.
//!
//! The socket is non-blocking: a receive first tries `recvfrom` and sleeps in
//! `poll` only when nothing is queued, so a datagram that is already there
//! costs one system call and no wake-up.

use std::{
    io,
    net::{Ipv4Addr, SocketAddr, SocketAddrV4, UdpSocket},
    os::fd::AsRawFd,
    time::Instant,
};

use crate::{
    config::{DEFAULT_PORT_BASE, DEFAULT_PORT_SPAN},
    Error, Result,
};

/// Longest wait for room in a full socket send buffer.
pub const SEND_STALL: std::time::Duration = std::time::Duration::from_secs(1);

/// Socket receive buffer asked for, so bursts from many ranks are not lost.
const RECV_BUFFER_BYTES: libc::c_int = 4 << 20;

/// A bound UDP socket.
pub struct Transport {
    socket: UdpSocket,
    local: SocketAddrV4,
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
        Ok(Transport { socket, local })
    }

    /// The bound address.
    pub fn local_addr(&self) -> SocketAddrV4 {
        self.local
    }

    /// Sends one datagram. While the socket buffer is full it waits for
    /// room, for [`SEND_STALL`] at most; other errors are returned.
    pub fn send(&self, datagram: &[u8], to: SocketAddrV4) -> Result<()> {
        let mut stalled_since: Option<Instant> = None;
        loop {
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
    pub fn recv(&self, buf: &mut [u8], deadline: Instant) -> Result<Option<(usize, SocketAddrV4)>> {
        loop {
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

    fn poll(&self, events: libc::c_short, timeout_ms: i32) -> Result<()> {
        let mut fd = libc::pollfd { fd: self.socket.as_raw_fd(), events, revents: 0 };
        // SAFETY: one valid pollfd.
        let rc = unsafe { libc::poll(&mut fd, 1, timeout_ms) };
        if rc < 0 {
            let err = io::Error::last_os_error();
            if err.kind() != io::ErrorKind::Interrupted {
                return Err(Error::system("poll on the UDP socket", err));
            }
        }
        Ok(())
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
}
