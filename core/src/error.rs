//! The one error type of AggBox, and the status codes it maps to at the C ABI.

use std::io;

/// What went wrong, with a message that says what failed and where.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// A caller passed something unusable (a NULL buffer, a rank out of range,
    /// a mismatched call); nothing was sent.
    #[error("invalid argument: {0}")]
    InvalidArgument(String),
    /// The ranks called a collective with arguments that disagree (another
    /// root, element type or count); every rank's call fails. Reported at
    /// the C ABI as `AGGBOX_ERR_INVALID_ARGUMENT`, as docs/BROADCAST.md
    /// specifies (unlike [`Error::InvalidArgument`], datagrams were sent).
    #[error("mismatched collective calls: {0}")]
    Mismatch(String),
    /// An operation did not complete within the configured timeout and no
    /// particular peer is to blame.
    #[error("timed out: {0}")]
    Timeout(String),
    /// A peer did not answer within the timeout, or sent something that shows
    /// it is not following the protocol; `rank` names it.
    #[error("rank {rank} failed: {what}")]
    PeerFailed {
        /// The rank that did not answer.
        rank: usize,
        /// The operation and what was missing.
        what: String,
    },
    /// A system call failed.
    #[error("{context}: {source}")]
    System {
        /// What AggBox was doing.
        context: String,
        /// The OS error.
        #[source]
        source: io::Error,
    },
    /// This host cannot do what was asked (for example the kernel datapath
    /// without CAP_BPF); the message says why and how to fix it.
    #[error("unsupported: {0}")]
    Unsupported(String),
    /// A bug in AggBox.
    #[error("internal error: {0}")]
    Internal(String),
}

impl Error {
    /// Wraps an OS error with what AggBox was doing when it happened.
    pub fn system(context: impl Into<String>, source: io::Error) -> Self {
        Error::System { context: context.into(), source }
    }

    /// The same error, its message prefixed with `what` (`"allgather: …"`).
    pub fn context(self, what: &str) -> Error {
        match self {
            Error::InvalidArgument(m) => Error::InvalidArgument(format!("{what}: {m}")),
            Error::Mismatch(m) => Error::Mismatch(format!("{what}: {m}")),
            Error::Timeout(m) => Error::Timeout(format!("{what}: {m}")),
            Error::PeerFailed { rank, what: w } => Error::PeerFailed { rank, what: format!("{what}: {w}") },
            Error::System { context, source } => Error::System { context: format!("{what}: {context}"), source },
            Error::Unsupported(m) => Error::Unsupported(format!("{what}: {m}")),
            Error::Internal(m) => Error::Internal(format!("{what}: {m}")),
        }
    }

    /// The `errno`-style numeric status of this error, as the C ABI reports it.
    pub fn status(&self) -> Status {
        match self {
            Error::InvalidArgument(_) | Error::Mismatch(_) => Status::InvalidArgument,
            Error::Timeout(_) => Status::Timeout,
            Error::PeerFailed { .. } => Status::PeerFailed,
            Error::System { .. } => Status::System,
            Error::Unsupported(_) => Status::Unsupported,
            Error::Internal(_) => Status::Internal,
        }
    }
}

/// Status codes, stable across versions (the C ABI's `aggbox_status`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(i32)]
pub enum Status {
    /// Success.
    Ok = 0,
    /// See [`Error::InvalidArgument`].
    InvalidArgument = 1,
    /// See [`Error::Timeout`].
    Timeout = 2,
    /// See [`Error::PeerFailed`].
    PeerFailed = 3,
    /// See [`Error::System`].
    System = 4,
    /// See [`Error::Unsupported`].
    Unsupported = 5,
    /// See [`Error::Internal`].
    Internal = 6,
}

/// Formats `error` with every error in its `source()` chain, so that the
/// OS error at the bottom (say "Operation not permitted") is not lost.
pub fn chain(error: &dyn std::error::Error) -> String {
    let mut text = error.to_string();
    let mut source = error.source();
    while let Some(inner) = source {
        let part = inner.to_string();
        if !text.contains(&part) {
            text.push_str(": ");
            text.push_str(&part);
        }
        source = inner.source();
    }
    text
}

/// The result type of AggBox.
pub type Result<T, E = Error> = std::result::Result<T, E>;
