//! The C API as a C program sees it: the examples in `examples/c` compiled
//! with nothing but `include/aggbox.h` and `libaggbox.so`, then run.

mod common;

use std::{
    path::{Path, PathBuf},
    process::Command,
};

use common::{cc, cxx, root, show};

/// Where the programs of this test go.
fn out_dir() -> PathBuf {
    common::out_dir("c_abi")
}

/// Compiles and links `source` against the header and the shared library
/// into a program named `name`, with warnings as errors.
fn build(compiler: &str, std: &str, source: &Path, name: &str) -> PathBuf {
    let out = out_dir().join(name);
    common::compile(compiler, std, &["include"], source, &out);
    out
}

fn example(name: &str) -> PathBuf {
    root().join("examples/c").join(name)
}

#[test]
fn abi_check_passes() {
    let program = build(&cc(), "c11", &example("abi_check.c"), "abi_check");
    let output = Command::new(&program).output().unwrap();
    assert!(
        output.status.success(),
        "abi_check failed: {}",
        show(&output)
    );
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert!(stdout.contains(" passed, 0 failed"), "{}", show(&output));
}

#[test]
fn header_works_from_cpp() {
    let source = out_dir().join("header_cpp.cpp");
    std::fs::write(
        &source,
        "#include \"aggbox.h\"\n\
         int main() {\n\
         \x20   aggbox_comm *comm = nullptr;\n\
         \x20   aggbox_config config;\n\
         \x20   aggbox_config_init(&config);\n\
         \x20   bool ok = aggbox_comm_size(comm) == -1 && aggbox_abi_version() == AGGBOX_ABI_VERSION\n\
         \x20       && aggbox_comm_init(&config, nullptr) == AGGBOX_ERR_INVALID_ARGUMENT;\n\
         \x20   return ok ? 0 : 1;\n\
         }\n",
    )
    .unwrap();
    let program = build(&cxx(), "c++17", &source, "header_cpp");
    let output = Command::new(&program).output().unwrap();
    assert!(
        output.status.success(),
        "the C++ program failed: {}",
        show(&output)
    );
}

#[test]
fn barrier_example_compiles() {
    build(&cc(), "c11", &example("barrier.c"), "barrier");
}

/// One rank on the user datapath: rendezvous with itself, no privilege.
#[test]
fn barrier_example_runs_alone() {
    let program = build(&cc(), "c11", &example("barrier.c"), "barrier_run");
    let output = Command::new(&program)
        .arg("10")
        .env("RANK", "0")
        .env("WORLD_SIZE", "1")
        .env("MASTER_ADDR", "127.0.0.1")
        .env("AGGBOX_DATAPATH", "user")
        .env_remove("AGGBOX_IFACE")
        .env_remove("AGGBOX_PORT")
        .env_remove("MASTER_PORT")
        .output()
        .unwrap();
    assert!(output.status.success(), "barrier failed: {}", show(&output));
    let stdout = String::from_utf8_lossy(&output.stdout);
    let line = stdout.lines().next().unwrap_or_default();
    assert!(
        line.starts_with("rank=0 size=1 datapath=user barriers=10 total_us="),
        "{}",
        show(&output)
    );
    assert!(line.contains(" per_barrier_us="), "{}", show(&output));
    // The counters come last, after the fields scripts already parse.
    let fields: Vec<&str> = line.split_whitespace().collect();
    assert_eq!(fields.len(), 9, "{}", show(&output));
    assert!(
        fields[5].starts_with("per_barrier_us="),
        "{}",
        show(&output)
    );
    assert!(
        fields[6]
            .strip_prefix("retransmits=")
            .is_some_and(|n| n.parse::<u64>().is_ok()),
        "{}",
        show(&output)
    );
    assert_eq!(
        fields[7..],
        ["xdp_accepted=0", "tc_accepted=0"],
        "the user datapath: {}",
        show(&output)
    );
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(
        !stderr.contains("fell back"),
        "asked for user: {}",
        show(&output)
    );
}

/// Auto on 127.0.0.1 cannot have the kernel datapath (it does not attach to
/// loopback): the example says why it fell back to the user one.
#[test]
fn barrier_example_says_why_auto_fell_back() {
    let program = build(&cc(), "c11", &example("barrier.c"), "barrier_auto");
    let output = Command::new(&program)
        .arg("2")
        .env("RANK", "0")
        .env("WORLD_SIZE", "1")
        .env("MASTER_ADDR", "127.0.0.1")
        .env("AGGBOX_DATAPATH", "auto")
        .env_remove("AGGBOX_IFACE")
        .env_remove("AGGBOX_PORT")
        .env_remove("MASTER_PORT")
        .output()
        .unwrap();
    assert!(output.status.success(), "barrier failed: {}", show(&output));
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert!(
        stdout.starts_with("rank=0 size=1 datapath=user barriers=2 total_us="),
        "{}",
        show(&output)
    );
    let stderr = String::from_utf8_lossy(&output.stderr);
    let reason = stderr
        .lines()
        .find_map(|l| l.strip_prefix("aggbox: datapath auto fell back: "))
        .unwrap_or_else(|| panic!("no reason on stderr: {}", show(&output)));
    assert!(
        reason.starts_with("auto chose the user datapath on ") && reason.contains("loopback"),
        "{}",
        show(&output)
    );
}

#[test]
fn barrier_example_reports_errors() {
    let program = build(&cc(), "c11", &example("barrier.c"), "barrier_err");
    let output = Command::new(&program)
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
}

/// One rank on the user datapath: every size broadcast (to nobody), checked
/// and timed, asynchronously and blocking.
#[test]
fn broadcast_example_runs_alone() {
    let program = build(&cc(), "c11", &example("broadcast.c"), "broadcast_run");
    let output = Command::new(&program)
        .args(["0", "1", "1433", "1048576"])
        .env("RANK", "0")
        .env("WORLD_SIZE", "1")
        .env("MASTER_ADDR", "127.0.0.1")
        .env("AGGBOX_DATAPATH", "user")
        .env_remove("AGGBOX_IFACE")
        .env_remove("AGGBOX_PORT")
        .env_remove("MASTER_PORT")
        .output()
        .unwrap();
    assert!(output.status.success(), "broadcast failed: {}", show(&output));
    let stdout = String::from_utf8_lossy(&output.stdout);
    let lines: Vec<&str> = stdout.lines().collect();
    assert_eq!(lines.len(), 4, "one line per size: {}", show(&output));
    for (line, bytes) in lines.iter().zip(["0", "1", "1433", "1048576"]) {
        assert!(
            line.starts_with(&format!("rank=0 size=1 datapath=user bytes={bytes} iterations=")),
            "{}",
            show(&output)
        );
        assert!(line.contains(" errors=0 "), "{}", show(&output));
    }
}

#[test]
fn broadcast_example_rejects_a_bad_size() {
    let program = build(&cc(), "c11", &example("broadcast.c"), "broadcast_usage");
    let output = Command::new(&program).arg("12x").output().unwrap();
    assert_eq!(output.status.code(), Some(2), "{}", show(&output));
}

/// The C compiler lays the structs out as Rust does: every field's offset
/// and every struct's size.
#[test]
fn struct_layouts_match_rust() {
    use std::mem::{offset_of, size_of};

    use aggbox::{aggbox_config, aggbox_stats};

    macro_rules! layout {
        ($ty:ident: $($field:ident),*) => {
            [(format!("sizeof({})", stringify!($ty)), size_of::<$ty>())]
                .into_iter()
                .chain([$((
                    format!("offsetof({}, {})", stringify!($ty), stringify!($field)),
                    offset_of!($ty, $field),
                )),*])
        };
    }
    let expected: Vec<(String, usize)> = layout!(aggbox_config:
        size, rank, world_size, master_addr, master_port, iface, port, datapath, timeout_ms)
    .chain(layout!(aggbox_stats:
        size, datapath, packets_sent, packets_received, retransmits, duplicates,
        dropped_malformed, dropped_foreign, barriers, kernel, broadcasts, bcast_chunks_sent,
        bcast_acks_received))
    .collect();

    let mut source = String::from(
        "#include <stddef.h>\n#include <stdio.h>\n#include \"aggbox.h\"\nint main(void) {\n",
    );
    for (expr, _) in &expected {
        source += &format!("    printf(\"%zu\\n\", (size_t){expr});\n");
    }
    source += "    return 0;\n}\n";
    let path = out_dir().join("layout.c");
    std::fs::write(&path, source).unwrap();
    let program = build(&cc(), "c11", &path, "layout");
    let output = Command::new(&program).output().unwrap();
    assert!(output.status.success(), "{}", show(&output));
    let c: Vec<usize> = String::from_utf8_lossy(&output.stdout)
        .lines()
        .map(|l| l.parse().unwrap())
        .collect();
    let c: Vec<(String, usize)> = expected.iter().map(|(e, _)| e.clone()).zip(c).collect();
    assert_eq!(c, expected);
}
