//! The communicator: a group of ranks that run collectives together.

use crate::{Config, Datapath, Result, Stats};

/// A member of a group of ranks. Not `Sync`: one thread at a time runs
/// collectives on a communicator (as in NCCL and MPI); it may move between
/// threads.
pub struct Comm {
    config: Config,
}

impl Comm {
    /// Joins the group described by `config`: rendezvous with every rank,
    /// then set up the datapath.
    pub fn new(config: Config) -> Result<Comm> {
        let _ = config;
        todo!()
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
        todo!()
    }

    /// Why `Auto` fell back to the user datapath, if it did.
    pub fn datapath_reason(&self) -> Option<&str> {
        todo!()
    }

    /// Blocks until every rank has called `barrier`.
    pub fn barrier(&mut self) -> Result<()> {
        todo!()
    }

    /// A snapshot of the counters.
    pub fn stats(&self) -> Result<Stats> {
        todo!()
    }
}
