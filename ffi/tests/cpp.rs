//! The C++ wrapper `bindings/cpp/aggbox.hpp` as a C++17 program sees it:
//! `examples/cpp/barrier.cpp` and the checks of
//! `bindings/cpp/tests/aggbox_hpp_check.cpp`, compiled with `-std=c++17
//! -Wall -Wextra -Werror -I include -I bindings/cpp` against `libaggbox.so`,
//! then run on one rank at 127.0.0.1 (no peer, no privilege).

mod common;

use std::{
    path::{Path, PathBuf},
    process::Command,
    sync::OnceLock,
};

use common::{cxx, root, show};

/// Compiles the C++ program `source` (relative to the workspace root) into
/// one named `name`.
fn build(source: &str, name: &str) -> PathBuf {
    let out = common::out_dir("cpp").join(name);
    common::compile(
        &cxx(),
        "c++17",
        &["include", "bindings/cpp"],
        &root().join(source),
        &out,
    );
    out
}

/// `examples/cpp/barrier.cpp`, compiled once for every test here.
fn barrier() -> &'static Path {
    static PROGRAM: OnceLock<PathBuf> = OnceLock::new();
    PROGRAM.get_or_init(|| build("examples/cpp/barrier.cpp", "barrier"))
}

/// `barrier` with `args` as rank 0 of 1 on `datapath`, with none of the
/// optional variables of the caller's environment.
fn run_barrier(datapath: &str, args: &[&str]) -> std::process::Output {
    Command::new(barrier())
        .args(args)
        .env("RANK", "0")
        .env("WORLD_SIZE", "1")
        .env("MASTER_ADDR", "127.0.0.1")
        .env("AGGBOX_DATAPATH", datapath)
        .env_remove("AGGBOX_IFACE")
        .env_remove("AGGBOX_PORT")
        .env_remove("AGGBOX_TIMEOUT_MS")
        .env_remove("MASTER_PORT")
        .output()
        .unwrap()
}

#[test]
fn wrapper_checks_pass() {
    let program = build(
        "bindings/cpp/tests/aggbox_hpp_check.cpp",
        "aggbox_hpp_check",
    );
    let output = Command::new(&program).output().unwrap();
    assert!(
        output.status.success(),
        "aggbox_hpp_check failed: {}",
        show(&output)
    );
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert!(stdout.contains(" passed, 0 failed"), "{}", show(&output));
}

/// One rank on the user datapath: the line of `examples/c/barrier.c`.
#[test]
fn barrier_example_runs_alone() {
    let output = run_barrier("user", &["10"]);
    assert!(output.status.success(), "barrier failed: {}", show(&output));
    let stdout = String::from_utf8_lossy(&output.stdout);
    let line = stdout.lines().next().unwrap_or_default();
    assert!(
        line.starts_with("rank=0 size=1 datapath=user barriers=10 total_us="),
        "{}",
        show(&output)
    );
    let fields: Vec<&str> = line.split_whitespace().collect();
    assert_eq!(fields.len(), 8, "{}", show(&output));
    let number = |field: &str, key: &str| {
        field
            .strip_prefix(key)
            .and_then(|v| v.strip_prefix('='))
            .and_then(|v| v.parse::<f64>().ok())
            .unwrap_or_else(|| panic!("{field} is not {key}=<number>: {}", show(&output)))
    };
    number(fields[4], "total_us");
    number(fields[5], "per_barrier_us");
    number(fields[6], "retransmits");
    assert_eq!(fields[7], "xdp_accepted=0", "{}", show(&output));
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(!stderr.contains("fell back"), "{}", show(&output));
}

/// Auto on loopback falls back to the user datapath and says why on stderr.
#[test]
fn barrier_example_says_why_auto_fell_back() {
    let output = run_barrier("auto", &["2"]);
    assert!(output.status.success(), "barrier failed: {}", show(&output));
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert!(
        stdout.starts_with("rank=0 size=1 datapath=user barriers=2 "),
        "{}",
        show(&output)
    );
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(
        stderr.contains("aggbox: datapath auto fell back: auto chose the user datapath on ")
            && stderr.contains("loopback"),
        "{}",
        show(&output)
    );
}

/// A failure of the C API arrives as an `aggbox::Error` with its status and
/// the library's message.
#[test]
fn barrier_example_reports_errors() {
    let output = Command::new(barrier())
        .arg("3")
        .env_remove("RANK")
        .output()
        .unwrap();
    assert_eq!(output.status.code(), Some(1), "{}", show(&output));
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(
        stderr.contains("barrier: error (invalid argument): aggbox_comm_init_from_env: ")
            && stderr.contains("RANK is not set"),
        "{}",
        show(&output)
    );

    let usage = run_barrier("user", &["zero"]);
    assert_eq!(usage.status.code(), Some(2), "{}", show(&usage));
}
