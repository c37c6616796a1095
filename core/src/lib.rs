//! AggBox core: broadcast and aggregation collectives whose hot part runs in
//! the Linux kernel (eBPF), with a user-space datapath speaking the same wire
//! protocol as fallback and baseline.
//!
//! The pieces, each in a module named for what it holds:
//! - [`wire`]: the datagram header (mirrors `ebpf/aggbox_wire.h`);
//! - [`maps`]: values of the shared BPF maps (mirrors `ebpf/aggbox_maps.h`);
//! - [`bpf`]: the embedded BPF objects;
//! - [`loader`]: load, attach, pin and share the programs on an interface;
//! - [`netif`]: interface facts (index, IPv4, MAC);
//! - [`rendezvous`]: how ranks find each other (env + TCP store);
//! - [`transport`]: the UDP socket a communicator sends and receives on;
//! - [`comm`]: the communicator and its collectives; [`agree`] holds
//!   crash-recovery approximate agreement, [`broadcast`]
//!   the broadcast protocol, [`reduce`] allreduce, reduce, reduce-scatter
//!   and allgather, [`kv`] key-value reduce, [`op`] the reduction
//!   operators, [`dtype`] the element types of buffers;
//! - [`cluster`], [`fault`]: the virtual cluster of network namespaces and
//!   fault injection, for tests, demos and benchmarks;
//! - [`doctor`]: what this host supports, and the fix for what it lacks;
//! - [`testrun`]: `BPF_PROG_TEST_RUN` on crafted frames.

#![warn(missing_docs)]

pub mod agree;
mod barrier;
pub mod bpf;
pub mod broadcast;
pub mod cluster;
pub mod comm;
pub mod config;
pub mod doctor;
pub mod dtype;
pub mod error;
pub mod fault;
pub mod kv;
mod kvmap;
pub mod loader;
pub mod maps;
pub mod netif;
pub mod op;
pub mod quant;
pub mod reduce;
pub mod rendezvous;
pub mod stats;
pub mod testrun;
pub mod transport;
pub mod wire;
pub mod window;

#[cfg(test)]
mod layout_check;

pub use comm::Comm;
pub use config::{Config, Datapath, StoreHost};
pub use dtype::{Dtype, Element};
pub use error::{Error, Result, Status};
pub use op::ReduceOp;
pub use stats::Stats;

/// The version of this library.
pub const VERSION: &str = env!("CARGO_PKG_VERSION");
