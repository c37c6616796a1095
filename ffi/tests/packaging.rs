//! The library as a system installs it: `libaggbox.so` has the SONAME
//! `libaggbox.so.<AGGBOX_ABI_VERSION - 1>` and exports exactly the
//! functions of `include/aggbox.h` (nm -D); `scripts/install.sh` with a
//! DESTDIR stages the header, both libraries, their links and the
//! pkg-config files, a C program built with nothing but `pkg-config
//! --cflags --libs aggbox` (or `aggbox-static`) runs against them, and
//! `scripts/install.sh uninstall` removes every file it installed.

mod common;

use std::{
    collections::BTreeSet,
    fs,
    path::{Path, PathBuf},
    process::Command,
};

use common::{cc, lib_dir, root, show};

/// `AGGBOX_ABI_VERSION` as the header defines it.
fn abi_version() -> u32 {
    let header = fs::read_to_string(root().join("include/aggbox.h")).unwrap();
    header
        .lines()
        .find_map(|l| l.strip_prefix("#define AGGBOX_ABI_VERSION "))
        .expect("the header defines AGGBOX_ABI_VERSION")
        .trim()
        .parse()
        .unwrap()
}

/// The functions the header declares.
fn header_functions() -> BTreeSet<String> {
    let header = fs::read_to_string(root().join("include/aggbox.h")).unwrap();
    header
        .lines()
        .filter(|l| !l.starts_with(' ') && !l.starts_with('#') && !l.starts_with('*'))
        .filter_map(|l| {
            let open = l.find('(')?;
            let name = l[..open].rsplit([' ', '*']).next()?;
            name.starts_with("aggbox_").then(|| name.to_string())
        })
        .collect()
}

fn run(command: &mut Command) -> String {
    let output = command
        .output()
        .unwrap_or_else(|e| panic!("{command:?}: {e}"));
    assert!(output.status.success(), "{command:?}: {}", show(&output));
    String::from_utf8(output.stdout).unwrap()
}

#[test]
fn the_shared_library_has_a_versioned_soname() {
    let dynamic = run(Command::new("readelf")
        .arg("-d")
        .arg(lib_dir().join("libaggbox.so")));
    let want = format!("Library soname: [libaggbox.so.{}]", abi_version() - 1);
    assert!(dynamic.contains(&want), "no {want:?} in:\n{dynamic}");
}

#[test]
fn only_the_functions_of_the_header_are_exported() {
    let nm = run(Command::new("nm")
        .args(["-D", "--defined-only", "--format=posix"])
        .arg(lib_dir().join("libaggbox.so")));
    let exported: BTreeSet<String> = nm
        .lines()
        .filter_map(|l| l.split_whitespace().next())
        .map(String::from)
        .collect();
    let foreign: Vec<&String> = exported
        .iter()
        .filter(|s| !s.starts_with("aggbox_"))
        .collect();
    assert!(
        foreign.is_empty(),
        "libaggbox.so exports symbols that are not aggbox_*: {foreign:?}"
    );
    let declared = header_functions();
    assert!(
        declared.len() > 30,
        "the header parse found only {declared:?}"
    );
    assert_eq!(exported, declared, "exports and header declarations differ");
}

/// A temporary directory removed when dropped, even when the test fails.
struct TempDir(PathBuf);

impl TempDir {
    fn new(name: &str) -> TempDir {
        let dir = std::env::temp_dir().join(format!("aggbox-{name}-{}", std::process::id()));
        let _ = fs::remove_dir_all(&dir);
        fs::create_dir_all(&dir).unwrap();
        TempDir(dir)
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = fs::remove_dir_all(&self.0);
    }
}

/// `scripts/install.sh action` with the libraries of this build staged
/// under `destdir` at `prefix`.
fn install(action: &str, destdir: &Path, prefix: &str) -> String {
    run(Command::new("bash")
        .arg(root().join("scripts/install.sh"))
        .arg(action)
        .env("DESTDIR", destdir)
        .env("PREFIX", prefix)
        .env("NO_BUILD", "1")
        .env("FROM", lib_dir())
        .env("LDCONFIG", "true"))
}

/// What every file under `dir` is (for the assertion messages).
fn tree(dir: &Path) -> Vec<String> {
    let mut found = Vec::new();
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        for entry in fs::read_dir(&d).unwrap().flatten() {
            let path = entry.path();
            if path.is_dir() && !path.is_symlink() {
                stack.push(path.clone());
            }
            found.push(path.strip_prefix(dir).unwrap().display().to_string());
        }
    }
    found.sort();
    found
}

#[test]
fn a_staged_install_builds_programs_and_uninstalls() {
    let stage = TempDir::new("stage");
    let prefix = "/opt/aggbox-test";
    install("install", &stage.0, prefix);
    let root_dir = stage.0.join(&prefix[1..]);
    let major = abi_version() - 1;
    let version = env!("CARGO_PKG_VERSION");
    let (_, minor_patch) = version.split_once('.').unwrap();
    let real = format!("libaggbox.so.{major}.{minor_patch}");
    let lib = root_dir.join("lib");
    for file in [
        "include/aggbox.h",
        "lib/libaggbox.a",
        &format!("lib/{real}"),
        "lib/pkgconfig/aggbox.pc",
    ] {
        assert!(
            root_dir.join(file).is_file(),
            "{file} not installed: {:?}",
            tree(&stage.0)
        );
    }
    assert_eq!(
        fs::read_link(lib.join(format!("libaggbox.so.{major}"))).unwrap(),
        Path::new(&real)
    );
    assert_eq!(
        fs::read_link(lib.join("libaggbox.so")).unwrap(),
        Path::new(&format!("libaggbox.so.{major}"))
    );
    let pc = fs::read_to_string(lib.join("pkgconfig/aggbox.pc")).unwrap();
    assert!(pc.contains(&format!("prefix={prefix}\n")), "{pc}");
    assert!(pc.contains(&format!("Version: {version}\n")), "{pc}");

    // pkg-config as a program's build sees the staged tree.
    let pkg_config = |args: &[&str]| {
        run(Command::new("pkg-config")
            .args(args)
            .env("PKG_CONFIG_PATH", lib.join("pkgconfig"))
            .env("PKG_CONFIG_SYSROOT_DIR", &stage.0))
    };
    assert_eq!(pkg_config(&["--modversion", "aggbox"]).trim(), version);
    let source = stage.0.join("check.c");
    fs::write(
        &source,
        "#include <aggbox.h>\n#include <stdio.h>\n\
         int main(void) {\n\
         \x20   printf(\"%s %u\\n\", aggbox_version(), aggbox_abi_version());\n\
         \x20   return aggbox_abi_version() == AGGBOX_ABI_VERSION ? 0 : 1;\n\
         }\n",
    )
    .unwrap();
    for (package, name) in [
        ("aggbox", "check-shared"),
        ("aggbox-static", "check-static"),
    ] {
        let flags = pkg_config(&["--cflags", "--libs", package]);
        let program = stage.0.join(name);
        run(Command::new(cc())
            .args(["-std=c11", "-Wall", "-Werror"])
            .arg(&source)
            .arg("-o")
            .arg(&program)
            .args(flags.split_whitespace()));
        let out = run(Command::new(&program).env("LD_LIBRARY_PATH", &lib));
        assert_eq!(out.trim(), format!("{version} {}", abi_version()), "{name}");
        let needed = run(Command::new("readelf").arg("-d").arg(&program));
        let wants_so = needed.contains(&format!("Shared library: [libaggbox.so.{major}]"));
        assert_eq!(wants_so, package == "aggbox", "{name}: {needed}");
    }

    let removed = install("uninstall", &stage.0, prefix);
    assert_eq!(removed.lines().count(), 7, "{removed}");
    let left: Vec<String> = tree(&stage.0)
        .into_iter()
        .filter(|f| f.contains("aggbox") && !f.starts_with("check"))
        .filter(|f| {
            !root_dir
                .join(f.trim_start_matches(&prefix[1..]).trim_start_matches('/'))
                .is_dir()
        })
        .collect();
    assert!(left.is_empty(), "uninstall left {left:?}");
}
