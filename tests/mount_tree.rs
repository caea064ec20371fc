//! The mount's virtual tree (`strata::mount_tree`) without FUSE: layout and
//! resolution, synthetic listings and their stamps, ENOENT-versus-error
//! semantics, and the blob verification policy, on real local stores.

use std::fs;
use std::path::Path;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, SystemTime};
use strata::commit::{commit, CommitOptions, Progress};
use strata::error::{Error, ErrorKind};
use strata::index::GenIndex;
use strata::mount_tree::listing::items_from;
use strata::mount_tree::{
    Dir, Gens, Node, NodeKind, OpenedBlob, Tree, TreeError, Verifier, VerifyCounts, VerifyPolicy,
};
use strata::row::BlobLoc;
use strata::storage::LocalStorage;
use strata::Store;

fn write(root: &Path, rel: &str, data: &[u8]) {
    let p = root.join(rel);
    fs::create_dir_all(p.parent().unwrap()).unwrap();
    fs::write(p, data).unwrap();
}

fn commit_dir(store: &Store, set: &str, dir: &Path) {
    let options = CommitOptions::new(set, dir);
    commit(store, &options, Arc::new(Progress::default())).unwrap();
}

struct Fixture {
    dir: tempfile::TempDir,
    store: Store,
}

impl Fixture {
    fn st(&self) -> std::path::PathBuf {
        self.dir.path().join("st")
    }

    fn src(&self) -> std::path::PathBuf {
        self.dir.path().join("src")
    }

    /// A tree over a fresh `Gens` (nothing held yet).
    fn tree(&self, only: &[&str]) -> Tree {
        let gens = Arc::new(Gens::new(self.store.clone(), Duration::ZERO));
        let only = only.iter().map(|s| s.to_string()).collect();
        Tree::new(
            gens,
            only,
            SystemTime::UNIX_EPOCH + Duration::new(1_700_000_000, 0),
        )
    }
}

/// Set `s`: generation 1 (a.txt v1, d/b.txt, link), 2 (a.txt v2), 3
/// (d/c.txt added); tag `v1` -> 1; generation 2 retired. Set `t`: one
/// generation.
fn fixture() -> Fixture {
    let dir = tempfile::tempdir().unwrap();
    let st = dir.path().join("st");
    fs::create_dir_all(&st).unwrap();
    let store = Store::init(Arc::new(LocalStorage::new(&st))).unwrap().0;
    let f = Fixture { dir, store };
    let src = f.src();
    write(&src, "a.txt", b"version one");
    write(&src, "d/b.txt", b"bee");
    std::os::unix::fs::symlink("a.txt", src.join("link")).unwrap();
    commit_dir(&f.store, "s", &src);
    write(&src, "a.txt", b"version two, longer");
    commit_dir(&f.store, "s", &src);
    write(&src, "d/c.txt", b"sea");
    commit_dir(&f.store, "s", &src);
    strata::tag::tag(&f.store, "s", "v1", Some(1)).unwrap();
    let index = GenIndex::new(&f.store, "s");
    let two = index.newest(2).unwrap().unwrap();
    index.retire(&two, "test").unwrap();
    let other = f.dir.path().join("other");
    write(&other, "x", b"x");
    commit_dir(&f.store, "t", &other);
    f
}

fn names(tree: &Tree, node: &Node) -> Vec<String> {
    tree.list(node)
        .unwrap()
        .iter()
        .map(|i| String::from_utf8(i.name.clone()).unwrap())
        .collect()
}

fn child(tree: &Tree, parent: &Node, path: &str) -> Result<Node, TreeError> {
    let mut node = parent.clone();
    for name in path.split('/') {
        node = tree.child(&node, name.as_bytes())?;
    }
    Ok(node)
}

fn not_found<T>(r: Result<T, TreeError>) -> bool {
    matches!(r, Err(TreeError::NotFound))
}

#[test]
fn the_layout_resolves_sets_latest_generations_tags_and_history() {
    let f = fixture();
    let tree = f.tree(&[]);
    let root = Node::Root;
    assert_eq!(names(&tree, &root), ["s", "t"]);
    assert_eq!(names(&f.tree(&["t"]), &root), ["t"], "only the sets served");
    assert!(not_found(f.tree(&["t"]).child(&root, b"s")));
    let s = tree.child(&root, b"s").unwrap();
    assert_eq!(names(&tree, &s), ["latest", "gens", "tags", "history"]);
    assert!(not_found(tree.child(&s, b"nope")));

    let latest = tree.child(&s, b"latest").unwrap();
    assert_eq!(tree.readlink(&latest).unwrap(), b"gens/3");
    let attrs = tree.attrs(&latest).unwrap();
    assert_eq!(
        (attrs.kind, attrs.size, attrs.live),
        (NodeKind::Symlink, 6, true)
    );

    // The retired generation is gone from gens/ (nobody holds it).
    let gens = tree.child(&s, b"gens").unwrap();
    assert_eq!(names(&tree, &gens), ["1", "3"]);
    for absent in ["2", "03", "4", "x", ""] {
        assert!(not_found(tree.child(&gens, absent.as_bytes())), "{absent}");
    }
    let g3 = tree.child(&gens, b"3").unwrap();
    assert!(matches!(
        &g3,
        Node::GenRoot {
            gen: Some(_),
            generation: 3,
            ..
        }
    ));
    assert!(g3.is_generation_dir());
    assert_eq!(tree.attrs(&g3).unwrap().kind, NodeKind::Dir);
    assert!(!tree.attrs(&g3).unwrap().live, "a generation never changes");

    let a = tree.child(&g3, b"a.txt").unwrap();
    let attrs = tree.attrs(&a).unwrap();
    assert_eq!((attrs.kind, attrs.size), (NodeKind::File, 19));
    assert!(attrs.owner.is_some());
    assert!(matches!(
        tree.child(&a, b"x"),
        Err(TreeError::NotADirectory)
    ));
    assert!(matches!(tree.dir(&a), Err(TreeError::NotADirectory)));
    assert!(matches!(tree.readlink(&a), Err(TreeError::NotALink)));
    assert!(not_found(child(&tree, &g3, "d/nope")));
    let link = tree.child(&g3, b"link").unwrap();
    assert_eq!(tree.readlink(&link).unwrap(), b"a.txt");
    let one_a = child(&tree, &gens, "1/a.txt").unwrap();
    assert_eq!(tree.attrs(&one_a).unwrap().size, 11);

    let tags = tree.child(&s, b"tags").unwrap();
    assert_eq!(names(&tree, &tags), ["v1"]);
    let v1 = tree.child(&tags, b"v1").unwrap();
    assert_eq!(tree.readlink(&v1).unwrap(), b"../gens/1");
    assert!(not_found(tree.child(&tags, b"v2")));

    // history/: the directories of latest; a file's versions as links.
    let history = tree.child(&s, b"history").unwrap();
    assert_eq!(names(&tree, &history), ["a.txt", "d", "link"]);
    let d = tree.child(&history, b"d").unwrap();
    assert!(matches!(&d, Node::History { .. }));
    assert_eq!(names(&tree, &d), ["b.txt", "c.txt"]);
    let versions = tree.child(&history, b"a.txt").unwrap();
    assert!(matches!(&versions, Node::Versions { .. }));
    let listed = names(&tree, &versions);
    assert_eq!(listed, ["3", "1"], "newest first; 2 is retired");
    let v = tree.child(&versions, b"1").unwrap();
    assert_eq!(tree.readlink(&v).unwrap(), b"../../gens/1/a.txt");
    let deep = child(&tree, &history, "d/c.txt/3").unwrap();
    assert_eq!(tree.readlink(&deep).unwrap(), b"../../../gens/3/d/c.txt");
    assert!(not_found(tree.child(&versions, b"2")));
    assert!(not_found(tree.child(&history, b"nope")));
    assert!(matches!(tree.readlink(&s), Err(TreeError::NotALink)));
    assert!(matches!(tree.list(&g3), Err(TreeError::NotADirectory)));
}

#[test]
fn generation_directories_are_visited_from_a_position() {
    let f = fixture();
    let tree = f.tree(&[]);
    let gens = child(&tree, &Node::Root, "s/gens").unwrap();
    let g3 = tree.child(&gens, b"3").unwrap();
    let Dir::Gen(gen, path) = tree.dir(&g3).unwrap() else {
        panic!("a generation root lists its rows");
    };
    let mut seen = Vec::new();
    tree.visit_gen_dir(&gen, &path, None, |row, pos| {
        seen.push((String::from_utf8(row.name.clone()).unwrap(), pos));
        false
    })
    .unwrap();
    let listed: Vec<&str> = seen.iter().map(|(n, _)| n.as_str()).collect();
    assert_eq!(listed, ["a.txt", "d", "link"]);
    let mut rest = Vec::new();
    tree.visit_gen_dir(&gen, &path, Some(seen[0].1), |row, _| {
        rest.push(String::from_utf8(row.name.clone()).unwrap());
        false
    })
    .unwrap();
    assert_eq!(rest, ["d", "link"], "resumed after the position given");
    // A position of another directory is no offset of this one.
    let Dir::Gen(_, d_path) = tree.dir(&tree.child(&g3, b"d").unwrap()).unwrap() else {
        panic!("d is a directory");
    };
    let r = tree.visit_gen_dir(&gen, &d_path, Some(seen[0].1), |_, _| false);
    assert!(matches!(r, Err(TreeError::BadOffset)));

    // Synthetic listings: offsets 1 and 2 are the dots, item i ends at i + 3.
    let items = tree.list(&gens).unwrap();
    let after_first: Vec<u64> = items_from(&items, 3).map(|(o, _)| o).collect();
    assert_eq!(after_first, [4]);
}

#[test]
fn stamps_follow_listings_and_the_index() {
    let f = fixture();
    let tree = f.tree(&[]);
    let s = child(&tree, &Node::Root, "s").unwrap();
    let stamp = |path: &str| {
        let node = child(&tree, &s, path).unwrap();
        tree.attrs(&node).unwrap().mtime
    };
    let secs = |t: SystemTime| t.duration_since(SystemTime::UNIX_EPOCH).unwrap().as_secs();
    // Resolving history/ pins latest, and gens/ stamps the generations
    // held: warm up first.
    stamp("history/d");
    let before = [
        stamp("gens"),
        stamp("tags"),
        stamp("history"),
        stamp("history/d"),
    ];
    assert!(before.iter().all(|t| secs(*t) == 1_700_000_000));
    let root = tree.attrs(&Node::Root).unwrap().mtime;
    assert_eq!(
        before,
        [
            stamp("gens"),
            stamp("tags"),
            stamp("history"),
            stamp("history/d")
        ]
    );

    strata::tag::tag(&f.store, "s", "v3", Some(3)).unwrap();
    assert_ne!(stamp("tags"), before[1], "a new tag is a new listing");
    assert_eq!(stamp("gens"), before[0], "the index did not change");

    write(&f.src(), "d/e.txt", b"eee");
    commit_dir(&f.store, "s", &f.src());
    let after = [stamp("gens"), stamp("history"), stamp("history/d")];
    assert_ne!(after[0], before[0], "a commit changes gens/");
    assert_ne!(after[1], before[2], "and history/");
    assert_ne!(after[2], before[3]);
    assert_eq!(tree.attrs(&Node::Root).unwrap().mtime, root, "no new set");

    // Holding a retired generation lists it (and changes the stamp).
    let gens = tree.child(&s, b"gens").unwrap();
    let held = tree.gens().get("s", 1).unwrap();
    let index = GenIndex::new(&f.store, "s");
    let one = index.newest(1).unwrap().unwrap();
    strata::tag::untag(&f.store, "s", "v1").unwrap();
    index.retire(&one, "test").unwrap();
    let with_held = stamp("gens");
    assert_eq!(names(&tree, &gens), ["1", "3", "4"]);
    drop(held);
    assert_eq!(names(&tree, &gens), ["3", "4"]);
    assert_ne!(stamp("gens"), with_held);
}

#[test]
fn a_missing_object_is_an_error_and_only_a_missing_name_is_not_found() {
    let f = fixture();
    let tree = f.tree(&[]);
    let gens = child(&tree, &Node::Root, "t/gens").unwrap();
    // The generation is opened (pinned), then its segments go missing.
    let g1 = tree.child(&gens, b"1").unwrap();
    let segments = f.st().join("segments");
    fs::rename(&segments, f.dir.path().join("lost")).unwrap();
    let err = match tree.child(&g1, b"x") {
        Err(TreeError::Store { what, error }) => {
            assert!(what.contains("set=t gen=1"), "{what}");
            error
        }
        Err(e) => panic!("a lost segment is no missing name: {e:?}"),
        Ok(_) => panic!("read without its segments"),
    };
    assert_eq!(err.kind(), ErrorKind::Unavailable, "{err:?}");
    assert!(
        err.object().is_some(),
        "the log can name the object: {err:?}"
    );
    // Names that do not exist stay NotFound.
    assert!(not_found(tree.child(&gens, b"9")));
    let tags = child(&tree, &Node::Root, "t/tags").unwrap();
    assert!(not_found(tree.child(&tags, b"none")));
}

#[test]
fn a_lost_manifest_is_an_error_not_a_missing_generation() {
    let f = fixture();
    let tree = f.tree(&[]);
    let gens = child(&tree, &Node::Root, "t/gens").unwrap();
    fs::rename(f.st().join("manifests"), f.dir.path().join("lost")).unwrap();
    match tree.child(&gens, b"1") {
        Err(TreeError::Store { error, .. }) => {
            assert_eq!(error.kind(), ErrorKind::Unavailable, "{error:?}")
        }
        Err(e) => panic!("a lost manifest is no missing name: {e:?}"),
        Ok(_) => panic!("opened without its manifest"),
    }
}

/// A store with one standalone blob (written before chunking: new commits
/// chunk large files); its key and the file holding it.
fn standalone() -> (Fixture, [u8; 32], u64, std::path::PathBuf) {
    let dir = tempfile::tempdir().unwrap();
    let st = dir.path().join("st");
    let copied = std::process::Command::new("cp")
        .arg("-a")
        .arg(Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/store-before-chunks"))
        .arg(&st)
        .status()
        .unwrap();
    assert!(copied.success());
    let store = Store::open_local(&st).unwrap();
    let f = Fixture { dir, store };
    let view = strata::compose::GenView::open(&f.store, "old", None, "test").unwrap();
    let row = view.lookup(b"large.bin").unwrap().unwrap();
    assert_eq!(row.blob, BlobLoc::Standalone);
    let digest = row.digest.unwrap();
    let file = f.st().join(strata::store::keys::blob(&hex::encode(digest)));
    assert!(file.exists(), "{}", file.display());
    (f, digest, row.size, file)
}

fn open(v: &Verifier, store: &Store, digest: [u8; 32], size: u64) -> Result<OpenedBlob, Error> {
    v.open_standalone(store, digest, size, |e| {
        panic!("a local store has no copy to drop: {e}")
    })
}

#[test]
fn blobs_are_verified_as_the_policy_asks() {
    let (f, digest, size, file) = standalone();
    let counts = Arc::new(VerifyCounts::default());
    let first = Verifier::new(VerifyPolicy::FirstOpen, counts.clone());
    assert!(first.must_verify(&digest));
    assert!(matches!(
        open(&first, &f.store, digest, size),
        Ok(OpenedBlob::Local(_))
    ));
    assert!(!first.must_verify(&digest), "verified once");
    assert_eq!(counts.verified.load(Ordering::Relaxed), 1);

    // Damage the stored bytes (same size).
    let mut bytes = fs::read(&file).unwrap();
    bytes[12345] ^= 0xff;
    let mut perms = fs::metadata(&file).unwrap().permissions();
    #[allow(clippy::permissions_set_readonly_false)]
    perms.set_readonly(false);
    fs::set_permissions(&file, perms).unwrap();
    fs::write(&file, &bytes).unwrap();

    assert!(
        open(&first, &f.store, digest, size).is_ok(),
        "first-open does not hash it again"
    );
    let always = Verifier::new(VerifyPolicy::Always, counts.clone());
    assert!(always.must_verify(&digest));
    match open(&always, &f.store, digest, size) {
        Err(e) => assert_eq!(e.kind(), ErrorKind::Corrupt, "{e:?}"),
        Ok(_) => panic!("served a damaged blob"),
    }
    assert_eq!(counts.failures.load(Ordering::Relaxed), 1);
    let fresh = Verifier::new(VerifyPolicy::FirstOpen, counts.clone());
    assert!(
        open(&fresh, &f.store, digest, size).is_err(),
        "a new run checks it"
    );
    let off = Verifier::new(VerifyPolicy::Off, counts.clone());
    assert!(!off.must_verify(&digest));
    assert!(open(&off, &f.store, digest, size).is_ok());
    assert_eq!(counts.failures.load(Ordering::Relaxed), 2);

    // A blob that is gone is an error of kind Unavailable, not a missing name.
    fs::remove_file(&file).unwrap();
    match open(&off, &f.store, digest, size) {
        Err(e) => assert_eq!(e.kind(), ErrorKind::Unavailable, "{e:?}"),
        Ok(_) => panic!("opened a missing blob"),
    }
}
