//! Stores for tests: new ones (local or on the S3 test server), commits
//! through the library, and snapshots of real trees and of generations in
//! one comparable shape.

use super::trees::{noise, write};
use std::collections::BTreeMap;
use std::fs;
use std::os::unix::ffi::{OsStrExt, OsStringExt};
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;
use strata::commit::{commit, CommitOptions, CommitSummary, Progress, Scope};
use strata::compose::GenView;
use strata::row::Kind;
use strata::storage::{Endpoint, LocalStorage, S3Options, S3Storage};
use strata::Store;

/// What identity covers, per path: kind, mode, content or link target.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Entry {
    pub kind: &'static str,
    pub mode: u32,
    pub data: Vec<u8>,
}

pub type Snapshot = BTreeMap<Vec<u8>, Entry>;

/// A new store at `dir`: a local directory, or, when `STRATA_TEST_BACKEND=s3`,
/// a fresh prefix on the S3-compatible test server (with `dir` as its local
/// directory). The same tests run on both backends.
pub fn new_store(dir: &Path) -> Store {
    if on_s3() {
        return new_s3_store(dir);
    }
    new_local_store(dir)
}

/// A new store in the local directory `dir`, whatever the test backend.
pub fn new_local_store(dir: &Path) -> Store {
    fs::create_dir_all(dir).unwrap();
    Store::init(Arc::new(LocalStorage::new(dir))).unwrap().0
}

/// A new store on the S3-compatible test server, `dir` its local directory.
pub fn new_s3_store(dir: &Path) -> Store {
    fs::create_dir_all(dir).unwrap();
    Store::init(Arc::new(S3Storage::open(&s3_options(dir)).unwrap()))
        .unwrap()
        .0
}

/// True when the store tests run on the S3 backend.
pub fn on_s3() -> bool {
    std::env::var("STRATA_TEST_BACKEND").as_deref() == Ok("s3")
}

/// Lease ttl of test stores on S3 (short, so takeovers are quick).
pub const S3_LEASE_TTL: Duration = Duration::from_secs(1);

fn s3_endpoint() -> String {
    std::env::var("STRATA_TEST_S3_ENDPOINT").expect(
        "STRATA_TEST_S3_ENDPOINT is not set: run the suite with scripts/test.sh, \
         which starts a local S3-compatible server (scripts/s3-server.sh)",
    )
}

/// The store at `dir` on the test server: its prefix is derived from `dir`,
/// so every process given the same `dir` opens the same store.
pub fn s3_url(dir: &Path) -> String {
    let bucket = std::env::var("STRATA_TEST_S3_BUCKET").unwrap_or_else(|_| "strata-test".into());
    let id = blake3::hash(dir.as_os_str().as_bytes()).to_hex();
    format!("s3://{bucket}/t-{}", &id[..16])
}

pub fn s3_options(dir: &Path) -> S3Options {
    let (bucket, prefix) = Endpoint::parse(&s3_url(dir)).unwrap();
    S3Options {
        endpoint: Endpoint {
            bucket,
            prefix,
            url: Some(s3_endpoint()),
            region: None,
            allow_http: true,
        },
        local_dir: dir.to_path_buf(),
        cache_bytes: 1 << 30,
        lease_ttl: S3_LEASE_TTL,
    }
}

/// CLI flags for the store at `dir` on the test server, with `local` as this
/// process's local directory (one per simulated host).
pub fn s3_flags(dir: &Path, local: &Path) -> Vec<String> {
    vec![
        "--store".into(),
        s3_url(dir),
        "--s3-endpoint".into(),
        s3_endpoint(),
        "--allow-http".into(),
        "--cache-dir".into(),
        local.display().to_string(),
        "--lease-ttl".into(),
        format!("{}ms", S3_LEASE_TTL.as_millis()),
    ]
}

/// Commit `dir` to `set`; what the commit did (it may add no generation).
pub fn commit_dir(store: &Store, set: &str, dir: &Path) -> CommitSummary {
    commit(
        store,
        &CommitOptions::new(set, dir),
        Arc::new(Progress::default()),
    )
    .unwrap()
}

/// Commit `dir` to `set`, which must add a generation; its number.
pub fn commit_gen(store: &Store, set: &str, dir: &Path) -> u64 {
    commit_dir(store, set, dir).generation.unwrap()
}

/// Commit `dir` to `set` as a full base (so the data of replaced files dies
/// with the generations that held it); the new generation's number.
pub fn commit_base(store: &Store, set: &str, dir: &Path) -> u64 {
    let mut opts = CommitOptions::new(set, dir);
    opts.force_base = true;
    commit(store, &opts, Default::default())
        .unwrap()
        .generation
        .unwrap()
}

pub fn commit_scoped(store: &Store, set: &str, dir: &Path, paths: &[&[u8]]) -> CommitSummary {
    let mut o = CommitOptions::new(set, dir);
    o.scope = Scope::from_paths(&paths.iter().map(|p| p.to_vec()).collect::<Vec<_>>()).unwrap();
    commit(store, &o, Arc::new(Progress::default())).unwrap()
}

fn rel(root: &Path, p: &Path) -> Vec<u8> {
    p.strip_prefix(root)
        .unwrap()
        .as_os_str()
        .as_bytes()
        .to_vec()
}

/// Snapshot a real directory tree (root included as `""`).
pub fn snapshot_dir(root: &Path) -> Snapshot {
    let mut out = Snapshot::new();
    let mut stack = vec![root.to_path_buf()];
    while let Some(p) = stack.pop() {
        let md = fs::symlink_metadata(&p).unwrap();
        let mode = md.mode() & 0o7777;
        let key = rel(root, &p);
        let entry = if md.is_dir() {
            for e in fs::read_dir(&p).unwrap() {
                stack.push(e.unwrap().path());
            }
            Entry {
                kind: "dir",
                mode,
                data: Vec::new(),
            }
        } else if md.file_type().is_symlink() {
            Entry {
                kind: "symlink",
                mode,
                data: fs::read_link(&p).unwrap().into_os_string().into_vec(),
            }
        } else {
            Entry {
                kind: "file",
                mode,
                data: fs::read(&p).unwrap(),
            }
        };
        out.insert(key, entry);
    }
    out
}

/// Snapshot a committed generation through the read path (content verified).
pub fn snapshot_gen(store: &Store, set: &str, gen: Option<u64>) -> Snapshot {
    let view = GenView::open(store, set, gen, "test").unwrap();
    let mut out = Snapshot::new();
    for row in view.rows().unwrap() {
        let row = row.unwrap();
        let data = match row.kind {
            Kind::File => strata::blob::read(store, &row).unwrap(),
            Kind::Symlink => row.target.clone().unwrap(),
            _ => Vec::new(),
        };
        out.insert(
            row.path(),
            Entry {
                kind: row.kind.label(),
                mode: row.mode,
                data,
            },
        );
    }
    out
}

/// A store whose generation 2 is a delta that overwrote 80 of the 100 small
/// files of generation 1, so generation 1's packs are 20% live in it.
/// Returns (source, store path, store, names of generation 1's packs).
pub fn mostly_dead_packs(t: &Path) -> (PathBuf, PathBuf, Store, Vec<String>) {
    let (src, st) = (t.join("src"), t.join("store"));
    for i in 0..100 {
        write(&src, &format!("f{i:03}"), &noise(i, 2000));
    }
    let store = new_store(&st);
    commit_dir(&store, "s", &src);
    let old_packs = GenView::open(&store, "s", Some(1), "t")
        .unwrap()
        .base
        .manifest
        .packs
        .iter()
        .map(|p| p.name.clone())
        .collect();
    for i in 0..80 {
        write(&src, &format!("f{i:03}"), &noise(i + 500, 2000));
    }
    commit_dir(&store, "s", &src);
    (src, st, store, old_packs)
}

/// A sealed journal of `rows` at `path` (generation 2 of set `s` over 1);
/// returns its bytes.
pub fn sealed_journal(path: &Path, rows: &[strata::row::Row]) -> Vec<u8> {
    use strata::format::journal::{JournalHeader, JournalWriter};
    let header = JournalHeader {
        set: "s".into(),
        generation: 2,
        parent: Some(1),
        scope: vec![String::new()],
        scope_count: 1,
        owner: "o".into(),
        created_ns: 1,
    };
    let mut w = JournalWriter::create(path, &header).unwrap();
    for r in rows {
        w.append(r).unwrap();
    }
    w.seal().unwrap();
    fs::read(path).unwrap()
}

/// The manifest that generation `gen` of `set` reads through, in the local
/// store at `st`, with its name.
pub fn read_manifest(
    st: &Path,
    set: &str,
    gen: u64,
) -> (String, strata::format::manifest::Manifest) {
    let record = newest_record(st, set, gen);
    let v: serde_json::Value = serde_json::from_slice(&fs::read(&record).unwrap()).unwrap();
    let reps = v["representations"].as_array().unwrap();
    let rep = reps
        .iter()
        .filter(|r| r["state"] == "COMMITTED")
        .max_by_key(|r| r["kind"] == "base")
        .unwrap();
    let name = rep["manifest"].as_str().unwrap().to_string();
    let bytes = fs::read(st.join(strata::store::keys::manifest(&name))).unwrap();
    let m = strata::format::manifest::Manifest::decode(&name, &bytes).unwrap();
    (name, m)
}

fn newest_record(st: &Path, set: &str, gen: u64) -> PathBuf {
    (1..)
        .map(|v| st.join(strata::store::keys::index_record(set, gen, v)))
        .take_while(|p| p.exists())
        .last()
        .unwrap()
}

/// Rewrite what generation `gen` of `set` (local store `st`) reads through:
/// `edit` its manifest, store the result under its new digest and point
/// every index record of the generation at it (records are not named by
/// their digest). Returns the new manifest name. For tests that plant a
/// wrong binding behind a valid digest.
pub fn rewrite_manifest(
    st: &Path,
    set: &str,
    gen: u64,
    edit: impl FnOnce(&mut strata::format::manifest::Manifest),
) -> String {
    let (old, mut m) = read_manifest(st, set, gen);
    edit(&mut m);
    let name = store_manifest_file(st, &m);
    for v in (1..).take_while(|&v| {
        st.join(strata::store::keys::index_record(set, gen, v))
            .exists()
    }) {
        let path = st.join(strata::store::keys::index_record(set, gen, v));
        let text = fs::read_to_string(&path).unwrap();
        fs::write(&path, text.replace(&old, &name)).unwrap();
    }
    name
}

/// Store `m` in the local store `st` under its digest; its name.
pub fn store_manifest_file(st: &Path, m: &strata::format::manifest::Manifest) -> String {
    let (bytes, name) = m.encode().unwrap();
    fs::write(st.join(strata::store::keys::manifest(&name)), bytes).unwrap();
    name
}
