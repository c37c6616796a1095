//! `aggbox_allreduce`, `aggbox_reduce`, `aggbox_reduce_scatter`,
//! `aggbox_allgather` and `aggbox_iallreduce`: the reduction collectives of
//! a communicator (and allgather, their companion), blocking and
//! asynchronous.
//!
//! Each export checks every argument here, before anything is sent (and
//! before an asynchronous one returns), and then runs the core collective
//! through the communicator's progress machinery, as `aggbox_broadcast`
//! does.

use std::{
    ops::Range,
    os::raw::{c_int, c_void},
    ptr::{self, NonNull},
};

use aggbox_core::{Comm, Dtype, Error, ReduceOp, Result};

use super::{aggbox_comm, CommRef};
use crate::{
    boundary::{invalid, status_call, try_write},
    request::aggbox_request,
    types::{aggbox_dtype, aggbox_status, RawDtype, RawOp},
};

/// The most elements one operation carries: the datagram header's count is
/// 32 bits (for allgather, each rank's block is one broadcast).
const MAX_ELEMENTS: usize = u32::MAX as usize;

/// A caller's buffer: `len` bytes at `ptr`, dangling when empty.
#[derive(Clone, Copy, Debug)]
struct Span {
    ptr: NonNull<u8>,
    len: usize,
}

impl Span {
    /// The `len` bytes at `ptr`, the argument called `name`, which may be
    /// NULL only when `len` is 0 (`count` says how the length was asked
    /// for, in the message).
    fn new(ptr: *const c_void, len: usize, name: &str, count: &str) -> Result<Span> {
        match NonNull::new(ptr.cast_mut().cast::<u8>()) {
            Some(ptr) => Ok(Span { ptr, len }),
            None if len == 0 => Ok(Span::empty()),
            None => Err(invalid(format!("{name} is NULL with {count}"))),
        }
    }

    /// No bytes.
    fn empty() -> Span {
        Span {
            ptr: NonNull::dangling(),
            len: 0,
        }
    }

    /// The addresses it covers.
    fn addresses(&self) -> Range<usize> {
        let start = self.ptr.as_ptr() as usize;
        start..start.saturating_add(self.len)
    }

    /// Whether it shares a byte with `other`.
    fn overlaps(&self, other: &Span) -> bool {
        let (a, b) = (self.addresses(), other.addresses());
        !a.is_empty() && !b.is_empty() && a.start < b.end && b.start < a.end
    }

    /// Its bytes, to read.
    ///
    /// # Safety
    ///
    /// The caller's buffer is valid for reading `len` bytes and nothing
    /// writes it while the slice lives.
    unsafe fn bytes<'a>(&self) -> &'a [u8] {
        // SAFETY: the caller's promise; dangling (and aligned for u8) only
        // when empty; `len` fits `isize` (`Dtype::bytes` checked it).
        unsafe { std::slice::from_raw_parts(self.ptr.as_ptr(), self.len) }
    }

    /// Its bytes, to read and write.
    ///
    /// # Safety
    ///
    /// The caller's buffer is valid for reading and writing `len` bytes and
    /// nothing else uses it while the slice lives.
    #[allow(clippy::mut_from_ref)]
    unsafe fn bytes_mut<'a>(&self) -> &'a mut [u8] {
        // SAFETY: as in `bytes`.
        unsafe { std::slice::from_raw_parts_mut(self.ptr.as_ptr(), self.len) }
    }
}

/// Which collective, with what only it takes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Collective {
    Allreduce(ReduceOp),
    Reduce(ReduceOp, usize),
    ReduceScatter(ReduceOp),
    Allgather,
}

/// Where a checked call's data comes from and goes.
#[derive(Clone, Copy, Debug)]
enum Bufs {
    /// One buffer, read and then overwritten with the result
    /// (`sendbuf == recvbuf`).
    InPlace(Span),
    /// Read from the first, the result written into the second, which is
    /// disjoint from it (and empty for a reduce at a rank that is not the
    /// root).
    Apart(Span, Span),
}

/// A call's checked arguments, ready to run on the communicator.
#[derive(Debug)]
struct Call {
    collective: Collective,
    dtype: Dtype,
    bufs: Bufs,
}

// SAFETY: the caller promises that its buffers stay valid, and are used by
// nothing else (the send buffer: written by nothing else), until the
// operation has finished: the thread that runs the operation may then own
// them.
unsafe impl Send for Call {}

/// The element type `raw` names.
fn dtype_of(raw: RawDtype) -> Result<Dtype> {
    Ok(aggbox_dtype::from_raw(raw)
        .ok_or_else(|| invalid(format!("dtype {raw} is not an aggbox_dtype")))?
        .into())
}

/// The operator `raw` names, checked against `dtype` (AVG takes floats
/// only; u8 is not reduced).
fn op_of(raw: RawOp, dtype: Dtype) -> Result<ReduceOp> {
    let op = u8::try_from(raw)
        .ok()
        .and_then(ReduceOp::from_code)
        .ok_or_else(|| invalid(format!("op {raw} is not an aggbox_op")))?;
    op.check(dtype)?;
    Ok(op)
}

/// `root` as a rank of `comm`'s group.
fn root_of(comm: &aggbox_comm, root: c_int) -> Result<usize> {
    let ranks = comm.size();
    usize::try_from(root)
        .ok()
        .filter(|&r| r < ranks as usize)
        .ok_or_else(|| invalid(format!("root {root} is not a rank of this group of {ranks}")))
}

/// Bytes of `count` elements of `dtype`, where `count` is at most what one
/// operation carries (`what` names the count in messages).
fn bytes_of(dtype: Dtype, count: usize, what: &str) -> Result<usize> {
    if count > MAX_ELEMENTS {
        return Err(invalid(format!(
            "{what} {count} is more elements than one operation carries ({MAX_ELEMENTS})"
        )));
    }
    dtype.bytes(count)
}

/// `count x ranks`, the whole vector of a reduce-scatter or an allgather
/// (`what` names the count in messages).
fn times_ranks(count: usize, ranks: c_int, what: &str) -> Result<usize> {
    count
        .checked_mul(ranks as usize)
        .ok_or_else(|| invalid(format!("{what} {count} × {ranks} ranks overflows size_t")))
}

/// The buffers of a call that may run in place: in place when `sendbuf`
/// and `recvbuf` are the same pointer, else two disjoint buffers.
fn in_place_or_apart(send: Span, recv: Span, name: &str) -> Result<Bufs> {
    if send.ptr == recv.ptr && send.len == recv.len {
        return Ok(Bufs::InPlace(recv));
    }
    if send.overlaps(&recv) {
        return Err(invalid(format!(
            "sendbuf and recvbuf overlap without being the same buffer: pass the same pointer \
             for an in-place {name}, or disjoint buffers"
        )));
    }
    Ok(Bufs::Apart(send, recv))
}

/// The buffers of a call that never runs in place: disjoint.
fn apart(send: Span, recv: Span, name: &str) -> Result<Bufs> {
    if send.overlaps(&recv) {
        return Err(invalid(format!(
            "sendbuf and recvbuf overlap: {name} takes disjoint buffers"
        )));
    }
    Ok(Bufs::Apart(send, recv))
}

impl Call {
    /// Checks the arguments of `aggbox_allreduce`.
    fn allreduce(
        sendbuf: *const c_void,
        recvbuf: *mut c_void,
        count: usize,
        dtype: RawDtype,
        op: RawOp,
    ) -> Result<Call> {
        let dtype = dtype_of(dtype)?;
        let op = op_of(op, dtype)?;
        let len = bytes_of(dtype, count, "count")?;
        let what = format!("count {count}");
        let send = Span::new(sendbuf, len, "sendbuf", &what)?;
        let recv = Span::new(recvbuf, len, "recvbuf", &what)?;
        Ok(Call {
            collective: Collective::Allreduce(op),
            dtype,
            bufs: in_place_or_apart(send, recv, "allreduce")?,
        })
    }

    /// Checks the arguments of `aggbox_reduce` against `comm`'s group.
    fn reduce(
        comm: &aggbox_comm,
        sendbuf: *const c_void,
        recvbuf: *mut c_void,
        count: usize,
        dtype: RawDtype,
        op: RawOp,
        root: c_int,
    ) -> Result<Call> {
        let dtype = dtype_of(dtype)?;
        let op = op_of(op, dtype)?;
        let root = root_of(comm, root)?;
        let len = bytes_of(dtype, count, "count")?;
        let what = format!("count {count}");
        let send = Span::new(sendbuf, len, "sendbuf", &what)?;
        let bufs = if comm.rank() as usize == root {
            let recv = Span::new(recvbuf, len, "recvbuf", &format!("{what} at the root"))?;
            in_place_or_apart(send, recv, "reduce")?
        } else {
            // Not used elsewhere: not even looked at.
            Bufs::Apart(send, Span::empty())
        };
        Ok(Call {
            collective: Collective::Reduce(op, root),
            dtype,
            bufs,
        })
    }

    /// Checks the arguments of `aggbox_reduce_scatter` against `comm`'s
    /// group.
    fn reduce_scatter(
        comm: &aggbox_comm,
        sendbuf: *const c_void,
        recvbuf: *mut c_void,
        recvcount: usize,
        dtype: RawDtype,
        op: RawOp,
    ) -> Result<Call> {
        let dtype = dtype_of(dtype)?;
        let op = op_of(op, dtype)?;
        let total = times_ranks(recvcount, comm.size(), "recvcount")?;
        let send_len = bytes_of(
            dtype,
            total,
            &format!("recvcount {recvcount} × {} ranks =", comm.size()),
        )?;
        let recv_len = dtype.bytes(recvcount)?;
        let what = format!("recvcount {recvcount}");
        let send = Span::new(sendbuf, send_len, "sendbuf", &what)?;
        let recv = Span::new(recvbuf, recv_len, "recvbuf", &what)?;
        Ok(Call {
            collective: Collective::ReduceScatter(op),
            dtype,
            bufs: apart(send, recv, "reduce-scatter")?,
        })
    }

    /// Checks the arguments of `aggbox_allgather` against `comm`'s group.
    fn allgather(
        comm: &aggbox_comm,
        sendbuf: *const c_void,
        recvbuf: *mut c_void,
        sendcount: usize,
        dtype: RawDtype,
    ) -> Result<Call> {
        let dtype = dtype_of(dtype)?;
        let total = times_ranks(sendcount, comm.size(), "sendcount")?;
        let send_len = bytes_of(dtype, sendcount, "sendcount")?;
        let recv_len = dtype.bytes(total)?;
        let what = format!("sendcount {sendcount}");
        let send = Span::new(sendbuf, send_len, "sendbuf", &what)?;
        let recv = Span::new(recvbuf, recv_len, "recvbuf", &what)?;
        Ok(Call {
            collective: Collective::Allgather,
            dtype,
            bufs: apart(send, recv, "allgather")?,
        })
    }

    /// Runs it on `comm`.
    fn run(self, comm: &mut Comm) -> Result<()> {
        let dtype = self.dtype;
        // SAFETY (every slice below): the spans are the caller's buffers,
        // valid and ours until the call returns (its promise; the checks
        // made sure their lengths fit in memory); a send span and a receive
        // span never overlap (`apart`, `in_place_or_apart`), so no byte is
        // both read through a shared slice and written through another.
        match (self.collective, self.bufs) {
            (Collective::Allreduce(op), Bufs::InPlace(buf)) => comm.allreduce(unsafe { buf.bytes_mut() }, dtype, op),
            (Collective::Allreduce(op), Bufs::Apart(send, recv)) => {
                comm.allreduce_from(unsafe { send.bytes() }, unsafe { recv.bytes_mut() }, dtype, op)
            }
            (Collective::Reduce(op, root), Bufs::InPlace(buf)) => {
                comm.reduce(unsafe { buf.bytes_mut() }, dtype, op, root)
            }
            (Collective::Reduce(op, root), Bufs::Apart(send, recv)) => {
                comm.reduce_from(unsafe { send.bytes() }, unsafe { recv.bytes_mut() }, dtype, op, root)
            }
            (Collective::ReduceScatter(op), Bufs::Apart(send, recv)) => {
                comm.reduce_scatter(unsafe { send.bytes() }, unsafe { recv.bytes_mut() }, dtype, op)
            }
            (Collective::Allgather, Bufs::Apart(send, recv)) => {
                comm.allgather(unsafe { send.bytes() }, unsafe { recv.bytes_mut() }, dtype)
            }
            (collective, Bufs::InPlace(_)) => Err(Error::Internal(format!(
                "{collective:?} was checked to run in place, which it does not"
            ))),
        }
    }
}

/// Runs `call`, checked by `check` against the communicator, where blocking
/// calls run (see `aggbox_broadcast`).
///
/// # Safety
///
/// `comm` is NULL or a live communicator.
unsafe fn blocking(comm: *mut aggbox_comm, check: impl FnOnce(&aggbox_comm) -> Result<Call>) -> Result<()> {
    // SAFETY: the caller's promise.
    let handle = unsafe { CommRef::new(comm) }?;
    let call = check(&handle)?;
    handle.progress().run(&handle, move |comm| call.run(comm))
}

/// Reduces `count` elements of `dtype` with `op` across every rank of
/// `comm`: when it returns `AGGBOX_OK`, every rank's `recvbuf` holds, at
/// each index, `op` over the ranks' `sendbuf` at that index (as
/// `MPI_Allreduce`). In place when `sendbuf == recvbuf` (the buffer is read,
/// then overwritten with the result); otherwise the two must not overlap.
/// Every rank calls it with the same `count`, `dtype` and `op`, in the same
/// order as its other collectives.
///
/// `AGGBOX_OP_SUM` wraps around on integers; `AGGBOX_OP_MIN` and
/// `AGGBOX_OP_MAX` give NaN when any contribution is NaN;
/// `AGGBOX_OP_AVG` (floats only) is the sum divided by the number of ranks.
/// Every rank gets the same result, bit for bit. A float SUM or AVG is
/// computed as a sum of integers quantized below a scale the ranks agree
/// on (the largest |x| of the call, on any rank, rounded up to a power of
/// two), so its result does not depend on the order contributions arrive
/// in, and it is off by less than 3.0e-7 x N x max|x| (f32) or 1.2e-16 x
/// N x max|x| (f64), N ranks: an element much smaller than max|x| keeps
/// fewer significant bits. When an input is NaN or infinite (or all are
/// 0) the floats are summed instead, IEEE addition in arrival order
/// (docs/ALLREDUCE.md).
///
/// Fails, with nothing sent, with `AGGBOX_ERR_INVALID_ARGUMENT` when
/// `sendbuf` or `recvbuf` is NULL and `count` is not 0, the two overlap
/// without being equal, `dtype` is not an `aggbox_dtype` or is
/// `AGGBOX_DTYPE_U8` (bytes are broadcast, not reduced), `op` is not an
/// `aggbox_op`, `op` is `AGGBOX_OP_AVG` and `dtype` an integer type,
/// `count` elements do not fit in memory or are more than 2^32 - 1. Fails
/// with `AGGBOX_ERR_INVALID_ARGUMENT` on every rank, the message saying
/// "mismatched collective calls", when the ranks' `count`, `dtype` or `op`
/// disagree; with `AGGBOX_ERR_PEER_FAILED` naming a rank that stopped
/// answering within the timeout. After a failure `recvbuf` may hold part of
/// the result.
///
/// While an asynchronous operation on `comm` (`aggbox_ibroadcast`,
/// `aggbox_iallreduce`) is pending, this call queues behind it (and any
/// other pending operation) and blocks until its turn has come and gone.
/// The library keeps no pointer to either buffer after it returns.
///
/// # Safety
///
/// `comm` is NULL or a live communicator; `sendbuf` is NULL or valid for
/// reading `count` elements of `dtype`, `recvbuf` NULL or valid for reading
/// and writing them.
#[no_mangle]
pub unsafe extern "C" fn aggbox_allreduce(
    comm: *mut aggbox_comm,
    sendbuf: *const c_void,
    recvbuf: *mut c_void,
    count: usize,
    dtype: RawDtype,
    op: RawOp,
) -> aggbox_status {
    status_call("aggbox_allreduce", || {
        // SAFETY: the caller's promise.
        unsafe { blocking(comm, |_| Call::allreduce(sendbuf, recvbuf, count, dtype, op)) }
    })
}

/// Reduces `count` elements of `dtype` with `op` across every rank of
/// `comm` into `recvbuf` at rank `root` (as `MPI_Reduce`): when it returns
/// `AGGBOX_OK` at the root, its `recvbuf` holds, at each index, `op` over
/// the ranks' `sendbuf` at that index (`op` as in `aggbox_allreduce`).
/// `recvbuf` is only used at the root, and may be NULL elsewhere (it is not
/// looked at). At the root it runs in place when `sendbuf == recvbuf`;
/// otherwise the two must not overlap. Every rank calls it with the same
/// `count`, `dtype`, `op` and `root`, in the same order as its other
/// collectives. A rank other than the root may return before the root has
/// its result.
///
/// Fails, with nothing sent, with `AGGBOX_ERR_INVALID_ARGUMENT` when
/// `sendbuf` is NULL, or at the root `recvbuf` is NULL, and `count` is not
/// 0, the two overlap at the root without being equal, `root` is not a rank,
/// or for any of the reasons of `aggbox_allreduce` (`dtype`, `op`,
/// `count`). Fails with `AGGBOX_ERR_INVALID_ARGUMENT` on every rank that
/// sees it, the message saying "mismatched collective calls", when the
/// ranks' `count`, `dtype`, `op` or `root` disagree; with
/// `AGGBOX_ERR_PEER_FAILED` naming a rank that stopped answering within the
/// timeout. After a failure the root's `recvbuf` may hold part of the
/// result.
///
/// Queues behind pending asynchronous operations on `comm` as
/// `aggbox_allreduce` does. The library keeps no pointer to either buffer
/// after it returns.
///
/// # Safety
///
/// `comm` is NULL or a live communicator; `sendbuf` is NULL or valid for
/// reading `count` elements of `dtype`; at the root, `recvbuf` is NULL or
/// valid for reading and writing them (elsewhere it is not used).
#[no_mangle]
pub unsafe extern "C" fn aggbox_reduce(
    comm: *mut aggbox_comm,
    sendbuf: *const c_void,
    recvbuf: *mut c_void,
    count: usize,
    dtype: RawDtype,
    op: RawOp,
    root: c_int,
) -> aggbox_status {
    status_call("aggbox_reduce", || {
        // SAFETY: the caller's promise.
        unsafe {
            blocking(comm, |handle| {
                Call::reduce(handle, sendbuf, recvbuf, count, dtype, op, root)
            })
        }
    })
}

/// Reduces `size x recvcount` elements of `dtype` with `op` across every
/// rank of `comm` (`size` being `aggbox_comm_size(comm)`) and scatters the
/// result: when it returns `AGGBOX_OK`, rank `r`'s `recvbuf` holds the
/// `recvcount` elements of the result from index `r x recvcount`, each one
/// `op` over the ranks' `sendbuf` at that index (`op` as in
/// `aggbox_allreduce`; as `MPI_Reduce_scatter_block`). `sendbuf` holds
/// `size x recvcount` elements, `recvbuf` `recvcount`; the two must not
/// overlap (there is no in-place form). Every rank calls it with the same
/// `recvcount`, `dtype` and `op`, in the same order as its other
/// collectives.
///
/// Fails, with nothing sent, with `AGGBOX_ERR_INVALID_ARGUMENT` when
/// `sendbuf` or `recvbuf` is NULL and `recvcount` is not 0, they overlap,
/// `recvcount x size` overflows `size_t`, or for any of the reasons of
/// `aggbox_allreduce` (`dtype`, `op`, the `size x recvcount` elements of
/// `sendbuf`). Fails with `AGGBOX_ERR_INVALID_ARGUMENT` on every rank, the
/// message saying "mismatched collective calls", when the ranks'
/// `recvcount`, `dtype` or `op` disagree; with `AGGBOX_ERR_PEER_FAILED`
/// naming a rank that stopped answering within the timeout. After a
/// failure `recvbuf` may hold part of the result.
///
/// Queues behind pending asynchronous operations on `comm` as
/// `aggbox_allreduce` does. The library keeps no pointer to either buffer
/// after it returns.
///
/// # Safety
///
/// `comm` is NULL or a live communicator; `sendbuf` is NULL or valid for
/// reading `size x recvcount` elements of `dtype`, `recvbuf` NULL or valid
/// for writing `recvcount` of them.
#[no_mangle]
pub unsafe extern "C" fn aggbox_reduce_scatter(
    comm: *mut aggbox_comm,
    sendbuf: *const c_void,
    recvbuf: *mut c_void,
    recvcount: usize,
    dtype: RawDtype,
    op: RawOp,
) -> aggbox_status {
    status_call("aggbox_reduce_scatter", || {
        // SAFETY: the caller's promise.
        unsafe {
            blocking(comm, |handle| {
                Call::reduce_scatter(handle, sendbuf, recvbuf, recvcount, dtype, op)
            })
        }
    })
}

/// Gathers `sendcount` elements of `dtype` from every rank of `comm` onto
/// every rank (as `MPI_Allgather`): when it returns `AGGBOX_OK`, every
/// rank's `recvbuf` holds, from index `r x sendcount`, rank `r`'s `sendbuf`,
/// for every rank `r`. `recvbuf` holds `size x sendcount` elements (`size`
/// being `aggbox_comm_size(comm)`); the two buffers must not overlap (there
/// is no in-place form). Nothing is reduced, so every `aggbox_dtype` is
/// accepted, `AGGBOX_DTYPE_U8` too. Every rank calls it with the same
/// `sendcount` and `dtype`, in the same order as its other collectives. It
/// runs as one broadcast per rank.
///
/// Fails, with nothing sent, with `AGGBOX_ERR_INVALID_ARGUMENT` when
/// `sendbuf` or `recvbuf` is NULL and `sendcount` is not 0, they overlap,
/// `dtype` is not an `aggbox_dtype`, `sendcount x size` overflows `size_t`
/// or its elements do not fit in memory, or `sendcount` is more than
/// 2^32 - 1. Fails with `AGGBOX_ERR_INVALID_ARGUMENT`, the message saying
/// "mismatched collective calls", when the ranks' `sendcount` or `dtype`
/// disagree; with `AGGBOX_ERR_PEER_FAILED` naming a rank that stopped
/// answering within the timeout. After a failure `recvbuf` may hold part of
/// the result.
///
/// Queues behind pending asynchronous operations on `comm` as
/// `aggbox_allreduce` does. The library keeps no pointer to either buffer
/// after it returns.
///
/// # Safety
///
/// `comm` is NULL or a live communicator; `sendbuf` is NULL or valid for
/// reading `sendcount` elements of `dtype`, `recvbuf` NULL or valid for
/// reading and writing `size x sendcount` of them.
#[no_mangle]
pub unsafe extern "C" fn aggbox_allgather(
    comm: *mut aggbox_comm,
    sendbuf: *const c_void,
    recvbuf: *mut c_void,
    sendcount: usize,
    dtype: RawDtype,
) -> aggbox_status {
    status_call("aggbox_allgather", || {
        // SAFETY: the caller's promise.
        unsafe {
            blocking(comm, |handle| {
                Call::allgather(handle, sendbuf, recvbuf, sendcount, dtype)
            })
        }
    })
}

/// Starts the allreduce of `aggbox_allreduce` (same arguments, same checks,
/// made before this returns) and returns at once; `*out` is then a request
/// to finish it with `aggbox_wait` or `aggbox_test`, and to free with
/// `aggbox_request_free`. On failure `*out` is NULL and nothing was started.
///
/// The allreduce runs on the communicator's progress thread (one per
/// communicator, started by its first asynchronous call), after the
/// operations started before it (`aggbox_ibroadcast`, `aggbox_iallreduce`).
/// Until it has finished, both buffers belong to the library: the caller
/// must neither free nor write them, nor read `recvbuf`. Blocking calls on
/// `comm` meanwhile (`aggbox_barrier`, `aggbox_broadcast`,
/// `aggbox_allreduce`, `aggbox_reduce`, `aggbox_reduce_scatter`,
/// `aggbox_allgather`, `aggbox_comm_stats`) wait for their turn behind it,
/// and `aggbox_comm_destroy` waits for it to finish.
///
/// # Safety
///
/// `comm` is NULL or a live communicator; `sendbuf` is NULL or valid for
/// reading `count` elements of `dtype`, and `recvbuf` NULL or valid for
/// reading and writing them, until the operation has finished; `out` is
/// NULL or valid for writing a pointer.
#[no_mangle]
pub unsafe extern "C" fn aggbox_iallreduce(
    comm: *mut aggbox_comm,
    sendbuf: *const c_void,
    recvbuf: *mut c_void,
    count: usize,
    dtype: RawDtype,
    op: RawOp,
    out: *mut *mut aggbox_request,
) -> aggbox_status {
    status_call("aggbox_iallreduce", || {
        // SAFETY: the caller's promises.
        unsafe { try_write(out, "out", ptr::null_mut()) }?;
        let handle = unsafe { CommRef::new(comm) }?;
        let call = Call::allreduce(sendbuf, recvbuf, count, dtype, op)?;
        // SAFETY: `out` checked by try_write above.
        unsafe { handle.start("aggbox_iallreduce", out, move |comm| call.run(comm)) }
    })
}

#[cfg(test)]
mod tests {
    use std::{thread, time::Duration};

    use super::*;
    use crate::{
        boundary::copy_last_error,
        comm::{aggbox_barrier, aggbox_comm_destroy, aggbox_comm_init},
        config::aggbox_config,
        request::{aggbox_request_free, aggbox_test, aggbox_wait},
        stats::{aggbox_comm_stats, aggbox_stats},
        types::{aggbox_datapath, aggbox_op, RawDatapath},
    };

    fn last_error() -> String {
        let mut buf = [0u8; 512];
        let len = copy_last_error(&mut buf);
        String::from_utf8(buf[..len].to_vec()).unwrap()
    }

    /// Rank `rank` of `size` on 127.0.0.1, user datapath, store at `port`.
    fn join(rank: c_int, size: c_int, port: u16) -> *mut aggbox_comm {
        let config = aggbox_config {
            rank,
            world_size: size,
            master_port: port,
            datapath: aggbox_datapath::AGGBOX_DATAPATH_USER as RawDatapath,
            timeout_ms: 5000,
            ..Default::default()
        };
        let mut comm = ptr::null_mut();
        let status = unsafe { aggbox_comm_init(&config, &mut comm) };
        assert_eq!(status, aggbox_status::AGGBOX_OK, "{}", last_error());
        comm
    }

    fn stats(comm: *mut aggbox_comm) -> aggbox_stats {
        let mut stats = unsafe { std::mem::MaybeUninit::<aggbox_stats>::zeroed().assume_init() };
        stats.size = std::mem::size_of::<aggbox_stats>();
        assert_eq!(unsafe { aggbox_comm_stats(comm, &mut stats) }, aggbox_status::AGGBOX_OK);
        stats
    }

    const U8: RawDtype = aggbox_dtype::AGGBOX_DTYPE_U8 as RawDtype;
    const I32: RawDtype = aggbox_dtype::AGGBOX_DTYPE_I32 as RawDtype;
    const I64: RawDtype = aggbox_dtype::AGGBOX_DTYPE_I64 as RawDtype;
    const U32: RawDtype = aggbox_dtype::AGGBOX_DTYPE_U32 as RawDtype;
    const U64: RawDtype = aggbox_dtype::AGGBOX_DTYPE_U64 as RawDtype;
    const F32: RawDtype = aggbox_dtype::AGGBOX_DTYPE_F32 as RawDtype;
    const F64: RawDtype = aggbox_dtype::AGGBOX_DTYPE_F64 as RawDtype;
    const SUM: RawOp = aggbox_op::AGGBOX_OP_SUM as RawOp;
    const MIN: RawOp = aggbox_op::AGGBOX_OP_MIN as RawOp;
    const MAX: RawOp = aggbox_op::AGGBOX_OP_MAX as RawOp;
    const AVG: RawOp = aggbox_op::AGGBOX_OP_AVG as RawOp;

    #[test]
    fn the_c_ops_are_the_core_ones() {
        let c = [
            aggbox_op::AGGBOX_OP_SUM,
            aggbox_op::AGGBOX_OP_MIN,
            aggbox_op::AGGBOX_OP_MAX,
            aggbox_op::AGGBOX_OP_AVG,
        ];
        for (c, core) in c.into_iter().zip(ReduceOp::ALL) {
            assert_eq!(op_of(c as RawOp, Dtype::F64).unwrap(), core, "{c:?}");
        }
        for raw in [4, -1, 256, c_int::MIN, c_int::MAX] {
            let err = op_of(raw, Dtype::F64).unwrap_err().to_string();
            assert_eq!(err, format!("invalid argument: op {raw} is not an aggbox_op"));
        }
    }

    #[test]
    fn spans_overlap_only_when_they_share_a_byte() {
        let buf = [0u8; 16];
        let at = |offset: usize, len: usize| Span {
            ptr: NonNull::new(buf.as_ptr().wrapping_add(offset).cast_mut()).unwrap(),
            len,
        };
        assert!(at(0, 8).overlaps(&at(7, 8)));
        assert!(at(4, 4).overlaps(&at(0, 16)));
        assert!(!at(0, 8).overlaps(&at(8, 8)));
        assert!(!at(0, 0).overlaps(&at(0, 8)), "empty overlaps nothing");
        assert!(!Span::empty().overlaps(&Span::empty()));
    }

    /// What a call returns and says, and that it said it as `func`.
    fn refused(status: aggbox_status, func: &str, says: &str) {
        assert_eq!(status, aggbox_status::AGGBOX_ERR_INVALID_ARGUMENT, "{func}: {says}");
        let message = last_error();
        assert!(message.starts_with(&format!("{func}: invalid argument:")), "{message}");
        assert!(message.contains(says), "{message} does not say {says:?}");
    }

    #[test]
    fn arguments_are_checked_and_nothing_is_sent() {
        let comm = join(0, 1, 29_681);
        let mut a = [0i64; 8];
        let mut b = [0i64; 8];
        let pa = a.as_mut_ptr().cast::<c_void>();
        let pb = b.as_mut_ptr().cast::<c_void>();
        let null = ptr::null_mut::<c_void>();
        let huge = usize::MAX / 2;
        let too_many = MAX_ELEMENTS + 1;
        // (send, recv, count, dtype, op, what the message says), for
        // allreduce, iallreduce and reduce (root 0) alike.
        let cases: Vec<(*mut c_void, *mut c_void, usize, RawDtype, RawOp, &str)> = vec![
            (null, pb, 4, I64, SUM, "sendbuf is NULL with count 4"),
            (pa, null, 4, I64, SUM, "recvbuf is NULL with count 4"),
            (pa, pb, 4, 99, SUM, "dtype 99 is not an aggbox_dtype"),
            (pa, pb, 4, -1, SUM, "dtype -1 is not an aggbox_dtype"),
            (pa, pb, 4, I64, 4, "op 4 is not an aggbox_op"),
            (pa, pb, 4, I64, -1, "op -1 is not an aggbox_op"),
            (pa, pb, 4, I64, 256 + MIN, "op 257 is not an aggbox_op"),
            (pa, pb, 4, I32, AVG, "avg is for f32 and f64; i32 elements"),
            (pa, pb, 4, I64, AVG, "avg is for f32 and f64; i64 elements"),
            (pa, pb, 4, U32, AVG, "avg is for f32 and f64; u32 elements"),
            (pa, pb, 4, U64, AVG, "avg is for f32 and f64; u64 elements"),
            (pa, pb, 4, U8, SUM, "u8 is for broadcast"),
            (pa, pb, 4, U8, MAX, "u8 is for broadcast"),
            (pa, pb, huge, I64, SUM, "more elements than one operation carries"),
            (
                pa,
                pb,
                too_many,
                F32,
                SUM,
                "count 4294967296 is more elements than one operation carries",
            ),
            (
                pa,
                pa.cast::<i64>().wrapping_add(1).cast(),
                4,
                I64,
                SUM,
                "sendbuf and recvbuf overlap",
            ),
        ];
        unsafe {
            let before = stats(comm);
            for &(send, recv, count, dtype, op, says) in &cases {
                refused(
                    aggbox_allreduce(comm, send, recv, count, dtype, op),
                    "aggbox_allreduce",
                    says,
                );
                let mut request = ptr::dangling_mut();
                refused(
                    aggbox_iallreduce(comm, send, recv, count, dtype, op, &mut request),
                    "aggbox_iallreduce",
                    says,
                );
                assert!(request.is_null(), "nothing started: {says}");
                let says = if says.starts_with("recvbuf") {
                    says.replace("with count 4", "with count 4 at the root")
                } else {
                    says.to_owned()
                };
                refused(
                    aggbox_reduce(comm, send, recv, count, dtype, op, 0),
                    "aggbox_reduce",
                    &says,
                );
            }
            for root in [1, -1, c_int::MAX] {
                refused(
                    aggbox_reduce(comm, pa, pb, 4, I64, SUM, root),
                    "aggbox_reduce",
                    &format!("root {root} is not a rank of this group of 1"),
                );
            }
            // Reduce-scatter and allgather: the same element checks, their
            // own counts, and no in-place form.
            let rs = |send, recv, count, dtype, op| aggbox_reduce_scatter(comm, send, recv, count, dtype, op);
            refused(
                rs(null, pb, 2, I64, SUM),
                "aggbox_reduce_scatter",
                "sendbuf is NULL with recvcount 2",
            );
            refused(
                rs(pa, null, 2, I64, SUM),
                "aggbox_reduce_scatter",
                "recvbuf is NULL with recvcount 2",
            );
            refused(
                rs(pa, pb, 2, 7, SUM),
                "aggbox_reduce_scatter",
                "dtype 7 is not an aggbox_dtype",
            );
            refused(
                rs(pa, pb, 2, I64, 9),
                "aggbox_reduce_scatter",
                "op 9 is not an aggbox_op",
            );
            refused(
                rs(pa, pb, 2, I32, AVG),
                "aggbox_reduce_scatter",
                "avg is for f32 and f64",
            );
            refused(rs(pa, pb, 2, U8, MIN), "aggbox_reduce_scatter", "u8 is for broadcast");
            refused(
                rs(pa, pb, huge, I64, SUM),
                "aggbox_reduce_scatter",
                "more elements than one operation",
            );
            refused(
                rs(pa, pa, 2, I64, SUM),
                "aggbox_reduce_scatter",
                "reduce-scatter takes disjoint buffers",
            );
            let ag = |send, recv, count, dtype| aggbox_allgather(comm, send, recv, count, dtype);
            refused(
                ag(null, pb, 2, I64),
                "aggbox_allgather",
                "sendbuf is NULL with sendcount 2",
            );
            refused(
                ag(pa, null, 2, I64),
                "aggbox_allgather",
                "recvbuf is NULL with sendcount 2",
            );
            refused(ag(pa, pb, 2, -3), "aggbox_allgather", "dtype -3 is not an aggbox_dtype");
            refused(
                ag(pa, pb, huge, I64),
                "aggbox_allgather",
                "sendcount 9223372036854775807 is more elements",
            );
            refused(
                ag(pa, pb, usize::MAX, U8),
                "aggbox_allgather",
                "is more elements than one operation",
            );
            refused(
                ag(pa, pa, 2, I64),
                "aggbox_allgather",
                "allgather takes disjoint buffers",
            );

            let no_comm: [(&str, &dyn Fn() -> aggbox_status); 4] = [
                ("aggbox_allreduce", &|| {
                    aggbox_allreduce(ptr::null_mut(), pa, pb, 4, I64, SUM)
                }),
                ("aggbox_reduce", &|| {
                    aggbox_reduce(ptr::null_mut(), pa, pb, 4, I64, SUM, 0)
                }),
                ("aggbox_reduce_scatter", &|| {
                    aggbox_reduce_scatter(ptr::null_mut(), pa, pb, 4, I64, SUM)
                }),
                ("aggbox_allgather", &|| {
                    aggbox_allgather(ptr::null_mut(), pa, pb, 4, I64)
                }),
            ];
            for (func, call) in no_comm {
                refused(call(), func, "comm is NULL");
                assert_eq!(last_error(), format!("{func}: invalid argument: comm is NULL"));
            }
            let mut request = ptr::dangling_mut();
            refused(
                aggbox_iallreduce(ptr::null_mut(), pa, pb, 4, I64, SUM, &mut request),
                "aggbox_iallreduce",
                "comm is NULL",
            );
            assert!(request.is_null());
            refused(
                aggbox_iallreduce(comm, pa, pb, 4, I64, SUM, ptr::null_mut()),
                "aggbox_iallreduce",
                "out is NULL",
            );
            let after = stats(comm);
            assert_eq!(after.packets_sent, before.packets_sent, "nothing sent");
            assert_eq!(after.reductions, before.reductions, "no reduction counted");
            assert_eq!(after.broadcasts, before.broadcasts, "no allgather broadcast");
            aggbox_comm_destroy(comm);
        }
    }

    /// On one rank every collective is a copy (AVG divides by 1), in place
    /// or not; NULL with a count of 0 is fine.
    #[test]
    fn one_rank_collectives_copy() {
        let comm = join(0, 1, 29_682);
        unsafe {
            let send = [1.5f64, -2.0, 3.25];
            let mut recv = [0f64; 3];
            let status = aggbox_allreduce(comm, send.as_ptr().cast(), recv.as_mut_ptr().cast(), 3, F64, AVG);
            assert_eq!(status, aggbox_status::AGGBOX_OK, "{}", last_error());
            assert_eq!(recv, send);
            let mut buf = [5i32, -7, 9];
            let p = buf.as_mut_ptr().cast::<c_void>();
            assert_eq!(aggbox_allreduce(comm, p, p, 3, I32, MIN), aggbox_status::AGGBOX_OK);
            assert_eq!(buf, [5, -7, 9]);
            let mut out = [0i32; 3];
            assert_eq!(
                aggbox_reduce(comm, p, out.as_mut_ptr().cast(), 3, I32, SUM, 0),
                aggbox_status::AGGBOX_OK,
                "{}",
                last_error()
            );
            assert_eq!(out, buf);
            assert_eq!(aggbox_reduce(comm, p, p, 3, I32, MAX, 0), aggbox_status::AGGBOX_OK);
            let mut block = [0i32; 3];
            assert_eq!(
                aggbox_reduce_scatter(comm, p, block.as_mut_ptr().cast(), 3, I32, SUM),
                aggbox_status::AGGBOX_OK,
                "{}",
                last_error()
            );
            assert_eq!(block, buf);
            let bytes = *b"abc";
            let mut gathered = [0u8; 3];
            assert_eq!(
                aggbox_allgather(comm, bytes.as_ptr().cast(), gathered.as_mut_ptr().cast(), 3, U8),
                aggbox_status::AGGBOX_OK,
                "{}",
                last_error()
            );
            assert_eq!(&gathered, b"abc");
            let null = ptr::null_mut();
            assert_eq!(
                aggbox_allreduce(comm, null, null, 0, F32, SUM),
                aggbox_status::AGGBOX_OK
            );
            assert_eq!(
                aggbox_reduce(comm, null, null, 0, F32, SUM, 0),
                aggbox_status::AGGBOX_OK
            );
            assert_eq!(
                aggbox_reduce_scatter(comm, null, null, 0, F32, SUM),
                aggbox_status::AGGBOX_OK
            );
            assert_eq!(aggbox_allgather(comm, null, null, 0, F32), aggbox_status::AGGBOX_OK);
            let mut request = ptr::null_mut();
            let mut floats = [1.0f32, 2.0];
            let pf = floats.as_mut_ptr().cast::<c_void>();
            assert_eq!(
                aggbox_iallreduce(comm, pf, pf, 2, F32, SUM, &mut request),
                aggbox_status::AGGBOX_OK
            );
            assert_eq!(aggbox_wait(request), aggbox_status::AGGBOX_OK, "{}", last_error());
            aggbox_request_free(request);
            assert_eq!(floats, [1.0, 2.0]);
            aggbox_comm_destroy(comm);
        }
    }

    struct Handle(*mut aggbox_comm);
    // SAFETY: each test hands a communicator to one thread.
    unsafe impl Send for Handle {}

    /// Rank `rank`'s element `i` (of a vector of 300 000).
    fn input(rank: usize, i: usize) -> i64 {
        (i as i64 * 7919 + rank as i64 * 104_729) % 1_000_003 - 500_000
    }

    /// Two ranks through the C ABI: the overflow checks that need more
    /// than one rank refuse on each (nothing sent, still in step); an
    /// asynchronous allreduce with a blocking one queued behind it; a
    /// reduce to rank 1 with a NULL recvbuf at rank 0; reduce-scatter and
    /// allgather.
    #[test]
    fn two_ranks_reduce_through_the_c_abi() {
        let port = 29_683;
        let n = 300_000usize;
        let run = move |rank: usize| {
            let comm = Handle(join(rank as c_int, 2, port));
            let comm = comm.0;
            let want_sum: Vec<i64> = (0..n).map(|i| input(0, i) + input(1, i)).collect();
            let mine: Vec<i64> = (0..n).map(|i| input(rank, i)).collect();
            unsafe {
                // recvcount × 2 overflows; so does sendcount × 2.
                let mut x = [0u64; 2];
                let px = x.as_mut_ptr().cast::<c_void>();
                let half = usize::MAX / 2 + 1;
                refused(
                    aggbox_reduce_scatter(comm, px, px, half, U64, SUM),
                    "aggbox_reduce_scatter",
                    &format!("recvcount {half} × 2 ranks overflows size_t"),
                );
                refused(
                    aggbox_reduce_scatter(comm, px, px, MAX_ELEMENTS / 2 + 1, U32, SUM),
                    "aggbox_reduce_scatter",
                    "recvcount 2147483648 × 2 ranks = 4294967296 is more elements than one operation carries",
                );
                refused(
                    aggbox_allgather(comm, px, px, half, U8),
                    "aggbox_allgather",
                    &format!("sendcount {half} × 2 ranks overflows size_t"),
                );
                refused(
                    aggbox_reduce(comm, px, px, 2, U64, SUM, 2),
                    "aggbox_reduce",
                    "root 2 is not a rank of this group of 2",
                );

                // iallreduce (SUM, apart), then a blocking MAX in place
                // that queues behind it.
                let mut sum = vec![0i64; n];
                let mut request = ptr::null_mut();
                assert_eq!(
                    aggbox_iallreduce(
                        comm,
                        mine.as_ptr().cast(),
                        sum.as_mut_ptr().cast(),
                        n,
                        I64,
                        SUM,
                        &mut request
                    ),
                    aggbox_status::AGGBOX_OK,
                    "{}",
                    last_error()
                );
                let mut max = mine.clone();
                let pm = max.as_mut_ptr().cast::<c_void>();
                assert_eq!(
                    aggbox_allreduce(comm, pm, pm, n, I64, MAX),
                    aggbox_status::AGGBOX_OK,
                    "{}",
                    last_error()
                );
                let mut done = 0;
                assert_eq!(aggbox_test(request, &mut done), aggbox_status::AGGBOX_OK);
                assert_eq!(done, 1, "the blocking allreduce ran after the asynchronous one");
                assert_eq!(aggbox_wait(request), aggbox_status::AGGBOX_OK, "{}", last_error());
                aggbox_request_free(request);
                assert!(sum == want_sum, "rank {rank}: iallreduce sum");
                assert!(
                    (0..n).all(|i| max[i] == input(0, i).max(input(1, i))),
                    "rank {rank}: allreduce max"
                );

                // Reduce MIN to rank 1; rank 0 passes no recvbuf.
                let mut min = vec![0i64; if rank == 1 { n } else { 0 }];
                let recv = if rank == 1 {
                    min.as_mut_ptr().cast()
                } else {
                    ptr::null_mut()
                };
                assert_eq!(
                    aggbox_reduce(comm, mine.as_ptr().cast(), recv, n, I64, MIN, 1),
                    aggbox_status::AGGBOX_OK,
                    "{}",
                    last_error()
                );
                if rank == 1 {
                    assert!((0..n).all(|i| min[i] == input(0, i).min(input(1, i))), "reduce min");
                }

                // Reduce-scatter of the whole vector: block `rank` of the sum.
                let block = n / 2;
                let mut part = vec![0i64; block];
                assert_eq!(
                    aggbox_reduce_scatter(comm, mine.as_ptr().cast(), part.as_mut_ptr().cast(), block, I64, SUM),
                    aggbox_status::AGGBOX_OK,
                    "{}",
                    last_error()
                );
                assert!(
                    part[..] == want_sum[rank * block..][..block],
                    "rank {rank}: reduce-scatter"
                );

                // Allgather the blocks back into the whole sum.
                let mut whole = vec![0i64; n];
                assert_eq!(
                    aggbox_allgather(comm, part.as_ptr().cast(), whole.as_mut_ptr().cast(), block, I64),
                    aggbox_status::AGGBOX_OK,
                    "{}",
                    last_error()
                );
                assert!(whole == want_sum, "rank {rank}: allgather");
                assert_eq!(aggbox_barrier(comm), aggbox_status::AGGBOX_OK);
                let stats = stats(comm);
                assert_eq!(stats.reductions, 4, "iallreduce, allreduce, reduce, reduce-scatter");
                aggbox_comm_destroy(comm);
            }
        };
        let peer = thread::spawn(move || run(1));
        thread::sleep(Duration::from_millis(20));
        run(0);
        peer.join().unwrap();
    }
}
