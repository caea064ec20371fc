//! What goes in comes out: a tree with hard links, extended attributes, a
//! POSIX ACL, FIFOs, a socket, device nodes, set-id and sticky modes, other
//! owners, a sparse file, non-UTF-8 names and nanosecond mtimes is committed,
//! then restored (compared with `rsync -aHAXn` and a stat of every entry),
//! served by the mount (`getfattr`, `stat`, `test -p/-c/-b`) and exported
//! (`tar -x` of the stream, compared the same way).

mod common;

use common::*;
use std::collections::BTreeMap;
use std::ffi::OsStr;
use std::fs;
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::{symlink, MetadataExt, PermissionsExt};
use std::os::unix::process::ExitStatusExt;
use std::path::Path;
use std::process::Command;

fn run(cmd: &str, args: &[&OsStr]) {
    let o = Command::new(cmd).args(args).output().unwrap();
    assert!(
        o.status.success(),
        "{cmd} {args:?}: {}",
        String::from_utf8_lossy(&o.stderr)
    );
}

fn os(s: &str) -> &OsStr {
    OsStr::new(s)
}

/// Set `path`'s mtime (not following a symlink) to `ns` nanoseconds.
fn set_mtime(path: &Path, ns: i64) {
    let secs = ns / 1_000_000_000;
    let stamp = format!("@{secs}.{:09}", ns % 1_000_000_000);
    run("touch", &[os("-h"), os("-d"), os(&stamp), path.as_os_str()]);
}

/// The tree every test here commits.
fn rich_tree(src: &Path) {
    fs::create_dir_all(src.join("links/deeper")).unwrap();
    fs::write(src.join("links/first"), b"linked content\n").unwrap();
    fs::hard_link(src.join("links/first"), src.join("links/second")).unwrap();
    fs::hard_link(src.join("links/first"), src.join("links/deeper/third")).unwrap();
    fs::write(src.join("tagged"), b"with attributes\n").unwrap();
    let tagged = src.join("tagged");
    run(
        "setfattr",
        &[
            os("-n"),
            os("user.color"),
            os("-v"),
            os("blue"),
            tagged.as_os_str(),
        ],
    );
    run(
        "setfattr",
        &[os("-n"), os("user.empty"), tagged.as_os_str()],
    );
    run(
        "setfattr",
        &[
            os("-n"),
            os("user.note"),
            os("-v"),
            os("on a dir"),
            src.join("links").as_os_str(),
        ],
    );
    fs::create_dir(src.join("shared")).unwrap();
    run(
        "setfacl",
        &[
            os("-m"),
            os("u:1234:rwx,g:5678:r-x"),
            src.join("shared").as_os_str(),
        ],
    );
    run(
        "setfacl",
        &[
            os("-d"),
            os("-m"),
            os("u:1234:rw-"),
            src.join("shared").as_os_str(),
        ],
    );
    run("mkfifo", &[src.join("pipe").as_os_str()]);
    run(
        "mknod",
        &[src.join("null-like").as_os_str(), os("c"), os("1"), os("3")],
    );
    run(
        "mknod",
        &[
            src.join("loop-like").as_os_str(),
            os("b"),
            os("7"),
            os("200"),
        ],
    );
    let sock = std::os::unix::net::UnixListener::bind(src.join("sock")).unwrap();
    drop(sock);
    fs::write(src.join("setuid"), b"#!/bin/sh\n").unwrap();
    fs::set_permissions(src.join("setuid"), fs::Permissions::from_mode(0o4755)).unwrap();
    fs::create_dir(src.join("sticky")).unwrap();
    fs::set_permissions(src.join("sticky"), fs::Permissions::from_mode(0o1777)).unwrap();
    fs::write(src.join("sticky/owned"), b"someone else's\n").unwrap();
    std::os::unix::fs::lchown(src.join("sticky/owned"), Some(1234), Some(5678)).unwrap();
    symlink("owned", src.join("sticky/link")).unwrap();
    std::os::unix::fs::lchown(src.join("sticky/link"), Some(4321), Some(8765)).unwrap();
    let sparse = fs::File::create(src.join("sparse")).unwrap();
    sparse.set_len(24 << 20).unwrap();
    use std::os::unix::fs::FileExt;
    sparse.write_all_at(&[7u8; 300_000], 9 << 20).unwrap();
    drop(sparse);
    let odd = src.join(OsStr::from_bytes(b"caf\xe9-\xff"));
    fs::write(&odd, b"latin-1 name\n").unwrap();
    // Nanosecond mtimes, directories last (writing into one moves its own).
    for (i, p) in [
        "tagged",
        "links/first",
        "setuid",
        "sticky/link",
        "pipe",
        "sparse",
    ]
    .iter()
    .enumerate()
    {
        set_mtime(
            &src.join(p),
            1_000_000_000_123_456_789 + i as i64 * 1_000_000_007,
        );
    }
    for p in ["links/deeper", "links", "shared", "sticky", ""] {
        set_mtime(&src.join(p), 1_200_000_000_987_654_321);
    }
}

/// Everything `stat` and the attribute calls say about each entry below
/// `root` (inode numbers as link groups: the first path of each inode).
fn describe(root: &Path) -> BTreeMap<Vec<u8>, String> {
    let mut out = BTreeMap::new();
    let mut first_of = BTreeMap::new();
    let mut stack = vec![root.to_path_buf()];
    while let Some(p) = stack.pop() {
        let md = fs::symlink_metadata(&p).unwrap();
        let rel = p
            .strip_prefix(root)
            .unwrap()
            .as_os_str()
            .as_bytes()
            .to_vec();
        let group = first_of
            .entry((md.dev(), md.ino()))
            .or_insert(rel.clone())
            .clone();
        let linked = if md.is_dir() { Vec::new() } else { group };
        let target = fs::read_link(&p).ok();
        let xattrs = if md.file_type().is_symlink() {
            Vec::new()
        } else {
            let mut x = strata::xattr::read(&p).unwrap();
            x.sort();
            x
        };
        let content = if md.is_file() {
            fs::read(&p).unwrap()
        } else {
            Vec::new()
        };
        out.insert(
            rel,
            format!(
                "mode={:o} uid={} gid={} size={} mtime={}.{:09} nlink={} rdev={} \
                 linked={:?} target={target:?} xattrs={xattrs:?} content={}",
                md.mode(),
                md.uid(),
                md.gid(),
                if md.is_dir() { 0 } else { md.size() },
                md.mtime(),
                md.mtime_nsec(),
                md.nlink(),
                md.rdev(),
                String::from_utf8_lossy(&linked),
                blake3::hash(&content).to_hex(),
            ),
        );
        if md.is_dir() {
            for e in fs::read_dir(&p).unwrap() {
                stack.push(e.unwrap().path());
            }
        }
    }
    out
}

fn assert_same_trees(src: &Path, dest: &Path) {
    let (a, b) = (describe(src), describe(dest));
    for (path, want) in &a {
        assert_eq!(
            b.get(path),
            Some(want),
            "{} differs",
            String::from_utf8_lossy(path)
        );
    }
    assert_eq!(a.len(), b.len(), "entry counts differ");
}

fn rsync_finds_nothing(src: &Path, dest: &Path) {
    let o = Command::new("rsync")
        .args(["-aHAXn", "--delete", "--itemize-changes"])
        .arg(format!("{}/", src.display()))
        .arg(format!("{}/", dest.display()))
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    assert_eq!(
        String::from_utf8_lossy(&o.stdout),
        "",
        "rsync found differences"
    );
}

fn json(out: &str) -> serde_json::Value {
    serde_json::from_str(out).unwrap()
}

/// A scratch store with `rich_tree` committed as set `t` by the CLI.
fn committed_rich_tree() -> Scratch {
    let s = Scratch::new();
    rich_tree(&s.src);
    ok(&strata(
        &s.st,
        &["commit", "--set", "t", s.src.to_str().unwrap()],
    ));
    s
}

#[test]
fn a_restore_reproduces_every_attribute_of_the_committed_tree() {
    let s = committed_rich_tree();
    let dest = s.path().join("restored");
    let out = ok(&strata(
        &s.st,
        &["restore", "--set", "t", "--json", dest.to_str().unwrap()],
    ));
    let summary = json(&out);
    assert_eq!(summary["hard_links"], 2, "{out}");
    assert_eq!(summary["special"], 4, "{out}");
    rsync_finds_nothing(&s.src, &dest);
    assert_same_trees(&s.src, &dest);
    let sparse = fs::metadata(dest.join("sparse")).unwrap();
    assert!(
        sparse.blocks() * 512 < 4 << 20,
        "holes came back as data: {} blocks",
        sparse.blocks()
    );
    assert!(!dest.join(strata::restore::MARKER).exists());
}

#[test]
fn a_restore_of_paths_writes_only_them_and_their_ancestors() {
    let s = committed_rich_tree();
    let dest = s.path().join("part");
    let d = dest.to_str().unwrap();
    ok(&strata(
        &s.st,
        &["restore", "--set", "t", "--path", "links/deeper", d],
    ));
    let mut names: Vec<String> = walk_names(&dest);
    names.sort();
    assert_eq!(names, ["links", "links/deeper", "links/deeper/third"]);
    let o = strata(&s.st, &["restore", "--set", "t", d]);
    assert!(!o.status.success());
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(err.contains("destination is not empty"), "{err}");
    ok(&strata(&s.st, &["restore", "--set", "t", "--overwrite", d]));
    rsync_finds_nothing(&s.src, &dest);
}

fn walk_names(root: &Path) -> Vec<String> {
    describe(root)
        .into_keys()
        .filter(|k| !k.is_empty())
        .map(|k| String::from_utf8(k).unwrap())
        .collect()
}

#[test]
fn a_restore_killed_midway_resumes_writing_only_the_missing_files() {
    let s = Scratch::new();
    for i in 0..300 {
        write(
            &s.src,
            &format!("d{}/f{i:03}", i % 7),
            format!("file {i}\n").as_bytes(),
        );
    }
    ok(&strata(
        &s.st,
        &["commit", "--set", "t", s.src.to_str().unwrap()],
    ));
    let dest = s.path().join("restored");
    let d = dest.to_str().unwrap();
    // The restore SIGKILLs itself once half the files are written.
    let o = strata_failing(
        &s.st,
        &["restore", "--set", "t", "--jobs", "1", d],
        "restore-halfway=kill",
    );
    assert_eq!(o.status.signal(), Some(libc::SIGKILL));
    assert!(dest.join(strata::restore::MARKER).exists());
    let out = ok(&strata(&s.st, &["restore", "--set", "t", "--json", d]));
    let summary = json(&out);
    assert_eq!(summary["resumed"], true, "{out}");
    assert_eq!(summary["files_skipped"], 150, "{out}");
    assert_eq!(summary["files_written"], 150, "{out}");
    rsync_finds_nothing(&s.src, &dest);
    let temps = walk_names(&dest)
        .into_iter()
        .filter(|n| n.contains(strata::restore::TEMP_PREFIX))
        .count();
    assert_eq!(temps, 0);
}

#[test]
fn the_mount_serves_link_groups_attributes_and_special_files() {
    let s = committed_rich_tree();
    let _m = s.mount_with(&["--preserve-owner"]);
    let root = s.mnt.join("t/latest");
    let stat = |p: &str| fs::symlink_metadata(root.join(p)).unwrap();
    let (a, b, c) = (
        stat("links/first"),
        stat("links/second"),
        stat("links/deeper/third"),
    );
    assert_eq!((a.ino(), a.nlink()), (b.ino(), 3));
    assert_eq!(a.ino(), c.ino());
    assert_ne!(a.ino(), stat("tagged").ino());
    for (name, test) in [
        ("pipe", "-p"),
        ("null-like", "-c"),
        ("loop-like", "-b"),
        ("sock", "-S"),
    ] {
        let st = Command::new("test")
            .arg(test)
            .arg(root.join(name))
            .status()
            .unwrap();
        assert!(st.success(), "test {test} {name}");
    }
    assert_eq!(
        stat("null-like").rdev(),
        fs::symlink_metadata(s.src.join("null-like"))
            .unwrap()
            .rdev()
    );
    assert_eq!(
        stat("loop-like").rdev(),
        fs::symlink_metadata(s.src.join("loop-like"))
            .unwrap()
            .rdev()
    );
    assert_eq!(stat("setuid").mode() & 0o7777, 0o4755);
    assert_eq!(stat("sticky").mode() & 0o7777, 0o1777);
    assert_eq!(
        (stat("sticky/owned").uid(), stat("sticky/owned").gid()),
        (1234, 5678)
    );
    let getfattr = |dir: &Path, p: &str| {
        let o = Command::new("getfattr")
            .args(["-d", "-m", "-", "--absolute-names"])
            .arg(dir.join(p))
            .output()
            .unwrap();
        assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
        String::from_utf8_lossy(&o.stdout).replace(dir.to_str().unwrap(), "")
    };
    for p in ["tagged", "links", "shared"] {
        assert_eq!(getfattr(&root, p), getfattr(&s.src, p), "{p}");
    }
    let getfacl = |dir: &Path| {
        let o = Command::new("getfacl")
            .arg("-p")
            .arg(dir.join("shared"))
            .output()
            .unwrap();
        String::from_utf8_lossy(&o.stdout)
            .lines()
            .skip(1)
            .collect::<Vec<_>>()
            .join("\n")
    };
    assert_eq!(getfacl(&root), getfacl(&s.src));
    let o = Command::new("getfattr")
        .args(["-n", "user.missing"])
        .arg(root.join("tagged"))
        .output()
        .unwrap();
    assert!(String::from_utf8_lossy(&o.stderr).contains("No such attribute"));
    // A missing SELinux label says labels are not supported, so `ls -l`
    // stops asking for one per file; its listing still marks ACLs.
    let o = Command::new("getfattr")
        .args(["-n", "security.selinux"])
        .arg(root.join("tagged"))
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(err.contains("Operation not supported"), "{err}");
    let listed = Command::new("ls")
        .arg("-l")
        .arg(root.join(""))
        .output()
        .unwrap();
    let native = Command::new("ls").arg("-l").arg(&s.src).output().unwrap();
    let marks = |o: &std::process::Output| {
        String::from_utf8_lossy(&o.stdout)
            .lines()
            .filter_map(|l| {
                Some((
                    l.split_whitespace().next_back()?.to_string(),
                    l.get(..11)?.to_string(),
                ))
            })
            .collect::<Vec<_>>()
    };
    assert_eq!(
        marks(&listed),
        marks(&native),
        "mode strings with ACL marks"
    );
}

/// `--no-acl`, as ext4's `noacl`: ACLs are neither listed nor served (asking
/// is ENOTSUP, so `ls -l` stops asking), other attributes are.
#[test]
fn without_acls_the_mount_serves_the_other_attributes() {
    let s = committed_rich_tree();
    let _m = s.mount_with(&["--preserve-owner", "--no-acl"]);
    let root = s.mnt.join("t/latest");
    let getfattr = |args: &[&str], p: &Path| {
        let o = Command::new("getfattr").args(args).arg(p).output().unwrap();
        let out = String::from_utf8_lossy(&o.stdout).replace(p.to_str().unwrap(), "");
        (out, String::from_utf8_lossy(&o.stderr).into_owned())
    };
    let all = ["-d", "-m", "-", "--absolute-names"];
    let (native, _) = getfattr(&all, &s.src.join("shared"));
    let (served, _) = getfattr(&all, &root.join("shared"));
    assert!(native.contains("system.posix_acl_access"), "{native}");
    assert!(!served.contains("posix_acl"), "{served}");
    for p in ["tagged", "links"] {
        assert_eq!(
            getfattr(&all, &root.join(p)).0,
            getfattr(&all, &s.src.join(p)).0,
            "{p}"
        );
    }
    let (_, err) = getfattr(&["-n", "system.posix_acl_access"], &root.join("shared"));
    assert!(err.contains("Operation not supported"), "{err}");
    let mode = |dir: &Path| {
        let o = Command::new("ls")
            .arg("-ld")
            .arg(dir.join("shared"))
            .output();
        String::from_utf8_lossy(&o.unwrap().stdout)[..11].to_string()
    };
    assert_eq!(mode(&s.src).pop(), Some('+'));
    assert_eq!(mode(&root), mode(&s.src).replace('+', " "));
}

#[test]
fn attributes_and_devices_enter_the_identity_links_do_not() {
    let s = Scratch::new();
    write(&s.src, "a", b"same bytes\n");
    write(&s.src, "b", b"same bytes\n");
    let identity = |s: &Scratch| {
        let out = ok(&strata(
            &s.st,
            &["commit", "--set", "t", "--json", s.src.to_str().unwrap()],
        ));
        json(&out)["identity"].as_str().map(str::to_string)
    };
    let plain = identity(&s);
    run(
        "setfattr",
        &[
            os("-n"),
            os("user.x"),
            os("-v"),
            os("1"),
            s.src.join("a").as_os_str(),
        ],
    );
    let tagged = identity(&s);
    assert_ne!(plain, tagged, "an attribute changes the identity");
    fs::remove_file(s.src.join("b")).unwrap();
    fs::hard_link(s.src.join("a"), s.src.join("b")).unwrap();
    let linked = identity(&s);
    let other = Scratch::new();
    write(&other.src, "a", b"same bytes\n");
    write(&other.src, "b", b"same bytes\n");
    for p in ["a", "b"] {
        run(
            "setfattr",
            &[
                os("-n"),
                os("user.x"),
                os("-v"),
                os("1"),
                other.src.join(p).as_os_str(),
            ],
        );
    }
    assert_eq!(
        identity(&other),
        linked,
        "two files or one inode under two names: the same tree"
    );
}

#[test]
fn tar_extracts_the_export_as_the_committed_tree_but_its_socket() {
    let s = committed_rich_tree();
    let dest = s.path().join("extracted");
    fs::create_dir(&dest).unwrap();
    let mut export = Command::new(bin())
        .args(["--store", s.st.to_str().unwrap(), "export", "--set", "t"])
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let tar = Command::new("tar")
        .args([
            "-x",
            "-p",
            "--numeric-owner",
            "--xattrs",
            "--xattrs-include=*",
            "-f",
            "-",
            "-C",
        ])
        .arg(&dest)
        .stdin(export.stdout.take().unwrap())
        .output()
        .unwrap();
    assert!(
        tar.status.success(),
        "{}",
        String::from_utf8_lossy(&tar.stderr)
    );
    let mut err = String::new();
    std::io::Read::read_to_string(&mut export.stderr.take().unwrap(), &mut err).unwrap();
    assert!(export.wait().unwrap().success(), "{err}");
    assert!(err.contains("sock: a socket has no tar form"), "{err}");
    fs::remove_file(s.src.join("sock")).unwrap();
    set_mtime(&s.src, 1_200_000_000_987_654_321);
    rsync_finds_nothing(&s.src, &dest);
    assert_same_trees(&s.src, &dest);
    let sparse = fs::metadata(dest.join("sparse")).unwrap();
    assert!(sparse.blocks() * 512 < 4 << 20, "holes came back as data");
}

#[test]
fn a_restore_out_of_space_names_the_file_and_leaves_no_partial_file() {
    let s = Scratch::new();
    write(&s.src, "small", b"fits\n");
    write(&s.src, "large", &noise(5, 6 << 20));
    ok(&strata(
        &s.st,
        &["commit", "--set", "t", s.src.to_str().unwrap()],
    ));
    let disk = s.path().join("disk");
    fs::create_dir(&disk).unwrap();
    let mounted = Command::new("mount")
        .args(["-t", "tmpfs", "-o", "size=2m", "tmpfs"])
        .arg(&disk)
        .status()
        .unwrap();
    assert!(mounted.success());
    let o = strata(&s.st, &["restore", "--set", "t", disk.to_str().unwrap()]);
    let names = walk_names(&disk);
    let _ = Command::new("umount").arg("-l").arg(&disk).status();
    assert_eq!(o.status.code(), Some(5), "{o:?}");
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(err.contains("No space left on device"), "{err}");
    assert!(
        err.contains("restore stopped at path=") && err.contains("/large`"),
        "{err}"
    );
    assert!(
        names
            .iter()
            .all(|n| !n.contains(strata::restore::TEMP_PREFIX) && n != "large"),
        "{names:?}"
    );
}

/// Make generation `gen` of `set` look committed before rows carried
/// metadata: its rows without it, its identity recomputed from them, its
/// manifest without the flag (as a version 3 manifest reads).
fn strip_metadata(st: &Path, set: &str, gen: u64) {
    use strata::format::segment::{Segment, SegmentWriter};
    let (_, m) = read_manifest(st, set, gen);
    let staging = st.join("strip");
    fs::create_dir_all(&staging).unwrap();
    let mut writer = SegmentWriter::new(&staging).unwrap();
    let mut hasher = strata::identity::IdentityHasher::new();
    for seg in &m.segments {
        let key = strata::store::keys::segment(&seg.name);
        let segment = Segment::parse(&seg.name, fs::read(st.join(key)).unwrap()).unwrap();
        for g in 0..segment.group_count() {
            for mut row in segment.read_group(g).unwrap() {
                row.meta = None;
                hasher.push(&row);
                writer.push(row).unwrap();
            }
        }
    }
    let identity = hasher.finish();
    let mut refs = Vec::new();
    for f in writer.finish().unwrap() {
        let key = st.join(strata::store::keys::segment(&f.name));
        fs::create_dir_all(key.parent().unwrap()).unwrap();
        fs::copy(&f.path, &key).unwrap();
        refs.push(strata::format::manifest::SegmentRef {
            name: f.name.clone(),
            size: f.size,
            rows: f.rows,
            first: [hex::encode(&f.first.0), hex::encode(&f.first.1)],
            last: [hex::encode(&f.last.0), hex::encode(&f.last.1)],
        });
    }
    let old_identity = m.identity.clone();
    rewrite_manifest(st, set, gen, |m| {
        m.segments = refs;
        m.identity = identity.clone();
        m.metadata = false;
    });
    for v in 1.. {
        let path = st.join(strata::store::keys::index_record(set, gen, v));
        let Ok(text) = fs::read_to_string(&path) else {
            break;
        };
        fs::write(&path, text.replace(&old_identity, &identity)).unwrap();
    }
    fs::remove_dir_all(staging).unwrap();
}

#[test]
fn a_commit_over_a_generation_without_metadata_records_it_for_unchanged_entries() {
    let s = Scratch::new();
    write(&s.src, "tagged", b"attributes\n");
    run(
        "setfattr",
        &[
            os("-n"),
            os("user.k"),
            os("-v"),
            os("v"),
            s.src.join("tagged").as_os_str(),
        ],
    );
    write(&s.src, "d/first", b"linked\n");
    fs::hard_link(s.src.join("d/first"), s.src.join("d/second")).unwrap();
    run(
        "setfattr",
        &[
            os("-n"),
            os("user.dir"),
            os("-v"),
            os("1"),
            s.src.join("d").as_os_str(),
        ],
    );
    settle();
    let with = commit_dir(&s.store, "t", &s.src);
    strip_metadata(&s.st, "t", 1);
    let (_, stripped) = read_manifest(&s.st, "t", 1);
    assert_ne!(Some(&stripped.identity), with.identity.as_ref());
    // Nothing changed on disk: the walk reads only the metadata, not content.
    let caught = commit_dir(&s.store, "t", &s.src);
    assert_eq!(caught.generation, Some(2));
    assert_eq!(caught.hashed_files, 0);
    assert_eq!(caught.identity, with.identity, "the metadata is back");
    assert!(read_manifest(&s.st, "t", 2).1.metadata);
    let dest = s.path().join("restored");
    ok(&strata(
        &s.st,
        &["restore", "--set", "t", dest.to_str().unwrap()],
    ));
    rsync_finds_nothing(&s.src, &dest);
    // Caught up: the next commit of the unchanged tree publishes nothing.
    assert_eq!(commit_dir(&s.store, "t", &s.src).generation, None);
}

#[test]
fn an_exported_hard_linked_socket_is_skipped_under_every_name() {
    let s = Scratch::new();
    write(&s.src, "f", b"file\n");
    drop(std::os::unix::net::UnixListener::bind(s.src.join("sock")).unwrap());
    fs::hard_link(s.src.join("sock"), s.src.join("sock2")).unwrap();
    ok(&strata(
        &s.st,
        &["commit", "--set", "t", s.src.to_str().unwrap()],
    ));
    let tarball = s.path().join("t.tar");
    let o = Command::new(bin())
        .args(["--store", s.st.to_str().unwrap(), "export", "--set", "t"])
        .stdout(fs::File::create(&tarball).unwrap())
        .output()
        .unwrap();
    assert!(o.status.success());
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(err.contains("sock:") && err.contains("sock2:"), "{err}");
    let dest = s.path().join("x");
    fs::create_dir(&dest).unwrap();
    let tar = Command::new("tar")
        .arg("-xf")
        .arg(&tarball)
        .arg("-C")
        .arg(&dest)
        .output()
        .unwrap();
    assert!(
        tar.status.success(),
        "{}",
        String::from_utf8_lossy(&tar.stderr)
    );
    assert_eq!(walk_names(&dest), ["f"]);
}
