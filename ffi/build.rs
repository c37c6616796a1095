//! Links `libaggbox.so` as a shared library that installs like one: a
//! versioned SONAME (`libaggbox.so.<major>`, the major being
//! `AGGBOX_ABI_VERSION - 1`, so ABI 1 is `libaggbox.so.0`) and only the
//! `aggbox_*` symbols exported (`aggbox.map`, a version script).
//! `scripts/install.sh` installs it as `libaggbox.so.<major>.<minor>.<patch>`
//! with the links `libaggbox.so.<major>` and `libaggbox.so`.

use std::{env, fs, path::Path};

fn main() {
    let dir = env::var("CARGO_MANIFEST_DIR").unwrap();
    let lib_rs = Path::new(&dir).join("src/lib.rs");
    let map = Path::new(&dir).join("aggbox.map");
    println!("cargo:rerun-if-changed={}", lib_rs.display());
    println!("cargo:rerun-if-changed={}", map.display());
    let abi = abi_version(&fs::read_to_string(&lib_rs).unwrap());
    let major = abi - 1;
    println!("cargo:rustc-cdylib-link-arg=-Wl,-soname,libaggbox.so.{major}");
    println!(
        "cargo:rustc-cdylib-link-arg=-Wl,--version-script={}",
        map.display()
    );
    println!("cargo:rustc-env=AGGBOX_SONAME=libaggbox.so.{major}");
    link_soname_in_target(major);
}

/// Programs linked with `-L target/<profile> -laggbox` record the SONAME
/// and look for `libaggbox.so.<major>` at run time, which cargo does not
/// make: link it to `libaggbox.so` next to where cargo puts the library
/// (`target/<profile>` and its `deps`), so that the examples and tests run
/// from the build tree. The link may dangle until cargo has linked the
/// library.
fn link_soname_in_target(major: u32) {
    // OUT_DIR is target/<profile>/build/aggbox-ffi-<hash>/out.
    let out = env::var("OUT_DIR").unwrap();
    let Some(profile) = Path::new(&out).ancestors().nth(3) else {
        return;
    };
    let name = format!("libaggbox.so.{major}");
    for dir in [profile.to_path_buf(), profile.join("deps")] {
        let link = dir.join(&name);
        if fs::symlink_metadata(&link).is_err() {
            let _ = fs::create_dir_all(&dir);
            let _ = std::os::unix::fs::symlink("libaggbox.so", &link);
        }
    }
}

/// The value of `pub const AGGBOX_ABI_VERSION: u32 = N;` in `src/lib.rs`.
fn abi_version(source: &str) -> u32 {
    let line = source
        .lines()
        .find(|l| l.starts_with("pub const AGGBOX_ABI_VERSION: u32 = "))
        .expect("src/lib.rs defines AGGBOX_ABI_VERSION");
    let value = line.rsplit(' ').next().unwrap().trim_end_matches(';');
    let abi: u32 = value.parse().expect("AGGBOX_ABI_VERSION is a number");
    assert!(abi >= 1, "AGGBOX_ABI_VERSION starts at 1");
    abi
}
