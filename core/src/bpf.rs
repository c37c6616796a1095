//! The BPF objects, compiled from `ebpf/*.bpf.c` by `build.rs` and embedded.

include!(concat!(env!("OUT_DIR"), "/bpf_objects.rs"));

/// Program names inside the objects (their C function names).
pub mod programs {
    /// In [`super::XDP_INGRESS`].
    pub const XDP_INGRESS: &str = "aggbox_xdp_ingress";
    /// In [`super::XDP_INGRESS`]: the reduction fold stage, tail-called.
    pub const XDP_RED_FOLD: &str = "aggbox_xdp_red_fold";
    /// In [`super::TC_INGRESS`].
    pub const TC_INGRESS: &str = "aggbox_tc_ingress";
    /// In [`super::TC_EGRESS`].
    pub const TC_EGRESS: &str = "aggbox_tc_egress";
    /// In [`super::FAULT`].
    pub const FAULT: &str = "aggbox_fault";
    /// In [`super::XDP_PASS`].
    pub const XDP_PASS: &str = "aggbox_xdp_pass";
}
