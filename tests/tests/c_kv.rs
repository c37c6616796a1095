//! Key-value reduce through the C ABI, in an 8-host virtual cluster:
//! `examples/c/wordcount.c` (built against include/aggbox.h and
//! libaggbox.so only) counts the words of Debian's license and copyright
//! texts split across 8 ranks, on the user datapath and on a mixed group
//! (even ranks kernel, odd ranks user); every rank's counts are compared
//! with a plain single-process count. (The argument checks of the C ABI are
//! unit tests in ffi/src/kv.rs.)
//!
//! The tests run one at a time (they share two cores): each holds `serial()`.

use std::{collections::HashMap, time::Duration};

use aggbox_core::{cluster::Cluster, kv::key_owner};
use aggbox_tests::{c_example, fields, license_texts, mixed, number, serial, user, RankProcess};

const HOSTS: usize = 8;
const MASTER_PORT: u16 = 29_880;

/// The reference: every file read here, split on everything that is not an
/// ASCII letter or digit, lower-cased, runs over 64 bytes skipped.
fn reference(files: &[std::path::PathBuf]) -> HashMap<String, u64> {
    let mut counts = HashMap::new();
    for file in files {
        let text = std::fs::read(file).unwrap();
        for word in text.split(|b| !b.is_ascii_alphanumeric()).filter(|w| !w.is_empty() && w.len() <= 64) {
            *counts.entry(String::from_utf8(word.to_ascii_lowercase()).unwrap()).or_insert(0) += 1;
        }
    }
    counts
}

#[test]
fn the_c_word_count_equals_a_plain_count_on_user_and_mixed_datapaths() {
    let _serial = serial();
    let cluster = Cluster::temporary_plain(HOSTS, 1500).unwrap();
    let program = c_example("wordcount");
    let files = license_texts();
    let want = reference(&files);
    let mut args = vec!["--all".to_string()];
    args.extend(files.iter().map(|f| f.display().to_string()));
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    for (k, datapath_of) in [user as fn(usize) -> &'static str, mixed].into_iter().enumerate() {
        let ranks: Vec<RankProcess> = (0..HOSTS)
            .map(|i| RankProcess::spawn(&cluster, i, 0, MASTER_PORT + k as u16, i, HOSTS, datapath_of(i), &program, &args, &[]))
            .collect();
        let mut got: HashMap<String, u64> = HashMap::new();
        let mut words = 0;
        for (i, rank) in ranks.into_iter().enumerate() {
            let (code, lines) = rank.finish(Duration::from_secs(240));
            assert_eq!(code, 0, "rank {i} ({}): {:?}", datapath_of(i), &lines[..lines.len().min(5)]);
            let summary = fields(lines.iter().find(|l| l.starts_with("rank=")).expect("a summary line"));
            assert_eq!(summary["datapath"], datapath_of(i), "rank {i}");
            words += number(&summary, "words");
            for line in lines.iter().filter(|l| l.starts_with("pair ")) {
                let mut parts = line.split(' ').skip(1);
                let (word, count) = (parts.next().unwrap().to_string(), parts.next().unwrap().parse().unwrap());
                assert_eq!(key_owner(word.as_bytes(), HOSTS), i, "{word} is at its owner");
                assert!(got.insert(word, count).is_none(), "a word at two ranks");
            }
        }
        assert_eq!(words, want.values().sum::<u64>(), "every word emitted once");
        assert_eq!(got, want, "every count equals the plain count ({})", datapath_of(0));
    }
}
