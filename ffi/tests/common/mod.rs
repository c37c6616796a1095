//! What the tests that compile C and C++ programs against the library share
//! (`tests/c_abi.rs`, `tests/cpp.rs`): where the workspace and
//! `libaggbox.so` are, and how to compile, link and run a program.

// Each test binary uses a part of it.
#![allow(dead_code)]

use std::{
    env,
    path::{Path, PathBuf},
    process::{Command, Output},
};

/// The workspace root.
pub fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .unwrap()
        .to_path_buf()
}

/// The directory holding the `libaggbox.so` to test. `cargo test` builds it
/// into `target/<profile>/deps`, next to the test's binary, and does not
/// copy it to `target/<profile>` (only `cargo build` does), so that one comes
/// first; then `target/<profile>`, `target/debug` and `target/release`.
pub fn lib_dir() -> PathBuf {
    let exe = env::current_exe().expect("path of the test binary");
    let deps = exe.parent().map(Path::to_path_buf);
    let profile = deps
        .as_deref()
        .and_then(Path::parent)
        .map(Path::to_path_buf);
    let target = root().join("target");
    let candidates: Vec<PathBuf> = deps
        .into_iter()
        .chain(profile)
        .chain([target.join("debug"), target.join("release")])
        .collect();
    candidates
        .iter()
        .find(|dir| dir.join("libaggbox.so").is_file())
        .cloned()
        .unwrap_or_else(|| {
            panic!(
                "libaggbox.so is in none of {}: run cargo build -p aggbox-ffi first",
                candidates
                    .iter()
                    .map(|d| d.display().to_string())
                    .collect::<Vec<_>>()
                    .join(", ")
            )
        })
}

/// Where the programs of the test `test` go (CARGO_TARGET_TMPDIR is shared
/// by every test of the workspace).
pub fn out_dir(test: &str) -> PathBuf {
    let dir = Path::new(env!("CARGO_TARGET_TMPDIR")).join(format!("aggbox-ffi-{test}"));
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

/// The status and both outputs of a program, for an assertion message.
pub fn show(output: &Output) -> String {
    format!(
        "{}\n--- stdout\n{}--- stderr\n{}",
        output.status,
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    )
}

/// The C compiler: `$CC`, else `cc`.
pub fn cc() -> String {
    env::var("CC").unwrap_or_else(|_| "cc".into())
}

/// The C++ compiler: `$CXX`, else `c++`.
pub fn cxx() -> String {
    env::var("CXX").unwrap_or_else(|_| "c++".into())
}

/// Compiles and links `source` with `compiler -std=<std>`, warnings as
/// errors, `-I` each of `include` (relative to the workspace root), against
/// `libaggbox.so` (found at run time through an rpath), into `out`.
pub fn compile(compiler: &str, std: &str, include: &[&str], source: &Path, out: &Path) {
    let lib = lib_dir();
    let mut command = Command::new(compiler);
    command
        .arg(format!("-std={std}"))
        .args(["-Wall", "-Wextra", "-Werror", "-pedantic", "-g"]);
    for dir in include {
        command.arg("-I").arg(root().join(dir));
    }
    let output = command
        .arg(source)
        .arg("-o")
        .arg(out)
        .arg("-L")
        .arg(&lib)
        .arg("-laggbox")
        .arg(format!("-Wl,-rpath,{}", lib.display()))
        .output()
        .unwrap_or_else(|e| panic!("running {compiler}: {e}"));
    assert!(
        output.status.success(),
        "{compiler} {} failed: {}",
        source.display(),
        show(&output)
    );
}
