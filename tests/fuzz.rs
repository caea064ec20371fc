//! Fuzzing of every parser of untrusted bytes (issue 7), proptest-driven so
//! it runs on the stable toolchain in every CI run.
//!
//! Seeds are real files of a real store (index records, the latest
//! pointer, manifests, segments, packs, task records, tags, the retention
//! policy, sweep reports and condemned lists) plus a real journal. Each
//! case mutates one seed (flips, insertions, deletions, truncation) and
//! feeds it to its parser; digest-named formats are renamed after their
//! mutated bytes and journals re-sealed, so the structure behind the digest
//! is what gets exercised. A parser may refuse anything but must answer:
//! no panic, no hang. A second target puts a mutated file back into a copy
//! of the store and runs the store's own readers over it (open, verify,
//! tags, retention, tasks, pins, the last sweep, history, a listing).
//!
//! `STRATA_FUZZ_CASES` sets the cases per target (default 256; a longer run
//! for releases is documented in docs/OPERATIONS.md). A crash found here
//! becomes a named regression test below.

mod common;

use common::*;
use proptest::prelude::*;
use std::fs;
use std::path::{Path, PathBuf};
use std::sync::OnceLock;
use strata::format::{
    journal, manifest::Manifest, pack, pointer::LatestPointer, record::IndexRecord, rowcodec,
    segment::Segment,
};
use strata::task::TaskRecord;
use strata::Store;

fn cases() -> u32 {
    std::env::var("STRATA_FUZZ_CASES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(256)
}

/// The seed store: two commits, a materialization, a tag, a policy and two
/// sweeps; kept for the whole test binary.
fn seed_store() -> &'static Path {
    static DIR: OnceLock<tempfile::TempDir> = OnceLock::new();
    DIR.get_or_init(|| {
        let t = tempfile::tempdir().unwrap();
        let (src, st) = (t.path().join("src"), t.path().join("store"));
        for i in 0..30 {
            write(
                &src,
                &format!("d{}/f{i}", i % 3),
                &noise(i, 100 + 40 * i as usize),
            );
        }
        write(&src, "big", &noise(99, 2 << 20));
        let store = new_local_store(&st);
        commit_dir(&store, "s", &src);
        write(&src, "d0/f0", b"changed");
        commit_dir(&store, "s", &src);
        let fold = strata::materialize::MaterializeOptions {
            set: "s".into(),
            generation: None,
            wait: None,
            plan_only: false,
            cancel: Default::default(),
        };
        strata::materialize::materialize(&store, &fold).unwrap();
        strata::tag::tag(&store, "s", "v1", Some(1)).unwrap();
        let policy = strata::retain::Policy {
            keep_last: Some(5),
            keep_within_s: None,
        };
        strata::retain::set_policy(&store, "s", policy).unwrap();
        for _ in 0..2 {
            let opts = strata::sweep::SweepOptions {
                grace: std::time::Duration::ZERO,
                dry_run: false,
                holder: "fuzz".into(),
                recount: false,
                budget: Default::default(),
                upload_age: strata::sweep::DEFAULT_UPLOAD_AGE,
            };
            strata::sweep::sweep(&store, &opts).unwrap();
        }
        t
    })
    .path()
}

fn store_files(root: &Path) -> Vec<PathBuf> {
    let mut out = Vec::new();
    let mut stack = vec![root.to_path_buf()];
    while let Some(p) = stack.pop() {
        for e in fs::read_dir(&p).unwrap().flatten() {
            let path = e.path();
            if path.is_dir() {
                stack.push(path);
            } else if !path.to_string_lossy().ends_with(".lock") {
                out.push(path);
            }
        }
    }
    out.sort();
    out
}

/// Seeds: (path relative to the store, bytes).
fn seeds() -> &'static Vec<(String, Vec<u8>)> {
    static SEEDS: OnceLock<Vec<(String, Vec<u8>)>> = OnceLock::new();
    SEEDS.get_or_init(|| {
        let root = seed_store().join("store");
        store_files(&root)
            .into_iter()
            .map(|p| {
                let rel = p.strip_prefix(&root).unwrap().to_string_lossy().to_string();
                (rel, fs::read(&p).unwrap())
            })
            .collect()
    })
}

#[derive(Debug, Clone)]
enum Mutation {
    Flip(usize, u8),
    Insert(usize, Vec<u8>),
    Delete(usize, usize),
    Truncate(usize),
    Splice(usize, Vec<u8>),
}

fn mutation() -> impl Strategy<Value = Mutation> {
    prop_oneof![
        4 => (any::<usize>(), 1u8..).prop_map(|(i, x)| Mutation::Flip(i, x)),
        1 => (any::<usize>(), proptest::collection::vec(any::<u8>(), 1..16))
            .prop_map(|(i, b)| Mutation::Insert(i, b)),
        1 => (any::<usize>(), 1usize..64).prop_map(|(i, n)| Mutation::Delete(i, n)),
        1 => any::<usize>().prop_map(Mutation::Truncate),
        1 => (any::<usize>(), proptest::collection::vec(any::<u8>(), 1..8))
            .prop_map(|(i, b)| Mutation::Splice(i, b)),
    ]
}

fn mutate(mut b: Vec<u8>, ms: &[Mutation]) -> Vec<u8> {
    for m in ms {
        let at = |i: usize| if b.is_empty() { 0 } else { i % (b.len() + 1) };
        match m {
            Mutation::Flip(i, x) if !b.is_empty() => {
                let i = i % b.len();
                b[i] ^= x;
            }
            Mutation::Flip(..) => {}
            Mutation::Insert(i, bytes) => {
                let i = at(*i);
                b.splice(i..i, bytes.iter().copied());
            }
            Mutation::Delete(i, n) => {
                let i = at(*i).min(b.len());
                let end = (i + n).min(b.len());
                b.drain(i..end);
            }
            Mutation::Truncate(i) => {
                let i = at(*i);
                b.truncate(i);
            }
            Mutation::Splice(i, bytes) => {
                let i = at(*i).min(b.len());
                for (k, x) in bytes.iter().enumerate() {
                    if let Some(slot) = b.get_mut(i + k) {
                        *slot = *x;
                    }
                }
            }
        }
    }
    b
}

fn sha256_hex(b: &[u8]) -> String {
    hex::encode(<sha2::Sha256 as sha2::Digest>::digest(b))
}

/// Feed `bytes` (a mutated `rel`) to the parser of its kind. Every answer
/// is fine; the parser must return.
fn parse_as(rel: &str, bytes: Vec<u8>) {
    let name = sha256_hex(&bytes);
    if rel.starts_with("segments/") {
        if let Ok(seg) = Segment::parse(&name, bytes) {
            for g in 0..seg.group_count() {
                let _ = seg.read_group(g);
            }
        }
    } else if rel.starts_with("manifests/") {
        let _ = Manifest::decode(&name, &bytes);
    } else if rel.starts_with("packs/") {
        let _ = pack::parse(&name, &bytes);
    } else if rel.contains("/index/") {
        let _ = IndexRecord::decode(rel, &bytes);
    } else if rel.ends_with("/LATEST") {
        let _ = LatestPointer::decode(rel, &bytes);
    } else if rel.starts_with("tasks/") {
        let _ = TaskRecord::decode(rel, &bytes);
    } else {
        // JSON records read through the store (tags, policy, sweep
        // reports, condemned lists, leases, the store marker) are covered
        // by the store-level target.
        let _ = serde_json::from_slice::<serde_json::Value>(&bytes);
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: cases(), failure_persistence: None, ..ProptestConfig::default() })]

    /// Every stored format, mutated, through its own parser.
    #[test]
    fn stored_formats_never_panic(pick in any::<usize>(), ms in proptest::collection::vec(mutation(), 1..6)) {
        let seeds = seeds();
        let (rel, good) = &seeds[pick % seeds.len()];
        parse_as(rel, mutate(good.clone(), &ms));
    }

    /// Arbitrary bytes through the row codec.
    #[test]
    fn row_records_never_panic(bytes in proptest::collection::vec(any::<u8>(), 0..512)) {
        let _ = rowcodec::decode(&bytes, "fuzz");
    }

    /// A journal, mutated then re-sealed so its records and header are
    /// what the reader meets.
    #[test]
    fn journals_never_panic(ms in proptest::collection::vec(mutation(), 1..6), count_delta in -2i64..3) {
        let t = tempfile::tempdir().unwrap();
        let path = t.path().join("j");
        let good = sample_journal(&path);
        let body = &good[..good.len() - 48];
        let count = u64::from_le_bytes(good[good.len() - 40..good.len() - 32].try_into().unwrap());
        let mut bytes = mutate(body.to_vec(), &ms);
        bytes.extend_from_slice(b"STRJSEAL");
        bytes.extend_from_slice(&count.saturating_add_signed(count_delta).to_le_bytes());
        let seal = *blake3::hash(&bytes).as_bytes();
        bytes.extend_from_slice(&seal);
        fs::write(&path, &bytes).unwrap();
        if let Ok(mut r) = journal::JournalReader::open(&path) {
            for _ in 0..10_000 {
                match r.next_row() {
                    Ok(Some(_)) => {}
                    Ok(None) | Err(_) => break,
                }
            }
        }
    }
}

fn sample_journal(path: &Path) -> Vec<u8> {
    let mut file = strata::row::Row::tombstone(b"d".to_vec(), b"f".to_vec());
    file.kind = strata::row::Kind::File;
    file.size = 3;
    file.digest = Some([9; 32]);
    let gone = strata::row::Row::tombstone(Vec::new(), b"gone".to_vec());
    sealed_journal(path, &[file, gone])
}

/// Copy the seed store to `to`, with `rel` replaced by `bytes`.
fn damaged_copy(to: &Path, rel: &str, bytes: &[u8]) {
    let from = seed_store().join("store");
    for p in store_files(&from) {
        let r = p.strip_prefix(&from).unwrap();
        let dest = to.join(r);
        fs::create_dir_all(dest.parent().unwrap()).unwrap();
        fs::copy(&p, &dest).unwrap();
    }
    fs::write(to.join(rel), bytes).unwrap();
}

/// The store's own readers over a damaged store: each answers.
fn read_everything(dir: &Path) {
    let storage = std::sync::Arc::new(strata::storage::LocalStorage::new(dir));
    let Ok(store) = Store::open(storage) else {
        return;
    };
    let sets = store.sets().unwrap_or_default();
    let _ = strata::verify::verify(&store, &sets, strata::verify::Selection::All);
    let _ = strata::pin::list(&store);
    let _ = strata::task::Tasks::new(&store).list();
    let _ = strata::sweep::last_report(&store);
    for set in &sets {
        let _ = strata::tag::list(&store, set);
        let _ = strata::retain::load(&store, set);
        let _ = strata::history::versions(&store, set, b"d0/f0");
        if let Ok(view) = strata::compose::GenView::open(&store, set, None, "fuzz") {
            let _ = view.list_dir(b"d1");
        }
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: (cases() / 8).max(8), failure_persistence: None, ..ProptestConfig::default() })]

    /// One stored file damaged in place, then the store read as usual.
    #[test]
    fn a_damaged_store_is_read_without_panic(pick in any::<usize>(), ms in proptest::collection::vec(mutation(), 1..4)) {
        let seeds = seeds();
        let (rel, good) = &seeds[pick % seeds.len()];
        let t = tempfile::tempdir().unwrap();
        damaged_copy(t.path(), rel, &mutate(good.clone(), &ms));
        read_everything(t.path());
    }
}

/// The seeds cover every kind of stored file the fuzzers route.
#[test]
fn seeds_cover_every_stored_format() {
    let kinds = [
        "segments/",
        "manifests/",
        "packs/",
        "/index/",
        "/LATEST",
        "tasks/",
        "/tags/",
        "retention.json",
        ".report.json",
        ".condemned",
        "STORE",
    ];
    let seeds = seeds();
    for k in kinds {
        assert!(
            seeds.iter().any(|(rel, _)| rel.contains(k)),
            "no seed for {k}: {:?}",
            seeds.iter().map(|s| &s.0).collect::<Vec<_>>()
        );
    }
}
