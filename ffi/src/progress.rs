//! The progress thread of a communicator: it runs the communicator's
//! asynchronous operations (`aggbox_ibroadcast`) in the order they were
//! started, one at a time, and every blocking call made while one of them is
//! pending, which queues behind it (collectives must run in the same order
//! on every rank, so a blocking call may not overtake an earlier
//! asynchronous one).
//!
//! The thread is started by the first asynchronous call and lives until the
//! communicator is destroyed ([`Progress::shutdown`]), which first lets it
//! finish everything queued.

use std::{
    collections::VecDeque,
    os::raw::c_int,
    panic::{catch_unwind, AssertUnwindSafe},
    sync::{mpsc, Arc, Condvar, Mutex, MutexGuard, PoisonError},
    thread::JoinHandle,
};

use aggbox_core::{Comm, Error, Result};

use crate::comm::CommRef;

/// The communicator of a handle, shared with its progress thread; `None`
/// once `aggbox_comm_destroy` took it out.
pub(crate) type SharedComm = Arc<Mutex<Option<Comm>>>;

/// A queued operation. It gets the communicator, or the error that says why
/// the communicator cannot be had, and reports its own outcome.
pub(crate) type Job = Box<dyn FnOnce(Result<&mut Comm>) + Send>;

/// What the progress thread has to do.
#[derive(Default)]
struct Queue {
    jobs: VecDeque<Job>,
    /// Jobs queued or running: while above 0, blocking calls queue too.
    pending: usize,
    /// Set by `shutdown`: exit once the queue is empty.
    stop: bool,
}

/// The queue and its wake-up, shared with the thread.
#[derive(Default)]
struct Shared {
    queue: Mutex<Queue>,
    wake: Condvar,
}

impl Shared {
    fn queue(&self) -> MutexGuard<'_, Queue> {
        // Nothing panics while holding it.
        self.queue.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

/// A communicator's progress thread, started lazily.
#[derive(Default)]
pub(crate) struct Progress {
    shared: Arc<Shared>,
    thread: Mutex<Option<JoinHandle<()>>>,
}

impl Progress {
    /// Queues `job` behind every operation queued before it, starting the
    /// thread (named for `rank`) if it is not running.
    pub(crate) fn submit(&self, comm: &SharedComm, rank: c_int, job: Job) -> Result<()> {
        let mut thread = self.thread.lock().unwrap_or_else(PoisonError::into_inner);
        if thread.is_none() {
            let (shared, comm) = (self.shared.clone(), comm.clone());
            let spawned = std::thread::Builder::new()
                .name(format!("aggbox-progress-{rank}"))
                .spawn(move || work(&shared, &comm))
                .map_err(|e| Error::system("starting the communicator's progress thread", e))?;
            *thread = Some(spawned);
        }
        let mut queue = self.shared.queue();
        queue.jobs.push_back(job);
        queue.pending += 1;
        self.shared.wake.notify_one();
        Ok(())
    }

    /// Runs `op` on the communicator of `handle`: right here when no
    /// asynchronous operation is pending, else queued behind them on the
    /// progress thread, waiting for its turn and its result.
    pub(crate) fn run<T: Send + 'static>(
        &self,
        handle: &CommRef<'_>,
        op: impl FnOnce(&mut Comm) -> Result<T> + Send + 'static,
    ) -> Result<T> {
        if self.shared.queue().pending == 0 {
            return op(&mut *handle.lock()?);
        }
        let (result, outcome) = mpsc::sync_channel(1);
        self.submit(
            handle.shared_comm(),
            handle.rank(),
            Box::new(move |comm| {
                // The caller waits for it; it cannot have gone.
                let _ = result.send(comm.and_then(op));
            }),
        )?;
        outcome.recv().unwrap_or_else(|_| {
            Err(Error::Internal(
                "the call panicked on the communicator's progress thread".into(),
            ))
        })
    }

    /// Lets the thread finish everything queued, then stops it. Asynchronous
    /// calls made afterwards start it again.
    pub(crate) fn shutdown(&self) {
        let mut thread = self.thread.lock().unwrap_or_else(PoisonError::into_inner);
        let Some(running) = thread.take() else { return };
        self.shared.queue().stop = true;
        self.shared.wake.notify_all();
        // It catches every panic of a job, so it ends normally.
        let _ = running.join();
        self.shared.queue().stop = false;
    }
}

impl Drop for Progress {
    fn drop(&mut self) {
        self.shutdown();
    }
}

/// The progress thread: runs the jobs in order until told to stop.
fn work(shared: &Shared, comm: &Mutex<Option<Comm>>) {
    while let Some(job) = next_job(shared) {
        {
            // Held for the job: a blocking call of another thread meanwhile
            // queues (pending > 0) or, racing, finds it in use.
            let mut guard = comm.lock();
            let comm = match guard.as_mut() {
                Ok(guard) => guard.as_mut().ok_or_else(|| {
                    Error::InvalidArgument("the communicator is being destroyed".into())
                }),
                Err(_) => Err(Error::Internal(
                    "an earlier call on this communicator failed with an internal error; it is unusable: destroy it"
                        .into(),
                )),
            };
            // A panic drops the job's reporter, which tells its waiter.
            let _ = catch_unwind(AssertUnwindSafe(|| job(comm)));
        }
        // Only now: a caller that saw its operation finish and calls again
        // finds the communicator free.
        shared.queue().pending -= 1;
    }
}

/// The next job, waiting for one; `None` when told to stop and none is left.
fn next_job(shared: &Shared) -> Option<Job> {
    let mut queue = shared.queue();
    loop {
        if let Some(job) = queue.jobs.pop_front() {
            return Some(job);
        }
        if queue.stop {
            return None;
        }
        queue = shared
            .wake
            .wait(queue)
            .unwrap_or_else(PoisonError::into_inner);
    }
}
