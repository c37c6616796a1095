//! Test support: evaluates C expressions (sizes, offsets, constants) against
//! the headers in `ebpf/` with the host C compiler, so the Rust mirrors are
//! checked against the C definitions rather than against themselves.

use std::{path::PathBuf, process::Command};

/// Compiles and runs a C program that includes `ebpf/<header>` and prints
/// each expression as an unsigned 64-bit number.
pub fn c_values(header: &str, exprs: &[String]) -> Vec<u64> {
    let ebpf = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../ebpf");
    let dir = std::env::temp_dir().join(format!("aggbox-layout-{}-{header}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let mut src = format!(
        "#include <stdio.h>\n#include <stddef.h>\n#include \"{header}\"\nint main(void) {{\n"
    );
    for expr in exprs {
        src.push_str(&format!("  printf(\"%llu\\n\", (unsigned long long)({expr}));\n"));
    }
    src.push_str("  return 0;\n}\n");
    let c_file = dir.join("layout.c");
    let exe = dir.join("layout");
    std::fs::write(&c_file, src).unwrap();
    let status = Command::new("cc")
        .arg(format!("-I{}", ebpf.display()))
        .arg("-I/usr/include/x86_64-linux-gnu")
        .arg("-D__always_inline=inline")
        .arg(&c_file)
        .arg("-o")
        .arg(&exe)
        .status()
        .expect("run cc");
    assert!(status.success(), "cc failed on the layout program for {header}");
    let out = Command::new(&exe).output().unwrap();
    std::fs::remove_dir_all(&dir).ok();
    String::from_utf8(out.stdout).unwrap().lines().map(|l| l.parse().unwrap()).collect()
}
