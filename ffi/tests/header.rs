//! Drift check: `include/aggbox.h` must be exactly what cbindgen generates
//! from this crate with `ffi/cbindgen.toml`. With `AGGBOX_BLESS_HEADER=1`
//! (what `scripts/gen-header.sh` sets) the test writes the header instead.

use std::{env, fs, path::PathBuf};

use aggbox_core::maps::{Prog, STAT_NAMES};

fn manifest_dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

fn header_path() -> PathBuf {
    manifest_dir().join("../include/aggbox.h")
}

/// The header as cbindgen generates it now.
fn generate() -> String {
    let config = cbindgen::Config::from_file(manifest_dir().join("cbindgen.toml"))
        .expect("read ffi/cbindgen.toml");
    let bindings = cbindgen::Builder::new()
        .with_config(config)
        .with_src(manifest_dir().join("src/lib.rs"))
        .generate()
        .expect("cbindgen failed to generate include/aggbox.h");
    let mut out = Vec::new();
    bindings.write(&mut out);
    String::from_utf8(out).expect("cbindgen wrote UTF-8")
}

#[test]
fn header_is_up_to_date() {
    let generated = generate();
    let path = header_path();
    if env::var_os("AGGBOX_BLESS_HEADER").is_some_and(|v| v == "1") {
        fs::write(&path, &generated).unwrap_or_else(|e| panic!("writing {}: {e}", path.display()));
        eprintln!("wrote {}", path.display());
        return;
    }
    let committed = fs::read_to_string(&path).unwrap_or_default();
    if committed != generated {
        let first_difference = committed
            .lines()
            .zip(generated.lines())
            .position(|(a, b)| a != b)
            .unwrap_or_else(|| committed.lines().count().min(generated.lines().count()));
        panic!(
            "include/aggbox.h is out of date with ffi/src (first difference at line {}): \
             run scripts/gen-header.sh",
            first_difference + 1
        );
    }
}

/// The `NAME = value` enumerators of `typedef enum name { ... }` in `header`.
fn c_enum(header: &str, name: &str) -> Vec<(String, usize)> {
    let start = header
        .find(&format!("typedef enum {name} {{"))
        .unwrap_or_else(|| panic!("no enum {name} in the header"));
    let body = &header[start..];
    let body = &body[body.find('{').unwrap() + 1..body.find('}').unwrap()];
    body.lines()
        .map(str::trim)
        .filter(|line| line.starts_with("AGGBOX_"))
        .map(|line| {
            let (name, value) = line
                .trim_end_matches(',')
                .split_once(" = ")
                .expect("NAME = value");
            (name.to_owned(), value.parse().expect("a number"))
        })
        .collect()
}

/// The value of `#define name value` in `header`.
fn c_define(header: &str, name: &str) -> usize {
    let prefix = format!("#define {name} ");
    let line = header
        .lines()
        .find(|l| l.starts_with(&prefix))
        .unwrap_or_else(|| panic!("no {name}"));
    line[prefix.len()..].trim().parse().unwrap()
}

#[test]
fn c_counter_names_are_the_core_ones() {
    let header = generate();
    let progs: Vec<_> = Prog::ALL
        .iter()
        .map(|p| {
            (
                format!("AGGBOX_PROG_{}", p.name().to_uppercase()),
                *p as usize,
            )
        })
        .collect();
    assert_eq!(c_enum(&header, "aggbox_prog"), progs);
    assert_eq!(c_define(&header, "AGGBOX_PROG_COUNT"), Prog::ALL.len());

    let stats: Vec<_> = STAT_NAMES
        .iter()
        .enumerate()
        .map(|(i, n)| (format!("AGGBOX_STAT_{}", n.to_uppercase()), i))
        .collect();
    assert_eq!(c_enum(&header, "aggbox_stat"), stats);
    assert_eq!(c_define(&header, "AGGBOX_STAT_COUNT"), STAT_NAMES.len());
    assert!(header.contains("uint64_t kernel[AGGBOX_PROG_COUNT][AGGBOX_STAT_COUNT];"));
}

#[test]
fn c_status_values_are_the_core_ones() {
    use aggbox_core::Status;
    let expected = [
        ("AGGBOX_OK", Status::Ok),
        ("AGGBOX_ERR_INVALID_ARGUMENT", Status::InvalidArgument),
        ("AGGBOX_ERR_TIMEOUT", Status::Timeout),
        ("AGGBOX_ERR_PEER_FAILED", Status::PeerFailed),
        ("AGGBOX_ERR_SYSTEM", Status::System),
        ("AGGBOX_ERR_UNSUPPORTED", Status::Unsupported),
        ("AGGBOX_ERR_INTERNAL", Status::Internal),
    ]
    .map(|(name, status)| (name.to_owned(), status as usize));
    assert_eq!(c_enum(&generate(), "aggbox_status"), expected);
}
