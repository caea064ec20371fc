//! Model test: random operation sequences on a real directory, a commit after
//! every step, and every generation read back later must equal exactly what
//! was on disk when it was committed. Failing cases shrink and are kept in
//! proptest-regressions/; `PROPTEST_CASES` raises the count.

mod common;

use common::*;
use proptest::prelude::*;
use std::fs;
use std::os::unix::fs::{symlink, PermissionsExt};
use std::path::Path;
use strata::index::GenIndex;

const PATHS: &[&[u8]] = &[
    b"a",
    b"b",
    b"a/x",
    b"a/y",
    b"b/z",
    b"a/x/deep",
    b"c\xff\xfe",
    b"a/x/q",
    b"e",
];

#[derive(Debug, Clone)]
enum Op {
    Write { path: usize, seed: u16, size: usize },
    Delete { path: usize },
    Rename { from: usize, to: usize },
    Chmod { path: usize, mode: u32 },
    ReplaceDirByFile { path: usize },
    Symlink { path: usize, target: usize },
    Mkdir { path: usize },
}

fn op() -> impl Strategy<Value = Op> {
    let p = 0..PATHS.len();
    let size = prop_oneof![8 => 0usize..3000, 1 => Just(1usize << 20), 1 => (1usize << 20)..(1usize << 20) + 5000];
    prop_oneof![
        4 => (p.clone(), any::<u16>(), size).prop_map(|(path, seed, size)| Op::Write { path, seed, size }),
        2 => p.clone().prop_map(|path| Op::Delete { path }),
        2 => (p.clone(), p.clone()).prop_map(|(from, to)| Op::Rename { from, to }),
        1 => (p.clone(), 0u32..0o777).prop_map(|(path, mode)| Op::Chmod { path, mode }),
        1 => p.clone().prop_map(|path| Op::ReplaceDirByFile { path }),
        1 => (p.clone(), p.clone()).prop_map(|(path, target)| Op::Symlink { path, target }),
        1 => p.prop_map(|path| Op::Mkdir { path }),
    ]
}

fn remove_any(p: &Path) {
    match fs::symlink_metadata(p) {
        Ok(m) if m.is_dir() => fs::remove_dir_all(p).unwrap(),
        Ok(_) => fs::remove_file(p).unwrap(),
        Err(_) => {}
    }
}

/// Create the parent directories of `rel`, replacing non-directories.
fn make_parent(root: &Path, rel: &[u8]) {
    let mut cur = root.to_path_buf();
    let parts: Vec<&[u8]> = rel.split(|&b| b == b'/').collect();
    for part in &parts[..parts.len() - 1] {
        cur = cur.join(os(part));
        if !fs::symlink_metadata(&cur)
            .map(|m| m.is_dir())
            .unwrap_or(false)
        {
            remove_any(&cur);
            fs::create_dir(&cur).unwrap();
        }
    }
}

fn apply(root: &Path, op: &Op) {
    let at = |i: usize| root.join(os(PATHS[i]));
    match *op {
        Op::Write { path, seed, size } => {
            make_parent(root, PATHS[path]);
            if at(path).is_dir() {
                fs::remove_dir_all(at(path)).unwrap();
            }
            remove_any(&at(path));
            fs::write(at(path), noise(seed as u64, size)).unwrap();
        }
        Op::Delete { path } => remove_any(&at(path)),
        Op::Rename { from, to } => {
            let (f, t) = (at(from), at(to));
            if from == to
                || fs::symlink_metadata(&f).is_err()
                || PATHS[to].starts_with(PATHS[from])
                || PATHS[from].starts_with(PATHS[to])
            {
                return;
            }
            make_parent(root, PATHS[to]);
            remove_any(&t);
            fs::rename(f, t).unwrap();
        }
        Op::Chmod { path, mode } => {
            if let Ok(m) = fs::symlink_metadata(at(path)) {
                if !m.file_type().is_symlink() {
                    let mode = if m.is_dir() { mode | 0o700 } else { mode };
                    fs::set_permissions(at(path), fs::Permissions::from_mode(mode)).unwrap();
                }
            }
        }
        Op::ReplaceDirByFile { path } => {
            if at(path).is_dir() {
                fs::remove_dir_all(at(path)).unwrap();
                fs::write(at(path), b"was a directory").unwrap();
            }
        }
        Op::Symlink { path, target } => {
            make_parent(root, PATHS[path]);
            remove_any(&at(path));
            symlink(os(PATHS[target]), at(path)).unwrap();
        }
        Op::Mkdir { path } => {
            make_parent(root, PATHS[path]);
            if !at(path).is_dir() {
                remove_any(&at(path));
                fs::create_dir(at(path)).unwrap();
            }
        }
    }
}

/// Directory `dir` of `view` lists `expected` after the child `after`, the
/// same through `visit_dir` (by reference; base-only views) and
/// `dir_entries`.
fn assert_lists(
    view: &strata::compose::GenView,
    dir: &[u8],
    after: Option<&[u8]>,
    expected: &[Vec<u8>],
    what: &str,
) {
    let mut visited = Vec::new();
    view.visit_dir(dir, after, |row, _| {
        visited.push(row.name.clone());
        false
    })
    .unwrap();
    let entries: Vec<Vec<u8>> = view
        .dir_entries(dir, after)
        .unwrap()
        .map(|e| e.unwrap().0.name)
        .collect();
    assert!(visited == expected, "visit_dir: {what}");
    assert!(entries == expected, "dir_entries: {what}");
}

/// Every directory of generation `gen` lists its children in name order,
/// from the start and from after each child, the same through
/// `visit_dir` (by reference; base-only views) and `dir_entries`.
fn check_listings(store: &strata::Store, gen: u64, expected: &Snapshot) {
    let view = strata::compose::GenView::open(store, "m", Some(gen), "test").unwrap();
    let dirs = expected
        .iter()
        .filter(|(_, e)| e.kind == "dir")
        .map(|(p, _)| p.clone());
    for dir in std::iter::once(Vec::new()).chain(dirs) {
        let prefix = if dir.is_empty() {
            Vec::new()
        } else {
            [&dir[..], b"/"].concat()
        };
        let children: Vec<Vec<u8>> = expected
            .keys()
            .filter_map(|p| p.strip_prefix(&prefix[..]))
            .filter(|rest| !rest.is_empty() && !rest.contains(&b'/'))
            .map(<[u8]>::to_vec)
            .collect();
        let after_each = std::iter::once(None).chain(children.iter().map(|c| Some(&c[..])));
        for (i, after) in after_each.enumerate() {
            let what = format!("generation {gen}, {dir:?} after {after:?}");
            assert_lists(&view, &dir, after, &children[i..], &what);
        }
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: std::env::var("PROPTEST_CASES").ok().and_then(|v| v.parse().ok()).unwrap_or(24), ..ProptestConfig::default() })]

    #[test]
    fn every_generation_reads_back_exactly_what_was_committed(ops in prop::collection::vec(op(), 1..14)) {
        let t = tempfile::tempdir().unwrap();
        let (src, st) = (t.path().join("src"), t.path().join("store"));
        fs::create_dir(&src).unwrap();
        let store = new_store(&st);
        let mut history = Vec::new();
        for op in &ops {
            apply(&src, op);
            commit_dir(&store, "m", &src);
            let latest = GenIndex::new(&store, "m").latest().unwrap().unwrap().generation;
            history.push((latest, snapshot_dir(&src)));
        }
        for (gen, expected) in &history {
            prop_assert_eq!(&snapshot_gen(&store, "m", Some(*gen)), expected, "generation {}", gen);
            check_listings(&store, *gen, expected);
        }
        let report = strata::verify::verify(&store, &["m".to_string()], strata::verify::Selection::All).unwrap();
        prop_assert!(report.problems.is_empty(), "{:?}", report.problems);
    }
}

/// Directories whose children end exactly at a row group's end, fill a
/// whole group, straddle groups and cross a segment: each lists completely,
/// from the start and from after any child next to a boundary (where the
/// end of a listing is read from the group index, not a decoded group).
#[test]
fn listings_cross_row_group_and_segment_boundaries() {
    use strata::format::segment::{GROUP_ROWS, SEGMENT_ROWS};
    let t = tempfile::tempdir().unwrap();
    let (src, st) = (t.path().join("src"), t.path().join("store"));
    // Rows in key order: the root, its 8 directories, then each
    // directory's children. d0's children end at the end of group 0, d1's
    // fill group 1, d2's straddle groups 2 and 3, d3's cross into the
    // second segment, d4 is empty, d5..d7 are small.
    let first = 1 + 8;
    let sizes = [
        GROUP_ROWS - first,
        GROUP_ROWS,
        GROUP_ROWS + 700,
        SEGMENT_ROWS - 3 * GROUP_ROWS,
        0,
        1,
        2,
        3,
    ];
    let mut children = Vec::new();
    for (d, n) in sizes.iter().enumerate() {
        let dir = src.join(format!("d{d}"));
        fs::create_dir_all(&dir).unwrap();
        let names: Vec<Vec<u8>> = (0..*n).map(|i| format!("f{i:06}").into_bytes()).collect();
        for name in &names {
            fs::File::create(dir.join(os(name))).unwrap();
        }
        children.push(names);
    }
    let store = new_store(&st);
    commit_dir(&store, "m", &src);
    let view = strata::compose::GenView::open(&store, "m", None, "test").unwrap();
    let mut row = first;
    for (d, names) in children.iter().enumerate() {
        let dir = format!("d{d}").into_bytes();
        let near_boundary = |i: usize| {
            let r = row + i;
            r % GROUP_ROWS <= 1 || r % GROUP_ROWS >= GROUP_ROWS - 2 || i + 1 == names.len()
        };
        let resume = (0..names.len()).filter(|i| near_boundary(*i));
        for (from, after) in std::iter::once((0, None)).chain(resume.map(|i| (i + 1, Some(i)))) {
            let after = after.map(|i| &names[i][..]);
            let what = format!("d{d} after {after:?}");
            assert_lists(&view, &dir, after, &names[from..], &what);
        }
        row += names.len();
    }
}
