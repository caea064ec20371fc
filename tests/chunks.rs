//! Large files as content-defined chunks: what an edit costs, holes, reads
//! through the mount (FUSE chunk reads, then passthrough of the assembled
//! copy), corruption, sweeps of pinned generations, and a store written
//! before chunking.

mod common;

use common::*;
use std::fs;
use std::os::unix::fs::MetadataExt;
use std::path::Path;
use std::process::Command;

const MIB: usize = 1 << 20;

/// Bytes under the store's chunk and chunk-list directories.
fn chunk_bytes(st: &Path) -> u64 {
    ["chunks", "chunklists"]
        .iter()
        .flat_map(|d| files_under(&st.join(d)))
        .map(|f| fs::metadata(f).unwrap().len())
        .sum()
}

fn chunk_files(st: &Path) -> usize {
    files_under(&st.join("chunks")).len()
}

fn cat_gen(st: &Path, gen: &str, path: &str) -> Vec<u8> {
    let out = strata(st, &["cat", "--set", "s", "--gen", gen, path]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    out.stdout
}

#[test]
fn an_edit_inside_a_large_file_stores_only_the_chunks_around_it() {
    let sc = Scratch::new();
    let mut data = noise(1, 24 * MIB);
    write(&sc.src, "big.bin", &data);
    sc.commit("s");
    let first = chunk_bytes(&sc.st);
    assert!(
        first >= 24 * MIB as u64,
        "random data is stored raw: {first}"
    );
    // Overwrite 64 KiB and insert 4 KiB in the middle.
    data[3 * MIB..3 * MIB + (64 << 10)].copy_from_slice(&noise(2, 64 << 10));
    data.splice(12 * MIB..12 * MIB, noise(3, 4096));
    write(&sc.src, "big.bin", &data);
    sc.commit("s");
    let growth = chunk_bytes(&sc.st) - first;
    // Each edit rewrites the chunk it falls in and perhaps a neighbour
    // (chunks average 1 MiB, at most 4 MiB).
    assert!(growth <= 16 * MIB as u64, "grew {growth} bytes");
    assert_eq!(cat_gen(&sc.st, "2", "big.bin"), data);
    // The same content under another name and set is not stored again.
    write(&sc.src, "copy.bin", &data);
    let before = chunk_files(&sc.st);
    commit_gen(&sc.store, "other", &sc.src);
    assert_eq!(chunk_files(&sc.st), before);
    ok(&strata(&sc.st, &["verify", "--all"]));
}

#[test]
fn compressible_chunks_are_stored_compressed() {
    let sc = Scratch::new();
    let text: Vec<u8> = (0..8 * MIB)
        .map(|i| b"strata chunk text\n"[i % 18])
        .collect();
    write(&sc.src, "log.txt", &text);
    sc.commit("s");
    assert!(chunk_bytes(&sc.st) < MIB as u64, "{}", chunk_bytes(&sc.st));
    assert_eq!(cat_gen(&sc.st, "1", "log.txt"), text);
}

/// A 256 MiB file with 12 KiB of data in three places.
fn sparse_file(root: &Path) -> Vec<(u64, Vec<u8>)> {
    let path = root.join("sparse.img");
    fs::create_dir_all(root).unwrap();
    let f = fs::File::create(&path).unwrap();
    f.set_len(256 << 20).unwrap();
    let parts = vec![
        (0, noise(7, 4096)),
        (128 << 20, noise(8, 4096)),
        ((256 << 20) - 4096, noise(9, 4096)),
    ];
    for (at, bytes) in &parts {
        std::os::unix::fs::FileExt::write_all_at(&f, bytes, *at).unwrap();
    }
    parts
}

fn seek(path: &Path, offset: i64, whence: i32) -> std::io::Result<i64> {
    use std::os::fd::AsRawFd;
    let f = fs::File::open(path)?;
    // SAFETY: lseek on a descriptor held for the call.
    let r = unsafe { libc::lseek(f.as_raw_fd(), offset, whence) };
    if r < 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok(r)
}

#[test]
fn holes_are_neither_read_nor_stored_and_come_back_as_holes() {
    let sc = Scratch::new();
    let parts = sparse_file(&sc.src);
    let src = sc.src.join("sparse.img");
    let summary = commit_dir(&sc.store, "s", &sc.src);
    assert!(summary.new_bytes < MIB as u64, "{}", summary.new_bytes);
    assert!(chunk_bytes(&sc.st) < MIB as u64);
    let mut expected = vec![0u8; 256 << 20];
    for (at, bytes) in &parts {
        expected[*at as usize..*at as usize + bytes.len()].copy_from_slice(bytes);
    }
    assert_eq!(cat_gen(&sc.st, "1", "sparse.img"), expected);
    let _m = sc.mount();
    let served = sc.mnt.join("s/latest/sparse.img");
    let meta = fs::metadata(&served).unwrap();
    assert_eq!(meta.len(), 256 << 20);
    assert!(meta.blocks() <= 64, "blocks={}", meta.blocks());
    // First open (chunk reads), then again once assembled (passthrough).
    for round in 0..2 {
        assert_eq!(
            seek(&served, 4096, libc::SEEK_DATA).unwrap(),
            128 << 20,
            "round {round}"
        );
        assert_eq!(seek(&served, 0, libc::SEEK_HOLE).unwrap(), 4096);
        let past = seek(&served, (128 << 20) + 8192, libc::SEEK_DATA).unwrap();
        assert_eq!(past, (256 << 20) - 4096);
        assert_eq!(fs::read(&served).unwrap(), expected);
        settle();
        std::thread::sleep(std::time::Duration::from_millis(500));
    }
    let copies = files_under(&sc.st.join("assembled"));
    assert_eq!(copies.len(), 1, "assembled once: {copies:?}");
    assert!(
        fs::metadata(&copies[0]).unwrap().blocks() <= 64,
        "the copy keeps its holes"
    );
    let _ = src;
}

#[test]
fn a_large_file_reads_the_same_through_chunk_reads_and_passthrough() {
    let sc = Scratch::new();
    let data = noise(4, 9 * MIB + 12345);
    write(&sc.src, "big.bin", &data);
    sc.commit("s");
    let _m = sc.mount();
    let served = sc.mnt.join("s/latest/big.bin");
    // Ranged reads at chunk edges on the first open.
    let f = fs::File::open(&served).unwrap();
    for at in [0, MIB - 7, 4 * MIB + 1, data.len() - 100] {
        let mut buf = vec![0u8; 300];
        let n = std::os::unix::fs::FileExt::read_at(&f, &mut buf, at as u64).unwrap();
        assert_eq!(&buf[..n], &data[at..(at + 300).min(data.len())]);
    }
    drop(f);
    wait_for("the assembled copy", || {
        files_under(&sc.st.join("assembled")).len() == 1
    });
    let out = Command::new("cmp")
        .arg(&served)
        .arg(sc.src.join("big.bin"))
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stdout)
    );
}

#[test]
fn a_corrupted_chunk_is_eio_through_the_mount_and_reported_by_verify() {
    let sc = Scratch::new();
    write(&sc.src, "big.bin", &noise(5, 3 * MIB));
    write(&sc.src, "ok.txt", b"still readable\n");
    sc.commit("s");
    let chunk = files_under(&sc.st.join("chunks"))
        .into_iter()
        .max_by_key(|f| fs::metadata(f).unwrap().len())
        .unwrap();
    let mut bytes = fs::read(&chunk).unwrap();
    let mid = bytes.len() / 2;
    bytes[mid] ^= 0x40;
    fs::write(&chunk, &bytes).unwrap();
    let _m = sc.mount_with(&["--assembled-size", "0"]);
    let out = Command::new("cat")
        .arg(sc.mnt.join("s/latest/big.bin"))
        .output()
        .unwrap();
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("Input/output error"), "{err}");
    assert_eq!(
        fs::read(sc.mnt.join("s/latest/ok.txt")).unwrap(),
        b"still readable\n"
    );
    let verify = strata(&sc.st, &["verify", "--all"]);
    assert!(!verify.status.success());
    let text = String::from_utf8_lossy(&verify.stdout).to_string()
        + &String::from_utf8_lossy(&verify.stderr);
    assert!(text.contains("big.bin") && text.contains("chunk"), "{text}");
}

#[test]
fn sweeps_keep_the_chunks_of_a_pinned_generation_and_reclaim_them_after() {
    let sc = Scratch::new();
    let old = noise(6, 5 * MIB);
    write(&sc.src, "big.bin", &old);
    sc.commit("s");
    let held = strata::compose::GenView::open(&sc.store, "s", Some(1), "test").unwrap();
    write(&sc.src, "big.bin", &noise(60, 5 * MIB));
    sc.commit("s");
    let both = chunk_files(&sc.st);
    ok(&strata(
        &sc.st,
        &["retain", "--set", "s", "--keep-last", "1"],
    ));
    // Generation 2 is a delta over generation 1's base; folding it into a
    // base of its own leaves generation 1's chunks held by the pin alone.
    ok(&strata(
        &sc.st,
        &["materialize", "--set", "s", "--in-process", "--wait"],
    ));
    for _ in 0..2 {
        ok(&strata(&sc.st, &["sweep", "--grace", "0s"]));
    }
    assert_eq!(
        chunk_files(&sc.st),
        both,
        "a pinned generation keeps its chunks"
    );
    let row = held
        .lookup(b"big.bin")
        .unwrap()
        .expect("big.bin in generation 1");
    assert_eq!(strata::blob::read(&sc.store, &row).unwrap(), old);
    drop(held);
    for _ in 0..2 {
        ok(&strata(&sc.st, &["sweep", "--grace", "0s"]));
    }
    assert!(chunk_files(&sc.st) < both, "unpinned, its chunks go");
    ok(&strata(&sc.st, &["verify", "--all"]));
}

#[test]
fn a_store_written_before_chunking_still_reads_and_keeps_its_identities() {
    let sc = Scratch::new();
    let st = sc.path().join("old-store");
    copy_tree(
        &Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/store-before-chunks"),
        &st,
    );
    ok(&strata(&st, &["verify", "--all"]));
    let large = strata(&st, &["cat", "--set", "old", "large.bin"]).stdout;
    assert_eq!(large.len(), MIB);
    assert_eq!(
        blake3::hash(&large).to_hex().as_str(),
        "3468cfde000d78ca4b0facb6d25ca27bf018e9e72011dbc9a220f213b46b5090"
    );
    let small = strata(&st, &["cat", "--set", "old", "dir/small.txt"]).stdout;
    assert_eq!(small, b"small file of an old store\nmore\n");
    // The same tree committed now (the large file chunked) has the same identity.
    write(&sc.src, "large.bin", &large);
    write(&sc.src, "dir/small.txt", &small);
    std::os::unix::fs::symlink("dir/small.txt", sc.src.join("link")).unwrap();
    for (rel, mode) in [
        ("large.bin", 0o644),
        ("dir/small.txt", 0o644),
        ("dir", 0o755),
    ] {
        chmod(&sc.src, rel, mode);
    }
    chmod(&sc.src, "", 0o755);
    let log: serde_json::Value =
        serde_json::from_str(&ok(&strata(&st, &["log", "--set", "old", "--json"]))).unwrap();
    let gen2 = log
        .as_array()
        .unwrap()
        .iter()
        .find(|e| e["generation"] == 2)
        .map(|e| e["identity"].as_str().unwrap().to_string())
        .unwrap_or_else(|| panic!("{log}"));
    let old_store = strata::Store::open_local(&st).unwrap();
    let now = commit_dir(&old_store, "again", &sc.src);
    assert_eq!(now.identity.as_deref(), Some(gen2.as_str()));
    assert!(!files_under(&st.join("chunks")).is_empty());
    ok(&strata(&st, &["verify", "--all"]));
    let _m = Mount::start(&st, &sc.mnt);
    assert_eq!(
        fs::read(sc.mnt.join("old/gens/1/large.bin")).unwrap(),
        large
    );
    assert_eq!(
        fs::read(sc.mnt.join("again/latest/large.bin")).unwrap(),
        large
    );
}

#[test]
fn status_shows_space_by_category_and_the_dedup_ratio() {
    let sc = Scratch::new();
    let data = noise(8, 3 * MIB);
    write(&sc.src, "a.bin", &data);
    write(&sc.src, "copy/a.bin", &data);
    sc.commit("s");
    write(&sc.src, "note.txt", b"a second generation");
    sc.commit("s");
    ok(&strata(&sc.st, &["sweep"]));
    let status: serde_json::Value =
        serde_json::from_str(&ok(&strata(&sc.st, &["status", "--json"]))).unwrap();
    let reachable = &status["space"]["reachable"];
    let chunks = reachable["chunks"]["bytes"].as_u64().unwrap();
    assert!(
        (3 * MIB as u64..4 * MIB as u64).contains(&chunks),
        "one copy of the chunks: {status}"
    );
    assert_eq!(reachable["chunk lists"]["count"], 1, "{status}");
    let ratio = status["dedup_ratio"].as_f64().unwrap();
    // 2 generations x 2 copies of 3 MiB, stored once.
    assert!((3.5..4.1).contains(&ratio), "{status}");
    let table = ok(&strata(&sc.st, &["status"]));
    assert!(
        table.contains("chunks") && table.contains("dedup"),
        "{table}"
    );
}

#[test]
fn assembled_copies_stay_within_their_budget_least_recently_opened_first() {
    let sc = Scratch::new();
    let files: Vec<(&str, Vec<u8>)> = [("a", 3), ("b", 3), ("c", 3), ("d", 4)]
        .iter()
        .enumerate()
        .map(|(i, (name, mib))| (*name, noise(20 + i as u64, mib * MIB)))
        .collect();
    for (name, data) in &files {
        write(&sc.src, name, data);
    }
    sc.commit("s");
    // 7 MiB: two 3 MiB copies fit, a third evicts one, 4 MiB is over half.
    // Recency is counted at opens that reach the daemon: with the default
    // `--opens none` a read the kernel serves from its kept pages is not
    // one (nor does it need the copy).
    let _m = sc.mount_with(&["--assembled-size", "7M", "--opens", "each"]);
    let copy = |i: usize| {
        sc.st
            .join("assembled")
            .join(blake3::hash(&files[i].1).to_hex().as_str())
    };
    let read = |i: usize| {
        let got = fs::read(sc.mnt.join("s/latest").join(files[i].0)).unwrap();
        assert!(got == files[i].1, "{} reads back", files[i].0);
    };
    read(0);
    wait_for("a's copy", || copy(0).exists());
    read(1);
    wait_for("b's copy", || copy(1).exists());
    read(0);
    read(2);
    wait_for("c's copy", || copy(2).exists());
    assert!(copy(0).exists(), "a was opened after b");
    assert!(!copy(1).exists(), "b was the least recently opened");
    read(3);
    read(2);
    std::thread::sleep(std::time::Duration::from_millis(500));
    assert!(
        !copy(3).exists(),
        "a file over half the budget is never copied"
    );
    assert_eq!(files_under(&sc.st.join("assembled")).len(), 2);
}

/// Chunk files of the store with their modification times.
fn chunk_stamps(st: &Path) -> Vec<(std::path::PathBuf, i64, i64)> {
    let mut out: Vec<_> = files_under(&st.join("chunks"))
        .into_iter()
        .map(|f| {
            let md = fs::metadata(&f).unwrap();
            (f, md.mtime(), md.mtime_nsec())
        })
        .collect();
    out.sort();
    out
}

#[test]
fn scoped_commits_store_only_changed_chunks_and_folds_never_rewrite_chunks() {
    let sc = Scratch::new();
    let mut data = noise(30, 8 * MIB);
    write(&sc.src, "a/big.bin", &data);
    write(&sc.src, "b/other.txt", b"outside the scope\n");
    sc.commit("s");
    let src = sc.src.to_str().unwrap().to_string();
    let mut edit = |seed: u64, at: usize| {
        data[at..at + (64 << 10)].copy_from_slice(&noise(seed, 64 << 10));
        write(&sc.src, "a/big.bin", &data);
        chunk_bytes(&sc.st)
    };
    let before = edit(31, 2 * MIB);
    ok(&strata(
        &sc.st,
        &["commit", "--set", "s", "--prefix", "a", &src],
    ));
    let grew = chunk_bytes(&sc.st) - before;
    assert!(grew < 3 * MIB as u64, "--prefix stored {grew} bytes");
    let before = edit(32, 6 * MIB);
    let list = sc.path().join("paths");
    fs::write(&list, "a/big.bin\n").unwrap();
    ok(&strata(
        &sc.st,
        &[
            "commit",
            "--set",
            "s",
            "--paths-from",
            list.to_str().unwrap(),
            &src,
        ],
    ));
    let grew = chunk_bytes(&sc.st) - before;
    assert!(grew < 3 * MIB as u64, "--paths-from stored {grew} bytes");
    assert_eq!(cat_gen(&sc.st, "3", "a/big.bin"), data);
    let stamps = chunk_stamps(&sc.st);
    ok(&strata(
        &sc.st,
        &["materialize", "--set", "s", "--in-process", "--wait"],
    ));
    assert_eq!(chunk_stamps(&sc.st), stamps, "a fold writes no chunk");
    assert_eq!(cat_gen(&sc.st, "3", "a/big.bin"), data);
    ok(&strata(&sc.st, &["verify", "--all"]));
}
