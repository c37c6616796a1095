//! Fault injection for the virtual cluster (this kernel has no netem).
//!
//! [`FaultInjector`] loads `ebpf/fault.bpf.c` with the rates of a
//! [`FaultSpec`] and attaches it at TC egress of one bridge-side veth, so every
//! frame the bridge delivers to that host passes it once: UDP frames whose
//! destination port is in the spec's range are dropped or duplicated at
//! random, and counted. [`crate::cluster::Cluster::inject_faults`] puts one on
//! every host's port.

use std::{io, path::Path};

use aya::{
    maps::PerCpuArray,
    programs::{
        links::FdLink,
        tc::{self, SchedClassifierLinkId},
        SchedClassifier, TcAttachType,
    },
    Ebpf, EbpfLoader,
};

use crate::{bpf, Error, Result};

/// Rates are given in parts per million of the frames in the port range.
pub const PER_MILLION: u32 = 1_000_000;

/// Parts per million in one percent.
const PPM_PER_PERCENT: f64 = (PER_MILLION / 100) as f64;

/// Name of the counters map in the fault object.
const STATS_MAP: &str = "fault_stats";

/// Indexes of the counters in [`STATS_MAP`] (`enum fault_stat` in the C source).
mod stat {
    pub const SEEN: u32 = 0;
    pub const DROPPED: u32 = 1;
    pub const DUPLICATED: u32 = 2;
}

/// Names of the program's `volatile const` globals.
mod global {
    pub const DROP_PPM: &str = "drop_ppm";
    pub const DUP_PPM: &str = "dup_ppm";
    pub const PORT_LO: &str = "port_lo";
    pub const PORT_HI: &str = "port_hi";
}

/// What to do to the UDP frames delivered to a host.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct FaultSpec {
    /// Frames dropped, in parts per million.
    pub drop_ppm: u32,
    /// Frames not dropped that are delivered twice, in parts per million.
    pub dup_ppm: u32,
    /// Lowest UDP destination port affected.
    pub port_lo: u16,
    /// Highest UDP destination port affected (inclusive).
    pub port_hi: u16,
}

impl FaultSpec {
    /// No faults, on all UDP ports.
    pub const NONE: FaultSpec = FaultSpec {
        drop_ppm: 0,
        dup_ppm: 0,
        port_lo: 0,
        port_hi: u16::MAX,
    };

    /// Drops `drop` percent of the UDP frames on every port, and duplicates
    /// `duplicate` percent of those it does not drop.
    ///
    /// # Panics
    ///
    /// If a percentage is not a number in `0.0..=100.0`.
    pub fn percent(drop: f64, duplicate: f64) -> Self {
        FaultSpec {
            drop_ppm: percent_to_ppm(drop),
            dup_ppm: percent_to_ppm(duplicate),
            ..Self::NONE
        }
    }

    /// The same faults, only on UDP destination ports `lo..=hi`.
    pub fn ports(self, lo: u16, hi: u16) -> Self {
        FaultSpec {
            port_lo: lo,
            port_hi: hi,
            ..self
        }
    }

    /// Whether this spec leaves every frame alone.
    pub fn is_none(&self) -> bool {
        self.drop_ppm == 0 && self.dup_ppm == 0
    }

    /// Checks that the rates are at most [`PER_MILLION`] and the port range
    /// is not empty.
    pub fn validate(&self) -> Result<()> {
        if self.drop_ppm > PER_MILLION || self.dup_ppm > PER_MILLION {
            return Err(Error::InvalidArgument(format!(
                "fault rates are parts per million, at most {PER_MILLION}: {self:?}"
            )));
        }
        if self.port_lo > self.port_hi {
            return Err(Error::InvalidArgument(format!(
                "empty fault port range {}..={}",
                self.port_lo, self.port_hi
            )));
        }
        Ok(())
    }
}

impl Default for FaultSpec {
    fn default() -> Self {
        Self::NONE
    }
}

fn percent_to_ppm(percent: f64) -> u32 {
    assert!(
        (0.0..=100.0).contains(&percent),
        "a fault percentage must be in 0..=100, not {percent}"
    );
    (percent * PPM_PER_PERCENT).round() as u32
}

/// What the fault program did to the frames delivered to one host.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct FaultStats {
    /// UDP frames in the port range that reached the program (duplicates it
    /// made are not counted again).
    pub seen: u64,
    /// Of those, how many it dropped.
    pub dropped: u64,
    /// Of those, how many it delivered twice.
    pub duplicated: u64,
}

impl FaultStats {
    /// How many frames in the port range it delivered: `seen - dropped + duplicated`.
    pub fn delivered(&self) -> u64 {
        self.seen - self.dropped + self.duplicated
    }
}

/// Wraps a BPF library error with what AggBox was doing.
pub(crate) fn bpf_error(context: impl Into<String>, err: impl std::error::Error + Send + Sync + 'static) -> Error {
    Error::system(context, io::Error::other(err))
}

/// The fault program, loaded with one [`FaultSpec`] and attached at TC
/// egress of one interface. Dropping it detaches it.
#[derive(Debug)]
pub struct FaultInjector {
    ebpf: Ebpf,
    link: SchedClassifierLinkId,
    iface: String,
}

impl FaultInjector {
    /// Loads the fault program with `spec` and attaches it at TC egress of
    /// `iface`, in the network namespace of the calling thread.
    pub fn attach(iface: &str, spec: &FaultSpec) -> Result<Self> {
        spec.validate()?;
        let mut ebpf = EbpfLoader::new()
            .override_global(global::DROP_PPM, &spec.drop_ppm, true)
            .override_global(global::DUP_PPM, &spec.dup_ppm, true)
            .override_global(global::PORT_LO, &spec.port_lo, true)
            .override_global(global::PORT_HI, &spec.port_hi, true)
            .load(bpf::FAULT)
            .map_err(|e| bpf_error("loading the fault object", e))?;
        let program: &mut SchedClassifier = ebpf
            .program_mut(bpf::programs::FAULT)
            .ok_or_else(|| Error::Internal(format!("no program {} in the fault object", bpf::programs::FAULT)))?
            .try_into()
            .map_err(|e| bpf_error("the fault program", e))?;
        program.load().map_err(|e| bpf_error("loading the fault program", e))?;
        // Kernels before 6.6 attach TC programs through a clsact qdisc; with
        // TCX it is not needed. It may already be there, which is fine, and
        // any other failure shows up in the attach below.
        let _ = tc::qdisc_add_clsact(iface);
        let link = program
            .attach(iface, TcAttachType::Egress)
            .map_err(|e| bpf_error(format!("attaching the fault program at TC egress of {iface}"), e))?;
        Ok(FaultInjector {
            ebpf,
            link,
            iface: iface.to_string(),
        })
    }

    /// The interface it is attached to.
    pub fn iface(&self) -> &str {
        &self.iface
    }

    /// Its counters, summed over CPUs.
    pub fn stats(&self) -> Result<FaultStats> {
        let map = self
            .ebpf
            .map(STATS_MAP)
            .ok_or_else(|| Error::Internal(format!("no map {STATS_MAP} in the fault object")))?;
        let counters: PerCpuArray<_, u64> =
            PerCpuArray::try_from(map).map_err(|e| bpf_error(format!("the {STATS_MAP} map"), e))?;
        let read = |index: u32| -> Result<u64> {
            let per_cpu = counters
                .get(&index, 0)
                .map_err(|e| bpf_error(format!("reading {STATS_MAP}[{index}]"), e))?;
            Ok(per_cpu.iter().sum())
        };
        Ok(FaultStats {
            seen: read(stat::SEEN)?,
            dropped: read(stat::DROPPED)?,
            duplicated: read(stat::DUPLICATED)?,
        })
    }

    /// Pins its link at `path` (on a bpffs) so that it stays attached after
    /// this process exits, until the pin is removed or the interface goes.
    pub fn pin(mut self, path: &Path) -> Result<()> {
        let program: &mut SchedClassifier = self
            .ebpf
            .program_mut(bpf::programs::FAULT)
            .ok_or_else(|| Error::Internal("fault program vanished".into()))?
            .try_into()
            .map_err(|e| bpf_error("the fault program", e))?;
        let link = program
            .take_link(self.link)
            .map_err(|e| bpf_error("taking the fault link", e))?;
        let link = FdLink::try_from(link)
            .map_err(|e| bpf_error(format!("the fault link on {} is not a bpf_link", self.iface), e))?;
        link.pin(path)
            .map_err(|e| bpf_error(format!("pinning the fault link at {}", path.display()), e))?;
        Ok(())
    }

    /// Detaches it now, reporting a failure that dropping it would ignore.
    pub fn detach(mut self) -> Result<()> {
        let program: &mut SchedClassifier = self
            .ebpf
            .program_mut(bpf::programs::FAULT)
            .ok_or_else(|| Error::Internal("fault program vanished".into()))?
            .try_into()
            .map_err(|e| bpf_error("the fault program", e))?;
        program
            .detach(self.link)
            .map_err(|e| bpf_error(format!("detaching the fault program from {}", self.iface), e))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn percent_is_parts_per_million() {
        let spec = FaultSpec::percent(10.0, 2.5);
        assert_eq!(spec.drop_ppm, 100_000);
        assert_eq!(spec.dup_ppm, 25_000);
        assert_eq!((spec.port_lo, spec.port_hi), (0, u16::MAX));
        assert!(spec.validate().is_ok());
        assert!(FaultSpec::NONE.is_none());
        assert!(!spec.is_none());
    }

    #[test]
    fn bad_specs_are_refused() {
        assert!(FaultSpec {
            drop_ppm: PER_MILLION + 1,
            ..FaultSpec::NONE
        }
        .validate()
        .is_err());
        assert!(FaultSpec::percent(1.0, 0.0).ports(9, 8).validate().is_err());
        assert!(FaultSpec::percent(1.0, 0.0).ports(8, 8).validate().is_ok());
    }

    #[test]
    #[should_panic]
    fn negative_percent_panics() {
        FaultSpec::percent(-1.0, 0.0);
    }

    #[test]
    fn delivered_counts_duplicates_once_more() {
        let stats = FaultStats {
            seen: 100,
            dropped: 10,
            duplicated: 3,
        };
        assert_eq!(stats.delivered(), 93);
    }
}
