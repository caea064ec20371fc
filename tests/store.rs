//! Library-level behaviour of commit and read-back on real directories.

mod common;

use common::*;
use std::fs;
use std::os::unix::fs::symlink;
use strata::compose::GenView;
use strata::format::manifest::RepKind;
use strata::index::GenIndex;

#[test]
fn round_trip_keeps_empty_dirs_symlinks_binary_names_and_modes() {
    let t = tempfile::tempdir().unwrap();
    let (src, st) = (t.path().join("src"), t.path().join("store"));
    write(&src, "a/b/c.txt", b"hello");
    write(&src, "zero", b"");
    write(&src, "big.bin", &noise(7, 5 << 20));
    write(&src, "packed-medium", &noise(8, 300 << 10));
    write(&src, "compressible", &vec![b'z'; 200_000]);
    fs::create_dir_all(src.join("empty/nested-empty")).unwrap();
    symlink("a/b/c.txt", src.join("link")).unwrap();
    symlink("../nowhere", src.join("a/dangling")).unwrap();
    fs::write(src.join(os(b"name-\xff\xfe")), b"non-utf8").unwrap();
    chmod(&src, "a/b/c.txt", 0o640);
    chmod(&src, "zero", 0o4755);
    let store = new_store(&st);
    let s = commit_dir(&store, "rt", &src);
    assert_eq!(s.generation, Some(1));
    assert_eq!(snapshot_gen(&store, "rt", None), snapshot_dir(&src));
}

#[test]
fn unchanged_tree_publishes_nothing_and_hashes_nothing() {
    let t = tempfile::tempdir().unwrap();
    let (src, st) = (t.path().join("src"), t.path().join("store"));
    for i in 0..50 {
        write(&src, &format!("d{}/f{i}", i % 5), &noise(i, 1000));
    }
    let store = new_store(&st);
    settle();
    commit_dir(&store, "s", &src);
    let again = commit_dir(&store, "s", &src);
    assert!(!again.published);
    assert_eq!(again.hashed_files, 0);
    assert_eq!(
        GenIndex::new(&store, "s")
            .latest()
            .unwrap()
            .unwrap()
            .generation,
        1
    );
}

#[test]
fn incremental_commit_hashes_only_changed_files() {
    let t = tempfile::tempdir().unwrap();
    let (src, st) = (t.path().join("src"), t.path().join("store"));
    for i in 0..200 {
        write(&src, &format!("d{}/f{i}", i % 10), &noise(i, 500));
    }
    let store = new_store(&st);
    settle();
    commit_dir(&store, "s", &src);
    write(&src, "d3/f3", b"changed");
    write(&src, "d4/new", b"new");
    fs::remove_file(src.join("d5/f5")).unwrap();
    let s = commit_dir(&store, "s", &src);
    assert_eq!(s.hashed_files, 2);
    assert_eq!((s.changes.added, s.changes.removed), (1, 1));
    assert_eq!(snapshot_gen(&store, "s", None), snapshot_dir(&src));
}

#[test]
fn delta_stays_proportional_to_the_change() {
    let t = tempfile::tempdir().unwrap();
    let (src, st) = (t.path().join("src"), t.path().join("store"));
    for d in 0..200 {
        let dir = src.join(format!("dir{d:03}"));
        fs::create_dir_all(&dir).unwrap();
        for f in 0..1000 {
            fs::write(dir.join(format!("f{f:04}")), format!("{d}/{f}")).unwrap();
        }
    }
    let store = new_store(&st);
    settle();
    commit_dir(&store, "wide", &src);
    for i in 0..10 {
        fs::write(
            src.join(format!("dir{:03}/f{:04}", i * 17, i * 31)),
            format!("changed {i}"),
        )
        .unwrap();
    }
    let s = commit_dir(&store, "wide", &src);
    assert_eq!(s.changes.changed, 10);
    let view = GenView::open(&store, "wide", None, "test").unwrap();
    let delta = view.delta.as_ref().expect("second generation is a delta");
    assert_eq!(delta.kind(), RepKind::Delta);
    assert_eq!(
        delta.manifest.counts.rows, 10,
        "only the changed rows are stored"
    );
    assert_eq!(view.base.manifest.counts.rows, 200_201);
    assert_eq!(delta.manifest.counts.files, 200_000);
}

#[test]
fn deltas_are_cumulative_over_the_base_and_track_removals() {
    let t = tempfile::tempdir().unwrap();
    let (src, st) = (t.path().join("src"), t.path().join("store"));
    write(&src, "keep", b"k");
    write(&src, "gone/deep/file", b"g");
    let store = new_store(&st);
    commit_dir(&store, "c", &src);
    write(&src, "added1", b"1");
    commit_dir(&store, "c", &src);
    fs::remove_dir_all(src.join("gone")).unwrap();
    write(&src, "added2", b"2");
    commit_dir(&store, "c", &src);
    let view = GenView::open(&store, "c", None, "test").unwrap();
    let delta = view.delta.as_ref().unwrap();
    assert_eq!(delta.manifest.base.as_ref().unwrap().generation, 1);
    assert_eq!(snapshot_gen(&store, "c", None), snapshot_dir(&src));
    assert_eq!(snapshot_gen(&store, "c", Some(1)).len(), 5);
}

#[test]
fn equal_trees_have_equal_identities() {
    let t = tempfile::tempdir().unwrap();
    let (a, b, st) = (
        t.path().join("a"),
        t.path().join("b"),
        t.path().join("store"),
    );
    for root in [&a, &b] {
        write(root, "x/y", b"same");
        write(root, "z", &noise(3, 4000));
        symlink("x/y", root.join("l")).unwrap();
    }
    let store = new_store(&st);
    let ia = commit_dir(&store, "a", &a).identity.unwrap();
    let ib = commit_dir(&store, "b", &b).identity.unwrap();
    assert_eq!(ia, ib);
    write(&a, "z", b"different");
    let changed = commit_dir(&store, "a", &a).identity.unwrap();
    assert_ne!(changed, ia);
    write(&a, "z", &noise(3, 4000));
    let back = commit_dir(&store, "a", &a).identity.unwrap();
    assert_eq!(
        back, ia,
        "a delta generation equal to the base tree has the base's identity"
    );
}

#[test]
fn prefix_commit_leaves_everything_outside_untouched() {
    let t = tempfile::tempdir().unwrap();
    let (src, st) = (t.path().join("src"), t.path().join("store"));
    write(&src, "in/a", b"a");
    write(&src, "in/b", b"b");
    write(&src, "out/c", b"c");
    let store = new_store(&st);
    commit_dir(&store, "p", &src);
    let before = snapshot_gen(&store, "p", None);
    write(&src, "out/c", b"changed outside");
    write(&src, "out/new", b"new outside");
    fs::remove_file(src.join("in/a")).unwrap();
    write(&src, "in/n", b"new inside");
    let s = commit_scoped(&store, "p", &src, &[b"in"]);
    assert_eq!((s.changes.added, s.changes.removed), (1, 1));
    let after = snapshot_gen(&store, "p", None);
    for (k, v) in &before {
        if !k.starts_with(b"in") {
            assert_eq!(
                after.get(k),
                Some(v),
                "outside path {k:?} must be inherited"
            );
        }
    }
    assert!(after.contains_key(&b"in/n"[..]) && !after.contains_key(&b"in/a"[..]));
    assert!(!after.contains_key(&b"out/new"[..]));
}

#[test]
fn paths_from_list_observes_only_listed_paths() {
    let t = tempfile::tempdir().unwrap();
    let (src, st) = (t.path().join("src"), t.path().join("store"));
    for i in 0..30 {
        write(&src, &format!("d{}/f{i}", i % 3), &noise(i, 100));
    }
    let store = new_store(&st);
    commit_dir(&store, "l", &src);
    write(&src, "d0/f0", b"listed change");
    write(&src, "d1/f1", b"unlisted change");
    fs::remove_file(src.join("d2/f2")).unwrap();
    write(&src, "new/dir/file", b"listed new");
    let s = commit_scoped(&store, "l", &src, &[b"d0/f0", b"d2/f2", b"new/dir/file"]);
    assert_eq!(
        (s.changes.added, s.changes.removed),
        (3, 1),
        "new, new/dir, new/dir/file added; d2/f2 removed"
    );
    let g = snapshot_gen(&store, "l", None);
    assert_eq!(g[&b"d0/f0"[..]].data, b"listed change");
    assert_eq!(
        g[&b"d1/f1"[..]].data,
        noise(1, 100),
        "unlisted change is not observed"
    );
    assert!(!g.contains_key(&b"d2/f2"[..]));
    assert_eq!(g[&b"new/dir/file"[..]].data, b"listed new");
}

#[test]
fn replacing_a_directory_by_a_file_removes_its_subtree() {
    let t = tempfile::tempdir().unwrap();
    let (src, st) = (t.path().join("src"), t.path().join("store"));
    write(&src, "x/deep/er/file", b"1");
    write(&src, "x.sibling", b"2");
    let store = new_store(&st);
    commit_dir(&store, "r", &src);
    fs::remove_dir_all(src.join("x")).unwrap();
    write(&src, "x", b"now a file");
    commit_dir(&store, "r", &src);
    assert_eq!(snapshot_gen(&store, "r", None), snapshot_dir(&src));
    fs::remove_file(src.join("x")).unwrap();
    write(&src, "x/again", b"dir again");
    commit_dir(&store, "r", &src);
    assert_eq!(snapshot_gen(&store, "r", None), snapshot_dir(&src));
}

#[test]
fn identical_content_is_stored_once() {
    let t = tempfile::tempdir().unwrap();
    let (src, st) = (t.path().join("src"), t.path().join("store"));
    let big = noise(11, 2 << 20);
    write(&src, "a", &big);
    write(&src, "small", b"tiny content");
    let store = new_store(&st);
    let first = commit_dir(&store, "d", &src);
    write(&src, "copy-of-a", &big);
    write(&src, "copy-of-small", b"tiny content");
    let second = commit_dir(&store, "d", &src);
    assert!(first.new_bytes >= 2 << 20);
    assert_eq!(
        second.new_bytes, 0,
        "copies of known content store no new bytes"
    );
    assert_eq!(snapshot_gen(&store, "d", None), snapshot_dir(&src));
}

#[test]
fn forced_base_reads_the_same_as_the_delta_chain() {
    let t = tempfile::tempdir().unwrap();
    let (src, st) = (t.path().join("src"), t.path().join("store"));
    write(&src, "a", b"1");
    let store = new_store(&st);
    commit_dir(&store, "b", &src);
    write(&src, "b", b"2");
    let mut o = strata::commit::CommitOptions::new("b", &src);
    o.force_base = true;
    let s = strata::commit::commit(&store, &o, Default::default()).unwrap();
    assert_eq!(s.representation.as_deref(), Some("base"));
    assert_eq!(snapshot_gen(&store, "b", None), snapshot_dir(&src));
}

#[test]
fn spill_sort_with_tiny_budget_gives_the_same_generation() {
    let t = tempfile::tempdir().unwrap();
    let (src, st) = (t.path().join("src"), t.path().join("store"));
    for i in 0..3000 {
        write(&src, &format!("d{}/f{i}", i % 37), &noise(i, 64));
    }
    let store = new_store(&st);
    let mut o = strata::commit::CommitOptions::new("s", &src);
    o.budget = strata::spill::SortBudget {
        memory_bytes: 16 << 10,
        fan_in: 3,
    };
    strata::commit::commit(&store, &o, Default::default()).unwrap();
    assert_eq!(snapshot_gen(&store, "s", None), snapshot_dir(&src));
}

#[test]
fn same_size_rewrites_in_quick_succession_are_all_committed() {
    let t = tempfile::tempdir().unwrap();
    let (src, st) = (t.path().join("src"), t.path().join("store"));
    let store = new_store(&st);
    for round in 0..20u8 {
        write(&src, "f", &[round; 16]);
        commit_dir(&store, "racy", &src);
        assert_eq!(
            snapshot_gen(&store, "racy", None)[&b"f"[..]].data,
            vec![round; 16],
            "round {round}"
        );
    }
}

#[test]
fn rehashing_an_unchanged_file_changes_nothing() {
    let t = tempfile::tempdir().unwrap();
    let (src, st) = (t.path().join("src"), t.path().join("store"));
    for i in 0..20 {
        write(&src, &format!("f{i}"), &noise(i, 700));
    }
    let store = new_store(&st);
    commit_dir(&store, "h", &src);
    // Written just before the commit: inside the racy margin, so re-hashed.
    let again = commit_dir(&store, "h", &src);
    assert_eq!(again.hashed_files, 20, "racy files are re-hashed");
    assert!(
        !again.published,
        "identical observations publish nothing: {again:?}"
    );
}

/// A writer appends to `hot` (8 MiB, so every read takes a while) in a tight
/// loop. Each commit attempt either reports the file as changing (after its
/// retries) and publishes nothing, or, when the writer happened not to run
/// during a read (a starved thread on a loaded machine), publishes a
/// consistent snapshot: the original bytes plus a run of appends,
/// digest-verified. Of up to twenty attempts at least one must see the change.
#[test]
fn a_file_that_keeps_changing_while_read_is_reported_and_nothing_is_published() {
    use std::io::Write;
    use std::sync::atomic::{AtomicBool, Ordering};
    use std::sync::Arc;
    let t = tempfile::tempdir().unwrap();
    let (src, st) = (t.path().join("src"), t.path().join("store"));
    let original = noise(1, 8 << 20);
    write(&src, "stable", b"s");
    write(&src, "hot", &original);
    let store = new_store(&st);
    let stop = Arc::new(AtomicBool::new(false));
    let (flag, hot) = (stop.clone(), src.join("hot"));
    let writer = std::thread::spawn(move || {
        let mut f = fs::OpenOptions::new().append(true).open(hot).unwrap();
        while !flag.load(Ordering::Relaxed) {
            f.write_all(b"x").unwrap();
        }
    });
    let mut reported = 0;
    for attempt in 0..20 {
        if reported > 0 {
            break;
        }
        let set = format!("hot{attempt}");
        match strata::commit::commit(
            &store,
            &strata::commit::CommitOptions::new(&set, &src),
            Default::default(),
        ) {
            Err(strata::Error::Unreadable(problems)) => {
                assert_eq!(problems.len(), 1, "{problems:?}");
                assert!(
                    problems[0].starts_with("hot: changed while being read"),
                    "{problems:?}"
                );
                assert!(
                    GenIndex::new(&store, &set).latest().unwrap().is_none(),
                    "nothing was published"
                );
                reported += 1;
            }
            Ok(_) => {
                let got = snapshot_gen(&store, &set, None)[&b"hot"[..]].data.clone();
                assert!(
                    got.starts_with(&original) && got[original.len()..].iter().all(|&b| b == b'x'),
                    "torn read"
                );
            }
            Err(e) => panic!("unexpected error: {e:?}"),
        }
    }
    stop.store(true, Ordering::Relaxed);
    writer.join().unwrap();
    assert!(
        reported > 0,
        "the changing file was never reported in twenty attempts"
    );
}

#[test]
fn committing_through_a_symlinked_root_commits_the_directory_it_names() {
    let t = tempfile::tempdir().unwrap();
    let (real, st) = (t.path().join("releases/5"), t.path().join("store"));
    write(&real, "app/bin", b"binary");
    symlink("releases/5", t.path().join("current")).unwrap();
    let store = new_store(&st);
    commit_dir(&store, "r", &t.path().join("current"));
    assert_eq!(snapshot_gen(&store, "r", None), snapshot_dir(&real));
}

#[test]
fn a_covered_path_under_a_symlinked_ancestor_is_not_followed_out_of_the_tree() {
    let t = tempfile::tempdir().unwrap();
    let (src, outside, st) = (
        t.path().join("src"),
        t.path().join("outside"),
        t.path().join("store"),
    );
    write(&src, "keep", b"k");
    write(&outside, "a", b"secret a");
    write(&outside, "b", b"secret b");
    symlink(&outside, src.join("x")).unwrap();
    let store = new_store(&st);
    commit_dir(&store, "s", &src);
    write(&src, "keep", b"changed");
    commit_scoped(&store, "s", &src, &[b"x/a", b"x/b", b"keep"]);
    let g = snapshot_gen(&store, "s", None);
    assert!(
        !g.contains_key(&b"x/a"[..]) && !g.contains_key(&b"x/b"[..]),
        "nothing read through the symlink: {:?}",
        g.keys().collect::<Vec<_>>()
    );
    assert_eq!(g[&b"x"[..]].kind, "symlink");
    assert_eq!(g[&b"keep"[..]].data, b"changed");
}

/// Ingest safety: while commits run, a directory of the tree is swapped
/// again and again for a symlink to a directory outside it holding the same
/// names. No commit may read outside the tree: every generation holds
/// either the real directory's bytes or the symlink itself.
#[test]
fn a_directory_swapped_for_a_symlink_during_commits_never_leads_outside() {
    use std::sync::atomic::{AtomicBool, Ordering};
    let t = tempfile::tempdir().unwrap();
    let (src, outside) = (t.path().join("src"), t.path().join("outside"));
    for i in 0..20 {
        write(&src, &format!("d/f{i}"), b"inside");
        write(&outside, &format!("f{i}"), b"SECRET");
    }
    write(&src, "d/sub/g", b"inside");
    write(&outside, "sub/g", b"SECRET");
    let store = new_store(&t.path().join("store"));
    let stop = AtomicBool::new(false);
    let (mut published, mut refused) = (0, 0);
    std::thread::scope(|s| {
        s.spawn(|| {
            let (d, parked) = (src.join("d"), src.join("d.parked"));
            while !stop.load(Ordering::Relaxed) {
                fs::rename(&d, &parked).unwrap();
                std::os::unix::fs::symlink(&outside, &d).unwrap();
                std::thread::yield_now();
                fs::remove_file(&d).unwrap();
                fs::rename(&parked, &d).unwrap();
            }
        });
        // Stops the swapper however this thread leaves (a failed assertion
        // included), so the scope can end.
        struct StopOnDrop<'a>(&'a AtomicBool);
        impl Drop for StopOnDrop<'_> {
            fn drop(&mut self) {
                self.0.store(true, Ordering::Relaxed);
            }
        }
        let _stop = StopOnDrop(&stop);
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(4);
        let mut round = 0usize;
        while std::time::Instant::now() < deadline {
            round += 1;
            let mut o = strata::commit::CommitOptions::new("s", &src);
            if round % 2 == 0 {
                let paths = vec![b"d/f3".to_vec(), b"d/sub/g".to_vec()];
                o.scope = strata::commit::Scope::from_paths(&paths).unwrap();
            }
            let progress = std::sync::Arc::new(strata::commit::Progress::default());
            match strata::commit::commit(&store, &o, progress) {
                Ok(_) => published += 1,
                Err(strata::Error::Unreadable(_)) => refused += 1,
                Err(e) => panic!("unexpected error: {e}"),
            }
            if published == 0 {
                continue;
            }
            for (path, entry) in &snapshot_gen(&store, "s", None) {
                let path = String::from_utf8_lossy(path);
                assert_ne!(
                    entry.data, b"SECRET",
                    "{path} was read from outside the tree"
                );
            }
        }
    });
    eprintln!("{published} commits published, {refused} refused a path that changed under them");
    assert!(published > 0, "no commit got through in {refused} attempts");
}

/// A tree whose every object a commit writes is the same in a set of its
/// own: one packed file (one frame, so one pack) and one chunked file.
fn one_of_each(src: &std::path::Path) {
    write(src, "small", b"a small file, packed alone");
    write(src, "large", &noise(5, 3 << 20));
}

/// Damage a stored object as rot would (a flipped byte in its middle) or
/// as a crash on a medium without ordered writes could (cut in half).
fn damage(path: &std::path::Path, truncate: bool) {
    let mut b = fs::read(path).unwrap();
    let half = b.len() / 2;
    match truncate {
        true => b.truncate(half),
        false => b[half] ^= 0x40,
    }
    fs::write(path, b).unwrap();
}

fn verify_clean(st: &std::path::Path) {
    let out = ok(&strata(st, &["verify", "--all"]));
    assert!(out.contains("\nok"), "{out}");
}

#[test]
fn an_identical_object_already_stored_is_adopted_untouched() {
    use std::os::unix::fs::MetadataExt;
    let t = tempfile::tempdir().unwrap();
    let (src, st) = (t.path().join("src"), t.path().join("store"));
    one_of_each(&src);
    let store = new_local_store(&st);
    commit_gen(&store, "a", &src);
    let inodes = |dir: &str| -> Vec<u64> {
        let files = files_under(&st.join(dir));
        files
            .iter()
            .map(|f| fs::metadata(f).unwrap().ino())
            .collect()
    };
    let dirs = ["packs", "segments", "chunks", "chunklists"];
    let before: Vec<Vec<u64>> = dirs.iter().map(|d| inodes(d)).collect();
    let second = commit_dir(&store, "b", &src);
    assert_eq!(second.repaired_objects, 0);
    let after: Vec<Vec<u64>> = dirs.iter().map(|d| inodes(d)).collect();
    assert_eq!(before, after, "the second set wrote no object of its own");
    assert_eq!(snapshot_gen(&store, "b", None), snapshot_dir(&src));
}

#[test]
fn a_rotted_or_truncated_object_is_replaced_by_the_next_commit_of_its_content() {
    for dir in ["packs", "segments", "chunks", "chunklists"] {
        for truncate in [false, true] {
            let t = tempfile::tempdir().unwrap();
            let (src, st) = (t.path().join("src"), t.path().join("store"));
            one_of_each(&src);
            let store = new_local_store(&st);
            commit_gen(&store, "a", &src);
            let damaged = files_under(&st.join(dir));
            assert!(!damaged.is_empty(), "{dir}");
            for f in &damaged {
                damage(f, truncate);
            }
            let fresh = strata::Store::open_local(&st).unwrap();
            let second = commit_dir(&fresh, "b", &src);
            let what = format!("{dir} truncated={truncate}");
            assert_eq!(second.repaired_objects, damaged.len() as u64, "{what}");
            verify_clean(&st);
            for set in ["a", "b"] {
                assert_eq!(
                    snapshot_gen(&fresh, set, None),
                    snapshot_dir(&src),
                    "{what}"
                );
            }
        }
    }
}
