//! Without CAP_BPF, CAP_NET_ADMIN and CAP_SYS_ADMIN (dropped with capsh):
//! `aggbox doctor` and AGGBOX_DATAPATH=auto pick the user datapath and say
//! why, and AGGBOX_DATAPATH=kernel fails with that reason. With them, doctor
//! reports the kernel datapath available.

use std::process::Output;

use aggbox_core::cluster::Cluster;
use aggbox_tests::{fields, workspace_binary};

const DROP: &str = "--drop=cap_bpf,cap_net_admin,cap_sys_admin";

/// Runs `command` (a shell line) in host 0, with the capabilities dropped
/// when `drop` is set.
fn in_host(cluster: &Cluster, drop: bool, env: &[(&str, &str)], command: &str) -> Output {
    let mut cmd = if drop {
        let mut c = cluster.command(0, "capsh");
        c.args([DROP, "--", "-c", command]);
        c
    } else {
        let mut c = cluster.command(0, "sh");
        c.args(["-c", command]);
        c
    };
    for (k, v) in env {
        cmd.env(k, v);
    }
    cmd.output().expect("run in host 0")
}

fn text(out: &Output) -> String {
    format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr))
}

#[test]
fn doctor_reports_the_kernel_datapath_with_privileges() {
    let cluster = Cluster::temporary(1).unwrap();
    let doctor = format!("{} doctor", workspace_binary("aggbox").display());
    let out = in_host(&cluster, false, &[], &doctor);
    let report = text(&out);
    assert!(out.status.success(), "{report}");
    assert!(report.contains("datapath: auto would choose kernel"), "{report}");
    // The cluster's ports run the bare XDP program: its hosts are on the XDP hooks.
    assert!(report.contains("hooks         XDP and TC programs on eth0: AGGBOX_HOOKS=xdp"), "{report}");
    assert!(report.contains("xdp           attaches to eth0 in driver mode"), "{report}");
    assert!(!report.contains("FAIL"), "{report}");
    // Left to choose, a veth gets the TC hooks, and nothing is probed with XDP.
    let out = in_host(&cluster, false, &[("AGGBOX_HOOKS", "auto")], &doctor);
    let report = text(&out);
    assert!(out.status.success(), "{report}");
    assert!(report.contains("hooks         TC programs on eth0: a virtual device"), "{report}");
    assert!(!report.contains("xdp   "), "{report}");
    assert!(report.contains("datapath: auto would choose kernel"), "{report}");
}

#[test]
fn without_privileges_auto_falls_back_and_kernel_fails() {
    let cluster = Cluster::temporary(1).unwrap();
    let doctor = format!("{} doctor", workspace_binary("aggbox").display());
    let out = in_host(&cluster, true, &[], &doctor);
    let report = text(&out);
    assert!(out.status.success(), "doctor exits 0 when the user datapath can run: {report}");
    assert!(report.contains("FAIL capabilities  missing CAP_NET_ADMIN, CAP_SYS_ADMIN, CAP_BPF"), "{report}");
    assert!(report.contains("fix: "), "{report}");
    assert!(report.contains("datapath: auto would choose user (kernel datapath unavailable"), "{report}");

    let rank = env!("CARGO_BIN_EXE_aggbox-rank");
    let env = |datapath: &'static str| {
        [("RANK", "0"), ("WORLD_SIZE", "1"), ("MASTER_ADDR", "10.77.0.1"), ("AGGBOX_DATAPATH", datapath)]
    };
    let out = in_host(&cluster, true, &env("auto"), &format!("{rank} 5"));
    let line = text(&out);
    assert!(out.status.success(), "{line}");
    let report = fields(&line);
    assert_eq!(report["datapath"], "user", "{line}");
    assert!(report["reason"].starts_with("auto_chose_the_user_datapath_on_eth0"), "{line}");
    assert!(report["reason"].contains("Operation_not_permitted"), "says why: {line}");

    let out = in_host(&cluster, true, &env("kernel"), &format!("{rank} 5"));
    let line = text(&out);
    assert_eq!(out.status.code(), Some(1), "{line}");
    assert!(line.contains("status=Unsupported"), "{line}");
    assert!(line.contains("AGGBOX_DATAPATH=kernel on eth0"), "{line}");
    assert!(line.contains("Operation not permitted"), "{line}");
}
