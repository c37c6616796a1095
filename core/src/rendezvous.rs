//! How ranks find each other: a TCP store hosted by rank 0 at
//! `MASTER_ADDR:MASTER_PORT` (as torch's and Horovod's env rendezvous).
//!
//! Every other rank connects (retrying until rank 0 listens), says who it is
//! in one line, and gets back the whole table in a few lines: the group id and
//! the random group token rank 0 drew, then each rank's address, MAC, UDP port
//! and datapath. The text format is in `docs/PROTOCOL.md`.
//!
//! With `AGGBOX_STORE=external` the store is a [`Store`] of its own (`aggbox
//! store`) that outlives the ranks: every rank joins it as above, rank 0
//! too, and it keeps the table, so a rank that crashed and is started again
//! from the same address gets the same group back (crash-recovery
//! agreement, docs/AGREEMENT.md).

use std::{
    io::{self, BufRead, BufReader, Read, Write},
    net::{Ipv4Addr, SocketAddrV4, TcpListener, TcpStream},
    os::fd::AsRawFd,
    str::FromStr,
    sync::{
        atomic::{AtomicBool, Ordering},
        Arc,
    },
    thread::JoinHandle,
    time::{Duration, Instant},
};

use crate::{
    config::StoreHost,
    netif::{format_mac, parse_mac},
    Config, Datapath, Error, Result,
};

const HELLO: &str = "AGGBOX-HELLO";
const TABLE: &str = "AGGBOX-TABLE";
const REFUSED: &str = "AGGBOX-REFUSED";
const READY: &str = "AGGBOX-READY";
const GO: &str = "AGGBOX-GO";
const STORE_VERSION: u32 = 1;
/// How long rank 0 waits for a connection's hello line.
const HELLO_TIMEOUT: Duration = Duration::from_secs(2);
/// Longest line of the store protocol.
const MAX_LINE: u64 = 512;
/// Pause between connection attempts while rank 0 is not listening yet.
const RETRY_PAUSE: Duration = Duration::from_millis(20);

/// What every rank tells the others.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PeerInfo {
    /// Its rank.
    pub rank: usize,
    /// Its IPv4 address.
    pub ipv4: Ipv4Addr,
    /// Its MAC address.
    pub mac: [u8; 6],
    /// Its UDP port.
    pub port: u16,
    /// The datapath it runs (kernel or user).
    pub datapath: Datapath,
    /// The MTU of its interface (the group's chunk size follows the smallest).
    pub mtu: u32,
}

impl PeerInfo {
    /// Its UDP endpoint.
    pub fn addr(&self) -> SocketAddrV4 {
        SocketAddrV4::new(self.ipv4, self.port)
    }

    fn to_line(&self) -> String {
        format!(
            "{} {} {} {} {} {}",
            self.rank,
            self.ipv4,
            format_mac(&self.mac),
            self.port,
            self.datapath.name(),
            self.mtu
        )
    }

    fn from_fields(fields: &[&str]) -> Option<PeerInfo> {
        let [rank, ipv4, mac, port, datapath, mtu] = fields else { return None };
        Some(PeerInfo {
            rank: rank.parse().ok()?,
            ipv4: ipv4.parse().ok()?,
            mac: parse_mac(mac)?,
            port: port.parse().ok()?,
            datapath: Datapath::from_str(datapath).ok()?,
            mtu: mtu.parse().ok()?,
        })
    }
}

/// The outcome of rendezvous: the same on every rank.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct GroupInfo {
    /// Group id (random, nonzero).
    pub group: u32,
    /// Group token (random): datagrams without it are dropped.
    pub token: u64,
    /// Every rank, indexed by rank.
    pub peers: Vec<PeerInfo>,
}

fn random_u64() -> Result<u64> {
    let mut bytes = [0u8; 8];
    // SAFETY: getrandom writes at most bytes.len() bytes into bytes.
    let n = unsafe { libc::getrandom(bytes.as_mut_ptr().cast(), bytes.len(), 0) };
    if n != bytes.len() as isize {
        return Err(Error::system("getrandom", io::Error::last_os_error()));
    }
    Ok(u64::from_le_bytes(bytes))
}

fn store_error(store: SocketAddrV4, what: impl std::fmt::Display) -> Error {
    Error::system(format!("rendezvous with rank 0's store at {store}"), io::Error::other(what.to_string()))
}

/// Runs rendezvous for `me` as described by `config`, with nothing to set
/// up between the table and the start (see [`rendezvous_with`]).
pub fn rendezvous(config: &Config, me: PeerInfo) -> Result<GroupInfo> {
    rendezvous_with(config, me, |_| Ok(()))
}

/// Runs rendezvous for `me`; once the table is known, runs `setup` on it
/// (registering the group in the kernel maps), and returns only when every
/// rank's `setup` has succeeded: no rank sends a datagram before every
/// receiver is ready for it.
pub fn rendezvous_with(
    config: &Config,
    me: PeerInfo,
    setup: impl FnOnce(&GroupInfo) -> Result<()>,
) -> Result<GroupInfo> {
    let store = SocketAddrV4::new(config.master_addr, config.master_port);
    let deadline = Instant::now() + config.timeout;
    if config.rank == 0 && config.store == StoreHost::RankZero {
        host(config, store, me, deadline, setup)
    } else {
        join(config, store, me, deadline, setup)
    }
}

fn remaining(deadline: Instant) -> Option<Duration> {
    deadline.checked_duration_since(Instant::now()).filter(|d| !d.is_zero())
}

/// Rank 0: listen, collect every rank, draw the group id and token, answer.
fn host(
    config: &Config,
    store: SocketAddrV4,
    me: PeerInfo,
    deadline: Instant,
    setup: impl FnOnce(&GroupInfo) -> Result<()>,
) -> Result<GroupInfo> {
    let n = config.world_size;
    let mut peers: Vec<Option<PeerInfo>> = vec![None; n];
    peers[0] = Some(me);
    let mut streams: Vec<(usize, TcpStream)> = Vec::with_capacity(n.saturating_sub(1));
    if n > 1 {
        let listener = TcpListener::bind(store)
            .map_err(|e| Error::system(format!("rank 0 hosting the rendezvous store on {store}"), e))?;
        listener.set_nonblocking(true).map_err(|e| Error::system("listener", e))?;
        while peers.iter().any(Option::is_none) {
            let Some(left) = remaining(deadline) else {
                let missing: Vec<String> = peers
                    .iter()
                    .enumerate()
                    .filter(|(_, p)| p.is_none())
                    .map(|(r, _)| r.to_string())
                    .collect();
                return Err(Error::Timeout(format!(
                    "rendezvous at {store}: rank{} {} of {n} did not arrive within {} ms",
                    if missing.len() > 1 { "s" } else { "" },
                    missing.join(", "),
                    config.timeout.as_millis()
                )));
            };
            let stream = match listener.accept() {
                Ok((stream, _)) => stream,
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                    let mut fd = libc::pollfd {
                        fd: std::os::fd::AsRawFd::as_raw_fd(&listener),
                        events: libc::POLLIN,
                        revents: 0,
                    };
                    let ms = left.as_millis().clamp(1, 100) as i32;
                    // SAFETY: one valid pollfd.
                    unsafe { libc::poll(&mut fd, 1, ms) };
                    continue;
                }
                Err(e) => return Err(Error::system("accepting a rank at the rendezvous store", e)),
            };
            let Some((peer, stream)) = read_hello(stream, n, left)? else { continue };
            if let Some(earlier) = &peers[peer.rank] {
                return Err(Error::InvalidArgument(format!(
                    "rendezvous at {store}: rank {} arrived twice (from {} and {})",
                    peer.rank, earlier.ipv4, peer.ipv4
                )));
            }
            let rank = peer.rank;
            peers[rank] = Some(peer);
            streams.push((rank, stream));
        }
    }
    let info = new_group(peers.into_iter().map(|p| p.expect("every rank arrived")).collect())?;
    let table = table_text(&info);
    setup(&info)?;
    // Everyone gets the table even if one write fails; then report it.
    let mut sent: Result<()> = Ok(());
    for (rank, stream) in &mut streams {
        if let Err(e) = stream.write_all(table.as_bytes()) {
            if sent.is_ok() {
                sent = Err(Error::system(format!("sending the rendezvous table to rank {rank}"), e));
            }
        }
    }
    sent?;
    // Every rank sets up, then says READY; then everyone may start.
    for (rank, stream) in &mut streams {
        let left = remaining(deadline).unwrap_or(Duration::from_millis(1));
        stream.set_read_timeout(Some(left)).ok();
        let mut line = String::new();
        let got = BufReader::new(&*stream).read_line(&mut line);
        if !matches!(got, Ok(n) if n > 0) || line.trim() != READY {
            return Err(Error::PeerFailed {
                rank: *rank,
                what: format!(
                    "rendezvous at {store}: rank {rank} did not get ready (its datapath set-up failed, or it is gone): {}",
                    if line.trim().is_empty() { "no answer".to_string() } else { line.trim().to_string() }
                ),
            });
        }
    }
    for (_, stream) in &mut streams {
        stream.write_all(format!("{GO}\n").as_bytes()).map_err(|e| Error::system("sending go", e))?;
    }
    Ok(info)
}

/// Reads one rank's hello line. A connection that says nothing useful (a
/// port scanner, a rank of another job) is refused and skipped; a rank of
/// this job with the wrong world size is an error for everyone.
fn read_hello(stream: TcpStream, n: usize, left: Duration) -> Result<Option<(PeerInfo, TcpStream)>> {
    read_hello_from(stream, n, left, false)
}

/// [`read_hello`]; `rank0`: rank 0 may say hello too (an external store).
fn read_hello_from(
    stream: TcpStream,
    n: usize,
    left: Duration,
    rank0: bool,
) -> Result<Option<(PeerInfo, TcpStream)>> {
    stream.set_nonblocking(false).ok();
    // A connection that says nothing (a health probe) must not stall the
    // store, and a line may not grow without bound.
    stream.set_read_timeout(Some(left.min(HELLO_TIMEOUT))).ok();
    let mut line = String::new();
    let mut reader = BufReader::new(stream);
    if (&mut reader).take(MAX_LINE).read_line(&mut line).is_err() || !line.ends_with('\n') {
        return Ok(None);
    }
    let mut stream = reader.into_inner();
    let fields: Vec<&str> = line.split_whitespace().collect();
    let parsed = match fields.as_slice() {
        [HELLO, version, world, rest @ ..] if *version == STORE_VERSION.to_string() => {
            world.parse::<usize>().ok().zip(PeerInfo::from_fields(rest))
        }
        _ => None,
    };
    let Some((world, peer)) = parsed else {
        let _ = writeln!(stream, "{REFUSED} not an AggBox hello of version {STORE_VERSION}");
        return Ok(None);
    };
    if world != n || (peer.rank == 0 && !rank0) || peer.rank >= n {
        let why = format!(
            "rank {} says world size {world}, the store has {n}: every rank must be started with the same WORLD_SIZE",
            peer.rank
        );
        let _ = writeln!(stream, "{REFUSED} {why}");
        return Err(Error::InvalidArgument(format!("rendezvous: {why}")));
    }
    Ok(Some((peer, stream)))
}

/// The table's text, as the store sends it.
fn table_text(info: &GroupInfo) -> String {
    let mut table = format!("{TABLE} {STORE_VERSION} {} {} {}\n", info.group, info.token, info.peers.len());
    for peer in &info.peers {
        table.push_str(&peer.to_line());
        table.push('\n');
    }
    table
}

/// Waits (until `wait`) for a rank's READY on `stream` after it got the
/// table; returns whether it came.
fn await_ready(stream: &mut TcpStream, wait: Duration) -> bool {
    stream.set_read_timeout(Some(wait)).ok();
    let mut line = String::new();
    matches!(BufReader::new(&*stream).take(MAX_LINE).read_line(&mut line), Ok(n) if n > 0) && line.trim() == READY
}

/// Hands the table to one rank (a rejoin): the table, its READY, the go.
fn hand_out(mut stream: TcpStream, table: &str, wait: Duration) -> bool {
    stream.write_all(table.as_bytes()).is_ok()
        && await_ready(&mut stream, wait)
        && stream.write_all(format!("{GO}\n").as_bytes()).is_ok()
}

/// How long an external store waits for a rank to set up after it sent it
/// the table.
const STORE_READY_WAIT: Duration = Duration::from_secs(10);

/// A rendezvous store of its own (`AGGBOX_STORE=external`), serving one
/// group of `world_size` ranks from a thread until it is dropped.
///
/// It collects every rank's hello (rank 0's too), draws the group id and
/// token, and hands the table out as rank 0 does. Then it keeps it: a rank
/// that says hello again later, from the same address, MAC, port and
/// datapath (a process that crashed and was started again), gets the same
/// table and joins the running group; one from anywhere else is refused with
/// the reason, since the other ranks' tables (and kernel maps) still say
/// where that rank was.
pub struct Store {
    addr: SocketAddrV4,
    stop: Arc<AtomicBool>,
    thread: Option<JoinHandle<()>>,
}

impl Store {
    /// Serves a group of `world_size` ranks on `listener`.
    pub fn serve(listener: TcpListener, world_size: usize) -> Result<Store> {
        if world_size == 0 || world_size > crate::wire::MAX_RANKS {
            return Err(Error::InvalidArgument(format!("store: world size {world_size} is not in 1..={}", crate::wire::MAX_RANKS)));
        }
        let addr = match listener.local_addr().map_err(|e| Error::system("store address", e))? {
            std::net::SocketAddr::V4(addr) => addr,
            other => return Err(Error::InvalidArgument(format!("store: {other} is not an IPv4 address"))),
        };
        listener.set_nonblocking(true).map_err(|e| Error::system("store listener", e))?;
        let stop = Arc::new(AtomicBool::new(false));
        let flag = Arc::clone(&stop);
        let thread = std::thread::Builder::new()
            .name("aggbox-store".into())
            .spawn(move || serve_store(listener, world_size, &flag))
            .map_err(|e| Error::system("starting the store thread", e))?;
        Ok(Store { addr, stop, thread: Some(thread) })
    }

    /// Where it listens.
    pub fn addr(&self) -> SocketAddrV4 {
        self.addr
    }
}

impl Drop for Store {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

/// The store's loop: form the group, then answer rejoins, until `stop`.
fn serve_store(listener: TcpListener, n: usize, stop: &AtomicBool) {
    let mut peers: Vec<Option<PeerInfo>> = vec![None; n];
    let mut waiting: Vec<Option<TcpStream>> = (0..n).map(|_| None).collect();
    let mut group: Option<(GroupInfo, String)> = None;
    while !stop.load(Ordering::Relaxed) {
        let stream = match listener.accept() {
            Ok((stream, _)) => stream,
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                let mut fd = libc::pollfd { fd: listener.as_raw_fd(), events: libc::POLLIN, revents: 0 };
                // SAFETY: one valid pollfd.
                unsafe { libc::poll(&mut fd, 1, 20) };
                continue;
            }
            Err(e) => {
                tracing::warn!("store: accept: {e}");
                std::thread::sleep(Duration::from_millis(20));
                continue;
            }
        };
        let Ok(Some((peer, mut stream))) = read_hello_from(stream, n, HELLO_TIMEOUT, true) else { continue };
        let rank = peer.rank;
        match &group {
            None => {
                // A rank that restarts during formation replaces its hello.
                peers[rank] = Some(peer);
                waiting[rank] = Some(stream);
                if peers.iter().all(Option::is_some) {
                    let Ok(info) = new_group(peers.iter().map(|p| p.clone().expect("every rank said hello")).collect()) else {
                        continue;
                    };
                    let table = table_text(&info);
                    // As rank 0 does: the table to everyone, every READY,
                    // then the go, so the ranks set up at the same time.
                    let mut streams: Vec<(usize, TcpStream)> =
                        waiting.iter_mut().enumerate().filter_map(|(r, s)| s.take().map(|s| (r, s))).collect();
                    streams.retain_mut(|(_, s)| s.write_all(table.as_bytes()).is_ok());
                    let deadline = Instant::now() + STORE_READY_WAIT;
                    streams.retain_mut(|(r, s)| {
                        let ready = await_ready(s, remaining(deadline).unwrap_or(Duration::from_millis(1)));
                        if !ready {
                            tracing::warn!("store: rank {r} did not get ready; it may rejoin");
                        }
                        ready
                    });
                    for (_, s) in &mut streams {
                        let _ = s.write_all(format!("{GO}\n").as_bytes());
                    }
                    group = Some((info, table));
                }
            }
            Some((info, table)) => {
                if info.peers[rank] != peer {
                    let _ = writeln!(
                        stream,
                        "{REFUSED} rank {rank} rejoins from {} but the group has it at {}: start it again with the same address, port (AGGBOX_PORT) and datapath",
                        peer.to_line(),
                        info.peers[rank].to_line()
                    );
                    continue;
                }
                // Each rejoin in a thread of its own: a rank setting up (or
                // killed while it does) holds up no other.
                let table = table.clone();
                let started = std::thread::Builder::new().name("aggbox-store-rejoin".into()).spawn(move || {
                    if !hand_out(stream, &table, STORE_READY_WAIT) {
                        tracing::warn!("store: rank {rank} rejoined but did not get ready");
                    }
                });
                if let Err(e) = started {
                    tracing::warn!("store: no thread for rank {rank}'s rejoin: {e}");
                }
            }
        }
    }
}

/// A new group of `peers`: a random nonzero id and a random token.
fn new_group(peers: Vec<PeerInfo>) -> Result<GroupInfo> {
    let group = loop {
        let candidate = random_u64()? as u32;
        if candidate != 0 {
            break candidate;
        }
    };
    Ok(GroupInfo { group, token: random_u64()?, peers })
}

/// Any other rank: connect (retrying while rank 0 is not up), say hello,
/// read the table.
fn join(
    config: &Config,
    store: SocketAddrV4,
    me: PeerInfo,
    deadline: Instant,
    setup: impl FnOnce(&GroupInfo) -> Result<()>,
) -> Result<GroupInfo> {
    let n = config.world_size;
    let external = config.store == StoreHost::External;
    // Rank 0 is to blame when it hosts the store; an external store is no
    // rank.
    let store_failed = |what: String| {
        if external {
            Error::Timeout(what.replace("rank 0's store", "the store"))
        } else {
            Error::PeerFailed { rank: 0, what }
        }
    };
    let mut last_error: Option<io::Error> = None;
    let stream = loop {
        let Some(left) = remaining(deadline) else {
            return Err(store_failed(format!(
                "rendezvous: rank 0's store at {store} did not answer within {} ms (last error: {})",
                config.timeout.as_millis(),
                last_error.map_or_else(|| "none".to_string(), |e| e.to_string())
            )));
        };
        match TcpStream::connect_timeout(&store.into(), left) {
            Ok(stream) => break stream,
            Err(e) => {
                last_error = Some(e);
                std::thread::sleep(RETRY_PAUSE.min(left));
            }
        }
    };
    let timeout_error = || {
        store_failed(format!(
            "rendezvous: rank 0's store at {store} did not send the table and the go within {} ms (have all {n} ranks started?)",
            config.timeout.as_millis()
        ))
    };
    let mut writer = stream.try_clone().map_err(|e| Error::system("rendezvous socket", e))?;
    writeln!(writer, "{HELLO} {STORE_VERSION} {n} {}", me.to_line())
        .map_err(|e| store_error(store, e))?;
    let mut reader = BufReader::new(stream);
    let read_line = |reader: &mut BufReader<TcpStream>| -> Result<String> {
        let left = remaining(deadline).ok_or_else(timeout_error)?;
        reader.get_ref().set_read_timeout(Some(left)).ok();
        let mut line = String::new();
        match reader.read_line(&mut line) {
            Ok(0) => Err(store_error(store, "rank 0 closed the connection before sending the table")),
            Ok(_) => Ok(line),
            Err(e) if matches!(e.kind(), io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut) => {
                Err(timeout_error())
            }
            Err(e) => Err(store_error(store, e)),
        }
    };
    let head = read_line(&mut reader)?;
    let fields: Vec<&str> = head.split_whitespace().collect();
    let (group, token) = match fields.as_slice() {
        [TABLE, version, group, token, count]
            if *version == STORE_VERSION.to_string() && count.parse() == Ok(n) =>
        {
            (group.parse().ok(), token.parse().ok())
        }
        [REFUSED, why @ ..] => {
            return Err(Error::InvalidArgument(format!("rendezvous: rank 0 refused us: {}", why.join(" "))))
        }
        _ => (None, None),
    };
    let (Some(group), Some(token)) = (group, token) else {
        return Err(store_error(store, format!("unexpected answer {:?}", head.trim())));
    };
    let mut peers = Vec::with_capacity(n);
    for rank in 0..n {
        let line = read_line(&mut reader)?;
        let fields: Vec<&str> = line.split_whitespace().collect();
        match PeerInfo::from_fields(&fields) {
            Some(peer) if peer.rank == rank => peers.push(peer),
            _ => return Err(store_error(store, format!("bad table line {:?}", line.trim()))),
        }
    }
    let info = GroupInfo { group, token, peers };
    setup(&info)?;
    writeln!(writer, "{READY}").map_err(|e| store_error(store, e))?;
    match read_line(&mut reader)?.trim() {
        GO => Ok(info),
        other => Err(store_error(store, format!("expected {GO}, got {other:?}"))),
    }
}

#[cfg(test)]
mod tests {
    use std::thread;

    use super::*;

    fn me(rank: usize, port: u16) -> PeerInfo {
        PeerInfo {
            rank,
            ipv4: Ipv4Addr::LOCALHOST,
            mac: [2, 0, 0, 0, 0, rank as u8],
            port,
            datapath: if rank.is_multiple_of(2) { Datapath::User } else { Datapath::Kernel },
            mtu: 1500 + rank as u32,
        }
    }

    fn config(rank: usize, world: usize, master_port: u16, ms: u64) -> Config {
        Config {
            rank,
            world_size: world,
            master_port,
            timeout: Duration::from_millis(ms),
            ..Config::default()
        }
    }

    #[test]
    fn four_ranks_agree_on_one_table() {
        let port = 29_611;
        let handles: Vec<_> = (0..4)
            .map(|rank| {
                thread::spawn(move || rendezvous(&config(rank, 4, port, 10_000), me(rank, 100 + rank as u16)))
            })
            .collect();
        let tables: Vec<GroupInfo> = handles.into_iter().map(|h| h.join().unwrap().unwrap()).collect();
        for table in &tables {
            assert_eq!(table, &tables[0]);
        }
        assert_ne!(tables[0].group, 0);
        let expected: Vec<PeerInfo> = (0..4).map(|r| me(r, 100 + r as u16)).collect();
        assert_eq!(tables[0].peers, expected);
    }

    #[test]
    fn a_silent_connection_does_not_stall_the_store() {
        let port = 29_616;
        let host = thread::spawn(move || rendezvous(&config(0, 2, port, 8_000), me(0, 1)));
        // A probe connects first and says nothing.
        let probe = loop {
            if let Ok(stream) = TcpStream::connect(("127.0.0.1", port)) {
                break stream;
            }
            thread::sleep(Duration::from_millis(10));
        };
        let joined = rendezvous(&config(1, 2, port, 8_000), me(1, 1)).unwrap();
        let hosted = host.join().unwrap().unwrap();
        assert_eq!(joined, hosted);
        drop(probe);
    }

    #[test]
    fn missing_ranks_are_named() {
        let port = 29_612;
        let joined = thread::spawn(move || rendezvous(&config(2, 4, port, 3_000), me(2, 1)));
        let err = rendezvous(&config(0, 4, port, 500), me(0, 1)).unwrap_err();
        assert!(matches!(err, Error::Timeout(_)), "{err}");
        assert!(err.to_string().contains("ranks 1, 3 of 4 did not arrive within 500 ms"), "{err}");
        let err = joined.join().unwrap().unwrap_err();
        assert!(err.to_string().contains("rank 0"), "{err}");
    }

    #[test]
    fn absent_rank_zero_is_named() {
        let err = rendezvous(&config(1, 2, 29_613, 200), me(1, 1)).unwrap_err();
        assert!(matches!(err, Error::PeerFailed { rank: 0, .. }), "{err}");
        assert!(err.to_string().contains("did not answer within 200 ms"), "{err}");
    }

    #[test]
    fn a_rank_whose_setup_fails_is_named_and_nobody_starts() {
        let port = 29_615;
        let failing = thread::spawn(move || {
            rendezvous_with(&config(1, 2, port, 3_000), me(1, 1), |_| Err(Error::Unsupported("no XDP here".into())))
        });
        let err = rendezvous_with(&config(0, 2, port, 3_000), me(0, 1), |_| Ok(())).unwrap_err();
        assert!(matches!(err, Error::PeerFailed { rank: 1, .. }), "{err}");
        assert!(err.to_string().contains("rank 1 did not get ready"), "{err}");
        assert!(failing.join().unwrap().unwrap_err().to_string().contains("no XDP here"));
    }

    #[test]
    fn an_external_store_forms_the_group_and_lets_a_restarted_rank_rejoin() {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let store = Store::serve(listener, 3).unwrap();
        let port = store.addr().port();
        let external = move |rank| Config { store: StoreHost::External, ..config(rank, 3, port, 5_000) };
        let handles: Vec<_> = (0..3).map(|rank| thread::spawn(move || rendezvous(&external(rank), me(rank, 7)))).collect();
        let tables: Vec<GroupInfo> = handles.into_iter().map(|h| h.join().unwrap().unwrap()).collect();
        assert!(tables.iter().all(|t| t == &tables[0]));
        let expected: Vec<PeerInfo> = (0..3).map(|r| me(r, 7)).collect();
        assert_eq!(tables[0].peers, expected);
        // Rank 0 crashed and comes back from the same address: same group.
        assert_eq!(rendezvous(&external(0), me(0, 7)).unwrap(), tables[0]);
        // From another port it is refused, with the reason.
        let err = rendezvous(&external(2), me(2, 8)).unwrap_err();
        assert!(err.to_string().contains("rejoins from"), "{err}");
    }

    #[test]
    fn world_size_mismatch_fails_both_sides() {
        let port = 29_614;
        let joined = thread::spawn(move || rendezvous(&config(1, 3, port, 3_000), me(1, 1)));
        let err = rendezvous(&config(0, 2, port, 3_000), me(0, 1)).unwrap_err();
        assert!(err.to_string().contains("same WORLD_SIZE"), "{err}");
        let err = joined.join().unwrap().unwrap_err();
        assert!(err.to_string().contains("refused"), "{err}");
    }
}
