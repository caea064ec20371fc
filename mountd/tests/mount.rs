//! Real mounts: the daemon serves generations to ordinary tools (`diff -r`,
//! `cat`, `ls`), follows commits, keeps old generations readable for open
//! files, answers EIO for corrupt content only, and stops cleanly.

#[path = "../../tests/common/mod.rs"]
mod common;

use common::*;
use std::fs;
use std::io::Read;
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::symlink;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};
use strata::Store;

fn rich_tree(root: &Path, variant: u64) {
    write(
        root,
        "docs/readme.txt",
        format!("variant {variant}\n").as_bytes(),
    );
    write(root, "zero", b"");
    write(root, "big/blob.bin", &noise(variant, 3 << 20));
    write(root, "small/packed.bin", &noise(variant + 10, 50_000));
    fs::create_dir_all(root.join("empty/deeper")).unwrap();
    symlink("docs/readme.txt", root.join("link")).unwrap();
    symlink("../missing", root.join("docs/dangling")).unwrap();
    fs::write(
        root.join(std::ffi::OsStr::from_bytes(b"name-\xff")),
        b"binary name",
    )
    .unwrap();
    let mode: fs::Permissions = std::os::unix::fs::PermissionsExt::from_mode(0o640);
    fs::set_permissions(root.join("docs/readme.txt"), mode).unwrap();
}

fn diff_r(a: &Path, b: &Path) {
    let out = Command::new("diff")
        .args(["-r", "--no-dereference"])
        .arg(a)
        .arg(b)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "diff -r {} {}:\n{}{}",
        a.display(),
        b.display(),
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}

fn modes(root: &Path) -> Vec<(PathBuf, u32)> {
    let out = Command::new("find")
        .arg(root)
        .args(["-printf", "%P %m %y\n"])
        .output()
        .unwrap();
    let mut lines: Vec<(PathBuf, u32)> = String::from_utf8_lossy(&out.stdout)
        .lines()
        .map(|l| {
            let mut it = l.rsplitn(3, ' ');
            let _kind = it.next();
            let mode = u32::from_str_radix(it.next().unwrap(), 8).unwrap();
            (PathBuf::from(it.next().unwrap_or("")), mode)
        })
        .collect();
    lines.sort();
    lines
}

#[test]
fn every_generation_diffs_clean_against_the_tree_committed_as_it() {
    let sc = Scratch::new();
    let mut trees = Vec::new();
    for v in 0..3 {
        let tree = sc.path().join(format!("tree{v}"));
        rich_tree(&tree, v);
        if v == 2 {
            fs::remove_dir_all(tree.join("empty")).unwrap();
        }
        let _ = fs::remove_dir_all(&sc.src);
        copy_tree(&tree, &sc.src);
        assert_eq!(sc.commit("s"), v + 1);
        trees.push(tree);
    }
    // Opened by the daemon (passthrough for large files) first, then by
    // the kernel alone (the default).
    let each = sc.mount_with(&["--opens", "each"]);
    for (i, tree) in trees.iter().enumerate() {
        diff_r(tree, &each.point.join(format!("s/gens/{}", i + 1)));
    }
    drop(each);
    let m = sc.mount();
    for (i, tree) in trees.iter().enumerate() {
        let gen = m.point.join(format!("s/gens/{}", i + 1));
        diff_r(tree, &gen);
        assert_eq!(modes(tree), modes(&gen), "modes of generation {}", i + 1);
    }
    assert_eq!(
        fs::read_link(m.point.join("s/latest")).unwrap(),
        Path::new("gens/3")
    );
    let listed: Vec<_> = fs::read_dir(m.point.join("s/gens"))
        .unwrap()
        .map(|e| e.unwrap().file_name())
        .collect();
    assert_eq!(listed.len(), 3);
}

#[test]
fn latest_follows_commits_while_old_readers_keep_their_generation() {
    let sc = Scratch::new();
    write(&sc.src, "f.txt", b"one");
    write(&sc.src, "dir/inner.txt", b"inner one");
    sc.commit("s");
    let m = sc.mount();
    let mut old = fs::File::open(m.point.join("s/latest/f.txt")).unwrap();
    let cwd_probe = m.point.join("s/gens/1/dir");
    write(&sc.src, "f.txt", b"two");
    write(&sc.src, "dir/inner.txt", b"inner two");
    let committed = Instant::now();
    sc.commit("s");
    wait_for("latest to move", || {
        fs::read_link(m.point.join("s/latest")).unwrap() == Path::new("gens/2")
    });
    assert!(
        committed.elapsed() < Duration::from_secs(1),
        "latest moved after {:?}",
        committed.elapsed()
    );
    let mut s = String::new();
    old.read_to_string(&mut s).unwrap();
    assert_eq!(s, "one", "an open file keeps its generation");
    let out = Command::new("cat")
        .arg("inner.txt")
        .current_dir(&cwd_probe)
        .output()
        .unwrap();
    assert_eq!(
        out.stdout, b"inner one",
        "a cwd in the old generation keeps its content"
    );
    assert_eq!(fs::read(m.point.join("s/latest/f.txt")).unwrap(), b"two");
}

fn flip_blob_byte(st: &Path, store: &Store, path: &[u8]) {
    let view = strata::compose::GenView::open(store, "s", None, "test").unwrap();
    let row = view.lookup(path).unwrap().unwrap();
    let (file, at) = match row.blob {
        strata::row::BlobLoc::Standalone => (
            st.join(strata::store::keys::blob(&hex::encode(row.digest.unwrap()))),
            100,
        ),
        strata::row::BlobLoc::Packed { pack, offset, .. } => (
            st.join(strata::store::keys::pack(&hex::encode(pack))),
            offset as usize + 10,
        ),
        strata::row::BlobLoc::Chunked { .. } => {
            let list = strata::chunks::list(store, &row).unwrap();
            let first = list.chunk_digests().next().expect("a data chunk");
            (
                st.join(strata::store::keys::chunk(&hex::encode(first))),
                100,
            )
        }
        strata::row::BlobLoc::None => panic!("no blob"),
    };
    let mut b = fs::read(&file).unwrap();
    b[at] ^= 0x20;
    fs::write(&file, b).unwrap();
}

#[test]
fn a_flipped_byte_is_eio_for_that_file_only() {
    let sc = Scratch::new();
    write(&sc.src, "big.bin", &noise(1, 2 << 20));
    write(&sc.src, "small.bin", &noise(2, 5000));
    write(&sc.src, "fine.txt", b"still fine");
    sc.commit("s");
    flip_blob_byte(&sc.st, &sc.store, b"big.bin");
    flip_blob_byte(&sc.st, &sc.store, b"small.bin");
    for opens in ["each", "none"] {
        let m = sc.mount_with(&["--opens", opens]);
        for bad in ["big.bin", "small.bin"] {
            let err = fs::read(m.point.join("s/latest").join(bad)).unwrap_err();
            assert_eq!(err.raw_os_error(), Some(libc::EIO), "{opens}: {bad}: {err}");
        }
        assert_eq!(
            fs::read(m.point.join("s/latest/fine.txt")).unwrap(),
            b"still fine"
        );
    }
}

#[test]
fn without_opens_a_corrupt_packed_blob_fails_its_first_read_and_every_read_after() {
    let sc = Scratch::new();
    write(&sc.src, "small.txt", &noise(3, 3000));
    sc.commit("s");
    flip_blob_byte(&sc.st, &sc.store, b"small.txt");
    let m = sc.mount_with(&["--opens", "none"]);
    let path = m.point.join("s/latest/small.txt");
    for attempt in 0..2 {
        // The kernel opens the file on its own: the open succeeds and the
        // daemon learns of the file at its first read.
        let mut f = fs::File::open(&path).unwrap();
        let err = f.read_to_end(&mut Vec::new()).unwrap_err();
        assert_eq!(err.raw_os_error(), Some(libc::EIO), "read {attempt}: {err}");
    }
    assert_eq!(counter(&sc.st, "open_handles"), 0, "no handle was opened");
}

/// A caller that reads on through a directory is pushed the next small
/// files into the kernel's page cache (push_ahead.rs): each reads back as
/// committed, whatever its size (under a page, a page exactly, a partial
/// second page; the larger ones, not pushed, between them); a corrupt one
/// among them is not pushed and its read is EIO, and the files after it
/// are pushed all the same.
#[test]
fn files_pushed_ahead_are_the_committed_bytes_and_a_corrupt_one_stays_eio() {
    let sc = Scratch::new();
    let sizes = [1, 100, 4095, 4096, 4097, 20_000, 70_001];
    let files: Vec<(String, Vec<u8>)> = (0..150)
        .map(|i| (format!("d/f{i:03}"), noise(100 + i as u64, sizes[i % 7])))
        .collect();
    for (name, data) in &files {
        write(&sc.src, name, data);
    }
    sc.commit("s");
    flip_blob_byte(&sc.st, &sc.store, b"d/f075");
    let m = sc.mount_with(&["--opens", "none"]);
    let gen = m.point.join("s/latest");
    // Looked up first: the kernel takes a push only for an inode it holds.
    for (name, _) in &files {
        fs::metadata(gen.join(name)).unwrap();
    }
    for (name, data) in &files {
        let got = fs::read(gen.join(name));
        if name == "d/f075" {
            let err = got.unwrap_err();
            assert_eq!(err.raw_os_error(), Some(libc::EIO), "{name}: {err}");
        } else {
            assert_eq!(&got.unwrap(), data, "{name}");
        }
    }
    let pushed = counter(&sc.st, "pushed_files");
    assert!(pushed >= 50, "only {pushed} files were pushed");
    // Read again (from the pages the kernel keeps, pushed or read).
    for (name, data) in files.iter().filter(|(n, _)| n != "d/f075") {
        assert_eq!(&fs::read(gen.join(name)).unwrap(), data, "again: {name}");
    }
}

#[test]
fn pages_kept_across_opens_are_the_committed_content_after_latest_moves() {
    let sc = Scratch::new();
    write(&sc.src, "f.txt", b"first content");
    write(&sc.src, "same.txt", b"unchanged");
    sc.commit("s");
    let m = sc.mount_with(&["--opens", "none"]);
    let latest = m.point.join("s/latest");
    for _ in 0..3 {
        assert_eq!(fs::read(latest.join("f.txt")).unwrap(), b"first content");
    }
    let held = fs::File::open(latest.join("same.txt")).unwrap();
    assert_eq!(
        counter(&sc.st, "open_handles"),
        0,
        "the kernel opened the file without the daemon"
    );
    // The same size and mtime: only the content differs.
    let mtime = fs::metadata(sc.src.join("f.txt"))
        .unwrap()
        .modified()
        .unwrap();
    write(&sc.src, "f.txt", b"other content");
    fs::File::options()
        .write(true)
        .open(sc.src.join("f.txt"))
        .unwrap()
        .set_modified(mtime)
        .unwrap();
    sc.commit("s");
    wait_for("latest to move", || {
        fs::read_link(&latest).unwrap() == Path::new("gens/2")
    });
    assert_eq!(fs::read(latest.join("f.txt")).unwrap(), b"other content");
    assert_eq!(fs::read(latest.join("same.txt")).unwrap(), b"unchanged");
    let gen1 = m.point.join("s/gens/1/f.txt");
    assert_eq!(fs::read(gen1).unwrap(), b"first content");
    drop(held);
}

#[test]
fn a_retired_generations_kept_pages_are_not_served_once_its_pins_go() {
    let sc = Scratch::new();
    // Two bases: nothing of generation 1 stays reachable from 2.
    write(&sc.src, "f.txt", b"retired content");
    commit_base(&sc.store, "s", &sc.src);
    write(&sc.src, "f.txt", b"kept content");
    commit_base(&sc.store, "s", &sc.src);
    let m = sc.mount_with(&["--sweep-every-s", "0"]);
    let old = m.point.join("s/gens/1/f.txt");
    for _ in 0..2 {
        assert_eq!(fs::read(&old).unwrap(), b"retired content");
    }
    keep_last(&sc.store, 1);
    assert_eq!(
        sweep_now(&sc.store).deleted.count,
        0,
        "generation 1 is pinned"
    );
    wait_for("generation 1 leaves gens/", || {
        !names_in(&m.point.join("s/gens")).contains(&"1".to_string())
    });
    wait_for("generation 1 released", || {
        fs::write("/proc/sys/vm/drop_caches", "2").unwrap();
        pinned_generations(&sc.store).iter().all(|&g| g == 2)
    });
    let err = fs::read(&old).unwrap_err();
    assert_eq!(err.raw_os_error(), Some(libc::ENOENT), "{err}");
    let r1 = sweep_now(&sc.store);
    let r2 = sweep_now(&sc.store);
    assert!(r1.deleted.count + r2.deleted.count > 0, "{r1:?}\n{r2:?}");
    let err = fs::read(&old).unwrap_err();
    assert_eq!(
        err.raw_os_error(),
        Some(libc::ENOENT),
        "after the sweep: {err}"
    );
    assert_eq!(
        fs::read(m.point.join("s/latest/f.txt")).unwrap(),
        b"kept content"
    );
}

#[test]
fn a_corrupt_segment_fails_its_generation_only() {
    let sc = Scratch::new();
    let other = sc.path().join("other");
    for i in 0..600 {
        write(&sc.src, &format!("d{}/f{i}", i % 3), &noise(i, 40));
        write(&other, &format!("d{}/f{i}", i % 3), &noise(i + 1, 40));
    }
    sc.commit("bad");
    let bad_segments = files_under(&sc.st.join("segments"));
    commit_gen(&sc.store, "good", &other);
    for seg in &bad_segments {
        let mut b = fs::read(seg).unwrap();
        let at = b.len() / 2;
        b[at] ^= 0x01;
        fs::write(seg, b).unwrap();
    }
    let m = sc.mount();
    for round in 0..2 {
        let err = fs::read_dir(m.point.join("bad/latest/d1")).unwrap_err();
        assert_eq!(err.raw_os_error(), Some(libc::EIO), "round {round}: {err}");
        diff_r(&other, &m.point.join("good/gens/1"));
    }
    assert!(
        status(&sc.st)["pid"].as_u64().is_some(),
        "the daemon still answers"
    );
}

/// `program args…` run to failure; returns its stderr.
fn fails(program: &str, args: &[&Path]) -> String {
    let out = Command::new(program).args(args).output().unwrap();
    assert!(!out.status.success(), "{program} {args:?} succeeded");
    String::from_utf8_lossy(&out.stderr).into_owned()
}

#[test]
fn a_missing_pack_or_segment_is_eio_and_logged_and_a_missing_name_is_enoent() {
    let sc = Scratch::new();
    let lost = sc.path().join("lost");
    let other = sc.path().join("other");
    write(&sc.src, "small.txt", b"a small file, packed");
    write(&sc.src, "dir/also.txt", b"another one");
    sc.commit("s");
    let view = strata::compose::GenView::open(&sc.store, "s", None, "test").unwrap();
    let row = view.lookup(b"small.txt").unwrap().unwrap();
    assert!(matches!(row.blob, strata::row::BlobLoc::Packed { .. }));
    drop(view);
    let s_segments = files_under(&sc.st.join("segments"));
    let packs = files_under(&sc.st.join("packs"));
    assert_eq!(packs.len(), 1, "{packs:?}");
    for i in 0..50 {
        write(&other, &format!("d/f{i}"), &noise(i, 40));
    }
    commit_gen(&sc.store, "t", &other);
    let t_segments: Vec<PathBuf> = files_under(&sc.st.join("segments"))
        .into_iter()
        .filter(|f| !s_segments.contains(f))
        .collect();
    assert!(!t_segments.is_empty());
    let mut m = sc.mount();
    // Both generations are pinned (latest) but nothing of them is read yet.
    fs::create_dir_all(&lost).unwrap();
    fs::rename(&packs[0], lost.join(packs[0].file_name().unwrap())).unwrap();
    let pack_key = packs[0].strip_prefix(&sc.st).unwrap().display().to_string();
    let small = m.point.join("s/latest/small.txt");
    let err = fails("cat", &[&small]);
    assert!(err.contains("Input/output error"), "cat: {err}");
    assert_eq!(
        fs::read(&small).unwrap_err().raw_os_error(),
        Some(libc::EIO)
    );
    // A name that does not exist is still ENOENT, in a generation and in
    // the namespace around it.
    for absent in ["s/latest/nope", "s/gens/99", "s/tags/nope", "nope"] {
        let err = fails("ls", &[&m.point.join(absent)]);
        assert!(err.contains("No such file or directory"), "{absent}: {err}");
    }
    // A segment lost under a generation pinned but not yet loaded.
    for seg in &t_segments {
        fs::rename(seg, lost.join(seg.file_name().unwrap())).unwrap();
    }
    let err = fails("ls", &[&m.point.join("t/gens/1/d")]);
    assert!(err.contains("Input/output error"), "ls: {err}");
    m.signal(libc::SIGTERM);
    let (status, log) = m.wait();
    assert!(status.success(), "{log}");
    let pack_lines: Vec<&str> = log.lines().filter(|l| l.contains(&pack_key)).collect();
    // One line per failed read (the kernel may retry a failed read-ahead).
    assert!(pack_lines.len() >= 2, "a line per failed read:\n{log}");
    for l in &pack_lines {
        for part in ["ERROR", "set=s", "gen=1", "path=small.txt", "EIO"] {
            assert!(l.contains(part), "{part} missing from: {l}");
        }
    }
    let seg_names: Vec<&str> = t_segments
        .iter()
        .map(|f| f.file_name().unwrap().to_str().unwrap())
        .collect();
    let seg_lines: Vec<&str> = log
        .lines()
        .filter(|l| seg_names.iter().any(|n| l.contains(n)))
        .collect();
    assert!(!seg_lines.is_empty(), "{log}");
    for l in &seg_lines {
        for part in ["ERROR", "set=t", "gen=1", "EIO"] {
            assert!(l.contains(part), "{part} missing from: {l}");
        }
    }
}

#[test]
fn sigterm_with_an_open_file_detaches_and_exits_after_the_last_close() {
    let sc = Scratch::new();
    write(&sc.src, "f.bin", &noise(3, 3 << 20));
    sc.commit("s");
    let mut m = sc.mount();
    let mut open = fs::File::open(m.point.join("s/latest/f.bin")).unwrap();
    m.signal(libc::SIGTERM);
    wait_for("detach", || !mounted(&sc.mnt));
    let mut buf = Vec::new();
    open.read_to_end(&mut buf).unwrap();
    assert_eq!(
        buf,
        noise(3, 3 << 20),
        "the open file is served after detach"
    );
    assert!(
        m.child.as_mut().unwrap().try_wait().unwrap().is_none(),
        "daemon serves until the last close"
    );
    drop(open);
    let (status, err) = m.wait();
    assert!(status.success(), "clean exit: {err}");
    assert!(err.contains("pins released"), "{err}");
    assert_eq!(
        fs::read_dir(sc.st.join("pins/s")).unwrap().count(),
        0,
        "no pin left behind"
    );
}

/// Mount, compare everything with the committed tree (`diff -r`, which
/// reads every file, and a large file's bytes), stop; the daemon's log.
fn served_log(sc: &Scratch, args: &[&str]) -> String {
    let mut m = sc.mount_with(args);
    diff_r(&sc.src, &sc.mnt.join("s/latest/"));
    let big = fs::read(sc.mnt.join("s/latest/big.bin")).unwrap();
    assert!(big == noise(5, 3 << 20), "the large file's bytes");
    m.signal(libc::SIGTERM);
    let (status, err) = m.wait();
    assert!(status.success(), "clean exit: {err}");
    err
}

#[test]
fn requests_come_over_io_uring_where_answers_stay_on_the_asking_cpu_and_dev_fuse_otherwise() {
    let sc = Scratch::new();
    rich_tree(&sc.src, 1);
    write(&sc.src, "big.bin", &noise(5, 3 << 20));
    sc.commit("s");
    let log = served_log(&sc, &[]);
    let host = RingHost::now();
    if host.taken() {
        assert!(log.contains("FUSE over io_uring: "), "{log}");
    } else if host.offered {
        assert!(log.contains("keep coming through /dev/fuse"), "{log}");
    } else if host.grouped {
        assert!(!log.contains("io_uring"), "not asked for: {log}");
    } else {
        assert!(log.contains("does not offer FUSE over io_uring"), "{log}");
    }
    let log = served_log(&sc, &["--no-io-uring"]);
    assert!(!log.contains("io_uring"), "{log}");
}

/// `f.txt` ("content") committed to set `s` and served by a new mount.
fn one_file_mounted(sc: &Scratch) -> Mount {
    write(&sc.src, "f.txt", b"content");
    sc.commit("s");
    let m = sc.mount();
    assert_eq!(fs::read(sc.mnt.join("s/latest/f.txt")).unwrap(), b"content");
    m
}

#[test]
fn after_sigkill_the_old_pins_are_unheld_and_a_fresh_mount_works() {
    let sc = Scratch::new();
    let mut m = one_file_mounted(&sc);
    let pins: Vec<String> = fs::read_dir(sc.st.join("pins/s"))
        .unwrap()
        .map(|e| e.unwrap().file_name().into_string().unwrap())
        .collect();
    assert!(!pins.is_empty(), "the served generation is pinned");
    m.signal(libc::SIGKILL);
    let (status, _) = m.wait();
    assert!(!status.success());
    let listed = strata::pin::list(&sc.store).unwrap();
    assert_eq!(listed.len(), pins.len());
    for p in &listed {
        assert_eq!(
            p.state,
            strata::pin::PinState::Unheld,
            "pin {} of a killed daemon is unheld",
            p.key
        );
        assert!(p.holder.starts_with("mountd"), "{}", p.holder);
    }
    let swept = sweep_now(&sc.store);
    for p in &listed {
        assert!(
            swept.reclaimed.iter().any(|r| r.key == p.key),
            "the next sweep reclaims unheld pin {}",
            p.key
        );
    }
    assert!(strata::pin::list(&sc.store).unwrap().is_empty());
    // Pages the kernel keeps (immutable content) may still be read; any
    // question to the dead daemon fails: ENOTCONN once the kernel has
    // closed the connection; over io_uring, a question queued while the
    // kernel tears the dead daemon's ring down ends ECONNABORTED first.
    let ask = || fs::metadata(sc.mnt.join("s/latest/never-looked-up")).unwrap_err();
    let dead = ask();
    assert!(
        matches!(
            dead.raw_os_error(),
            Some(libc::ENOTCONN | libc::ECONNABORTED)
        ),
        "{dead}"
    );
    wait_for("the connection to close", || {
        ask().raw_os_error() == Some(libc::ENOTCONN)
    });
    let _fresh = sc.mount();
    wait_for("the fresh daemon to replace the dead mount", || {
        fs::metadata(sc.mnt.join("s/latest/never-looked-up"))
            .is_err_and(|e| e.raw_os_error() == Some(libc::ENOENT))
    });
    assert_eq!(fs::read(sc.mnt.join("s/latest/f.txt")).unwrap(), b"content");
    assert_eq!(
        mount_ids(&sc.mnt).len(),
        1,
        "the dead mount was detached, not stacked on"
    );
}

/// The ids of the mounts stacked on `point`, bottom first.
fn mount_ids(point: &Path) -> Vec<String> {
    let table = fs::read_to_string("/proc/self/mountinfo").unwrap();
    let p = point.to_str().unwrap();
    table
        .lines()
        .filter(|l| l.split(' ').nth(4) == Some(p))
        .map(|l| l.split(' ').next().unwrap().to_string())
        .collect()
}

/// Duplicate a `/dev/fuse` descriptor of process `pid` into this process.
fn dup_fuse_fd(pid: u32) -> i32 {
    let fd: i32 = fs::read_dir(format!("/proc/{pid}/fd"))
        .unwrap()
        .flatten()
        .find(|e| fs::read_link(e.path()).is_ok_and(|t| t == Path::new("/dev/fuse")))
        .expect("the daemon holds /dev/fuse")
        .file_name()
        .to_str()
        .unwrap()
        .parse()
        .unwrap();
    // SAFETY: plain syscalls on integers; results are checked.
    unsafe {
        let pidfd = libc::syscall(libc::SYS_pidfd_open, pid as libc::c_int, 0) as i32;
        assert!(
            pidfd >= 0,
            "pidfd_open: {}",
            std::io::Error::last_os_error()
        );
        let dup = libc::syscall(libc::SYS_pidfd_getfd, pidfd, fd, 0) as i32;
        assert!(dup >= 0, "pidfd_getfd: {}", std::io::Error::last_os_error());
        libc::close(pidfd);
        dup
    }
}

/// Write a FUSE_NOTIFY_INVAL_ENTRY for `name` in directory `parent` to a
/// `/dev/fuse` descriptor, as a daemon's notifier does.
fn send_inval_entry(fd: i32, parent: u64, name: &[u8]) -> std::io::Result<()> {
    const FUSE_NOTIFY_INVAL_ENTRY: i32 = 3;
    let len = 16 + 16 + name.len() + 1;
    let mut msg = Vec::with_capacity(len);
    msg.extend_from_slice(&(len as u32).to_ne_bytes());
    msg.extend_from_slice(&FUSE_NOTIFY_INVAL_ENTRY.to_ne_bytes());
    msg.extend_from_slice(&0u64.to_ne_bytes());
    msg.extend_from_slice(&parent.to_ne_bytes());
    msg.extend_from_slice(&(name.len() as u32).to_ne_bytes());
    msg.extend_from_slice(&0u32.to_ne_bytes());
    msg.extend_from_slice(name);
    msg.push(0);
    // SAFETY: writing an initialised buffer to an open descriptor.
    if unsafe { libc::write(fd, msg.as_ptr().cast(), msg.len()) } < 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok(())
}

/// Aborts a FUSE connection when dropped unless disarmed, so a failing
/// test cannot leave a thread stuck in the kernel (which would hang the
/// test process at exit).
struct AbortGuard(Option<u32>);

impl Drop for AbortGuard {
    fn drop(&mut self) {
        if let Some(minor) = self.0 {
            let _ = fs::write(format!("/sys/fs/fuse/connections/{minor}/abort"), b"1");
        }
    }
}

/// The hang seen once in the one-hour soak: a daemon thread sending an
/// entry invalidation waits for the lock of a directory whose lookup waits
/// for the daemon; SIGKILL then cannot end that thread, it keeps the FUSE
/// connection open, and the mount hangs instead of going dead. Here the
/// stuck sender is this test, holding a duplicate of the daemon's
/// `/dev/fuse`, while a lookup waits on the stopped daemon. A new daemon on
/// the same mount point must abort the connection (the lookup fails, the
/// sender returns), detach the hung mount, and serve.
/// Whether every thread of `pid` is stopped (state `T`).
fn all_stopped(pid: u32) -> bool {
    let Ok(tasks) = fs::read_dir(format!("/proc/{pid}/task")) else {
        return false;
    };
    tasks.flatten().all(|t| {
        let stat = fs::read_to_string(t.path().join("stat")).unwrap_or_default();
        // The state follows the parenthesized command name.
        stat.rsplit_once(") ")
            .is_some_and(|(_, rest)| rest.starts_with('T'))
    })
}

#[test]
fn a_new_daemon_recovers_a_mount_hung_by_a_stuck_invalidation() {
    use std::os::unix::fs::MetadataExt;
    let sc = Scratch::new();
    let mut m = one_file_mounted(&sc);
    let gens = fs::metadata(sc.mnt.join("s/gens")).unwrap().ino();
    let minor = strata::mounttab::find(&sc.mnt).unwrap().unwrap().minor;
    let waiting = format!("/sys/fs/fuse/connections/{minor}/waiting");
    let fuse = dup_fuse_fd(m.child.as_ref().unwrap().id());
    let mut guard = AbortGuard(Some(minor));
    // The lookup starts from an open `gens`, so the only request it makes
    // is the lookup of `99` (a path from the mount point could instead
    // block on revalidating `s` or `gens`, whose entries live 500 ms, and
    // then hold no lock in `gens`).
    let gens_dir = fs::File::open(sc.mnt.join("s/gens")).unwrap();
    let dirfd = std::os::fd::AsRawFd::as_raw_fd(&gens_dir);
    m.signal(libc::SIGSTOP);
    // SIGSTOP lands asynchronously: a thread still running could answer
    // the lookup.
    let pid = m.child.as_ref().unwrap().id();
    wait_for("every daemon thread to stop", || all_stopped(pid));
    let lookup = std::thread::spawn(move || {
        // SAFETY: a NUL-terminated name, a directory descriptor kept open
        // until this thread is joined, and a zeroed stat buffer.
        unsafe {
            let mut st: libc::stat = std::mem::zeroed();
            libc::fstatat(dirfd, c"99".as_ptr(), &mut st, libc::AT_SYMLINK_NOFOLLOW)
        }
    });
    wait_for("the lookup to wait on the stopped daemon", || {
        fs::read_to_string(&waiting).is_ok_and(|w| w.trim() != "0")
    });
    let (sent, done) = std::sync::mpsc::channel();
    std::thread::spawn(move || sent.send(send_inval_entry(fuse, gens, b"99")));
    assert!(
        done.recv_timeout(Duration::from_millis(300)).is_err(),
        "the invalidation waits behind the lookup"
    );
    m.signal(libc::SIGKILL);
    m.wait();
    assert!(
        Path::new(&waiting).exists(),
        "the connection outlives the daemon: the mount hangs, it is not dead"
    );
    let _fresh = sc.mount();
    // Nothing reads through the mount point before the connection is
    // aborted: a read from the hung mount would hang this test instead of
    // failing it.
    done.recv_timeout(Duration::from_secs(10))
        .expect("the stuck invalidation returned once the connection was aborted")
        .ok();
    guard.0 = None;
    wait_for("the fresh daemon to replace the hung mount", || {
        fs::read(sc.mnt.join("s/latest/f.txt")).is_ok_and(|b| b == b"content")
    });
    assert_eq!(mount_ids(&sc.mnt).len(), 1, "the hung mount was detached");
    assert_ne!(lookup.join().unwrap(), 0, "the waiting lookup failed");
    drop(gens_dir);
    // SAFETY: closing the descriptor this test duplicated.
    unsafe { libc::close(fuse) };
}

#[test]
fn writes_are_refused_read_only() {
    let sc = Scratch::new();
    write(&sc.src, "f.txt", b"x");
    sc.commit("s");
    let m = sc.mount();
    let gen = m.point.join("s/gens/1");
    let e = fs::OpenOptions::new()
        .write(true)
        .open(gen.join("f.txt"))
        .unwrap_err();
    assert_eq!(e.raw_os_error(), Some(libc::EROFS));
    assert_eq!(
        fs::write(gen.join("new"), b"y").unwrap_err().raw_os_error(),
        Some(libc::EROFS)
    );
    assert_eq!(
        fs::remove_file(gen.join("f.txt"))
            .unwrap_err()
            .raw_os_error(),
        Some(libc::EROFS)
    );
    assert_eq!(
        fs::read_dir(m.point.join("s/gens/7"))
            .unwrap_err()
            .raw_os_error(),
        Some(libc::ENOENT)
    );
}

#[test]
fn concurrent_readers_see_no_error_while_commits_land() {
    let sc = Scratch::new();
    for i in 0..200 {
        write(
            &sc.src,
            &format!("d{}/f{i}", i % 10),
            format!("needle {i}\n").as_bytes(),
        );
    }
    sc.commit("s");
    let m = sc.mount();
    let latest = m.point.join("s/latest/");
    let script = "for i in $(seq 30); do find \"$1\" >/dev/null && grep -rq needle \"$1\" && cat \"$1/d0/f0\" >/dev/null || { echo \"failed in round $i\"; exit 1; }; done";
    let readers: Vec<Child> = (0..3)
        .map(|_| {
            Command::new("bash")
                .args(["-c", script, "reader"])
                .arg(&latest)
                .stdout(Stdio::null())
                .stderr(Stdio::piped())
                .spawn()
                .unwrap()
        })
        .collect();
    for round in 0..6 {
        write(&sc.src, &format!("d{round}/new{round}"), b"needle new");
        if round > 0 {
            fs::remove_file(sc.src.join(format!("d{}/new{}", round - 1, round - 1))).unwrap();
        }
        write(
            &sc.src,
            "d1/f1",
            format!("needle rewritten {round}").as_bytes(),
        );
        sc.commit("s");
        std::thread::sleep(Duration::from_millis(50));
    }
    for r in readers {
        let out = r.wait_with_output().unwrap();
        assert!(
            out.status.success(),
            "reader failed: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
    let last = Instant::now();
    wait_for("latest to reach the last commit", || {
        fs::read_link(m.point.join("s/latest")).unwrap() == Path::new("gens/7")
    });
    assert!(last.elapsed() < Duration::from_secs(1));
}

fn control_socket(st: &Path) -> PathBuf {
    let mut found = None;
    wait_for("control socket", || {
        found = fs::read_dir(st.join("run")).ok().and_then(|d| {
            d.flatten()
                .map(|e| e.path())
                .find(|p| p.extension().is_some_and(|x| x == "sock"))
        });
        found.is_some()
    });
    found.unwrap()
}

/// Send raw bytes, half-close, and read every reply line.
fn exchange(socket: &Path, bytes: &[u8]) -> Vec<serde_json::Value> {
    use std::io::Write;
    use std::os::unix::net::UnixStream;
    let mut s = UnixStream::connect(socket).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    let _ = s.write_all(bytes);
    let _ = s.shutdown(std::net::Shutdown::Write);
    let mut out = String::new();
    let _ = s.read_to_string(&mut out);
    out.lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect()
}

#[test]
fn control_socket_answers_status_and_survives_bad_clients() {
    use std::io::Write;
    use std::os::unix::net::UnixStream;
    let sc = Scratch::new();
    write(&sc.src, "f.txt", b"x");
    sc.commit("s");
    let _m = sc.mount();
    let sock = control_socket(&sc.st);
    // The refresher pins latest just after the mount is ready; on a busy
    // machine the first status may come before it.
    wait_for("latest pinned", || {
        let r = exchange(&sock, b"{\"version\":1,\"command\":\"status\"}\n");
        r[0]["result"]["pinned_generations"].as_u64().unwrap_or(0) >= 1
    });
    let mode = fs::metadata(&sock).unwrap().permissions();
    assert_eq!(
        std::os::unix::fs::PermissionsExt::mode(&mode) & 0o777,
        0o600
    );
    let slow = UnixStream::connect(&sock).unwrap();
    let mut half = UnixStream::connect(&sock).unwrap();
    half.write_all(br#"{"version":1,"comm"#).unwrap();
    drop(half);
    let replies = exchange(&sock, b"garbage\n{\"version\":1,\"command\":\"status\",\"extra\":1}\n{\"version\":1,\"command\":\"nope\"}\n{\"version\":9,\"command\":\"status\"}\n{\"version\":1,\"command\":\"status\"}\n");
    let kinds: Vec<_> = replies
        .iter()
        .map(|r| r["error"]["kind"].as_str().unwrap_or("ok").to_string())
        .collect();
    assert_eq!(
        kinds,
        [
            "invalid-request",
            "invalid-request",
            "unknown-command",
            "unsupported-version",
            "ok"
        ]
    );
    let status = &replies[4]["result"];
    assert_eq!(status["sets"][0]["set"], "s");
    assert_eq!(status["sets"][0]["latest"], 1);
    assert!(status["pinned_generations"].as_u64().unwrap() >= 1);
    let mut big = vec![b'x'; (1 << 20) + 10];
    big.push(b'\n');
    let replies = exchange(&sock, &big);
    assert_eq!(replies[0]["error"]["kind"], "too-large");
    let pins = exchange(&sock, b"{\"version\":1,\"command\":\"pins\"}\n");
    assert_eq!(pins[0]["result"][0]["set"], "s", "{pins:?}");
    drop(slow);
}

#[test]
fn control_socket_refuses_another_uid() {
    let sc = Scratch::new();
    write(&sc.src, "f.txt", b"x");
    sc.commit("s");
    let _m = sc.mount();
    let sock = control_socket(&sc.st);
    let client = "import socket,sys\ns=socket.socket(socket.AF_UNIX)\ntry:\n    s.connect(sys.argv[1]); s.sendall(b'{\"version\":1,\"command\":\"status\"}\\n'); print(s.makefile().readline())\nexcept OSError as e:\n    print('refused', e)\n";
    let out = Command::new("setpriv")
        .args([
            "--reuid=65534",
            "--regid=65534",
            "--clear-groups",
            "/usr/bin/python3",
            "-c",
            client,
        ])
        .arg(&sock)
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        text.starts_with("refused") || text.contains("forbidden"),
        "another uid must be refused: {text} {}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(!text.contains("\"ok\":true"));
}

/// Open generation directory `gen` twice: the mount then has the kernel
/// keep every listing it reads.
fn keep_listings(gen: &Path) {
    for _ in 0..2 {
        names_in(gen);
    }
}

/// The names directory `dir` lists, sorted.
fn names_in(dir: &Path) -> Vec<String> {
    let mut names: Vec<String> = fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().into_string().unwrap())
        .collect();
    names.sort();
    names
}

/// Once the kernel keeps every listing it reads, the synthetic ones (sets,
/// generations, history) must still follow what they list.
#[test]
fn kept_listings_of_sets_generations_and_history_follow_commits() {
    let sc = Scratch::new();
    write(&sc.src, "f.txt", b"one");
    sc.commit("s");
    let m = sc.mount();
    let gens = m.point.join("s/gens");
    let versions = m.point.join("s/history/f.txt");
    keep_listings(&gens.join("1"));
    let reads = counter(&sc.st, "dir_reads");
    names_in(&gens.join("1"));
    assert_eq!(counter(&sc.st, "dir_reads"), reads, "listings are kept");
    for _ in 0..2 {
        assert_eq!(names_in(&m.point), ["s"]);
        assert_eq!(names_in(&gens), ["1"]);
        assert_eq!(names_in(&versions), ["1"]);
    }
    write(&sc.src, "f.txt", b"two");
    sc.commit("s");
    sc.commit("t");
    wait_for("latest", || {
        fs::read_link(m.point.join("s/latest")).ok() == Some("gens/2".into())
    });
    assert_eq!(names_in(&gens), ["1", "2"], "follows `latest` at once");
    wait_for("new version listed", || names_in(&versions) == ["1", "2"]);
    wait_for("new set listed", || names_in(&m.point) == ["s", "t"]);
    assert_eq!(fs::read(gens.join("2/f.txt")).unwrap(), b"two");
}

#[test]
fn tags_appear_and_follow_untag_and_retag() {
    let sc = Scratch::new();
    write(&sc.src, "f.txt", b"one");
    sc.commit("s");
    write(&sc.src, "f.txt", b"two");
    sc.commit("s");
    let m = sc.mount();
    let tag = m.point.join("s/tags/release");
    let tags = m.point.join("s/tags");
    keep_listings(&m.point.join("s/gens/1"));
    assert!(!tag.exists());
    // The kernel keeps the empty listing; it must not outlive the tag.
    assert!(names_in(&tags).is_empty());
    strata::tag::tag(&sc.store, "s", "release", Some(1)).unwrap();
    wait_for("tag", || {
        fs::read_link(&tag).ok() == Some("../gens/1".into())
    });
    assert_eq!(fs::read(tag.join("f.txt")).unwrap(), b"one");
    wait_for("tag listed", || names_in(&tags) == ["release"]);
    strata::tag::untag(&sc.store, "s", "release").unwrap();
    wait_for("untagged", || names_in(&tags).is_empty());
    strata::tag::tag(&sc.store, "s", "release", Some(2)).unwrap();
    wait_for("moved tag", || {
        fs::read_link(&tag).ok() == Some("../gens/2".into())
    });
    assert_eq!(fs::read(tag.join("f.txt")).unwrap(), b"two");
}

#[test]
fn a_million_entry_directory_lists_completely_and_seeks() {
    const N: usize = 1_000_000;
    let sc = Scratch::new();
    // A million names in one ext4 directory take minutes to create; tmpfs
    // takes seconds. The tree only feeds the commit.
    let shm = tempfile::tempdir_in("/dev/shm").or_else(|_| tempfile::tempdir());
    let shm = shm.unwrap();
    let src = shm.path().to_path_buf();
    let dir = src.join("wide");
    fs::create_dir_all(&dir).unwrap();
    for i in 0..N {
        fs::File::create(dir.join(format!("f{i:07}"))).unwrap();
    }
    commit_gen(&sc.store, "s", &src);
    drop(shm);
    let m = sc.mount();
    let wide = m.point.join("s/gens/1/wide");
    let out = Command::new("ls").arg("-f").arg(&wide).output().unwrap();
    assert!(out.status.success());
    let listed: Vec<&[u8]> = out
        .stdout
        .split(|b| *b == b'\n')
        .filter(|l| !l.is_empty())
        .collect();
    assert_eq!(listed.len(), N + 2, "every entry plus . and ..");
    let mut names: Vec<&[u8]> = listed.into_iter().filter(|n| n.starts_with(b"f")).collect();
    names.sort();
    names.dedup();
    assert_eq!(names.len(), N, "no entry twice, none missing");
    // telldir / seekdir: re-reading from a remembered position gives the same entries.
    let script = r#"
        opendir(my $d, $ARGV[0]) or die "opendir: $!";
        readdir($d) for 1..1000;
        my $pos = telldir($d);
        my @next = map { scalar readdir($d) } 1..5000;
        readdir($d) for 1..200000;
        seekdir($d, $pos);
        for my $i (0..$#next) {
            my $e = readdir($d);
            die "entry $i after seekdir: got $e, want $next[$i]\n" unless $e eq $next[$i];
        }
        my $n = 1000 + 5000;
        $n++ while defined(readdir($d));
        print "$n\n";
    "#;
    let out = Command::new("perl")
        .arg("-e")
        .arg(script)
        .arg(&wide)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(
        String::from_utf8_lossy(&out.stdout).trim(),
        (N + 2).to_string()
    );
}

fn status(st: &Path) -> serde_json::Value {
    let sock = control_socket(st);
    let replies = exchange(&sock, b"{\"version\":1,\"command\":\"status\"}\n");
    replies[0]["result"].clone()
}

#[test]
fn walked_generations_are_released_once_the_kernel_forgets_them() {
    let sc = Scratch::new();
    for i in 0..300 {
        write(
            &sc.src,
            &format!("d{}/f{i}", i % 7),
            format!("{i}").as_bytes(),
        );
    }
    sc.commit("s");
    let m = sc.mount();
    let out = Command::new("find")
        .arg(m.point.join("s/gens/1"))
        .args(["-printf", "%s\n"])
        .output()
        .unwrap();
    assert_eq!(out.stdout.split(|b| *b == b'\n').count(), 300 + 8 + 1);
    write(&sc.src, "new", b"x");
    sc.commit("s");
    wait_for("latest moves", || {
        fs::read_link(m.point.join("s/latest")).ok() == Some("gens/2".into())
    });
    assert!(status(&sc.st)["pinned_generations"].as_u64().unwrap() >= 2);
    // Make the kernel drop its dentries and inodes: every lookup it counted
    // (lookup and readdirplus alike) comes back as a forget.
    wait_for("generation 1 released", || {
        fs::write("/proc/sys/vm/drop_caches", "2").unwrap();
        status(&sc.st)["pinned_generations"].as_u64() == Some(1)
    });
    let pins = strata::pin::list(&sc.store).unwrap();
    assert!(pins.iter().all(|p| p.generation == 2), "only latest pinned");
}

fn counter(st: &Path, name: &str) -> u64 {
    status(st)[name].as_u64().unwrap()
}

/// `find -printf` of every entry below `root`: relative path, type, size
/// (not of directories), permissions, mtime and link target, sorted.
fn stat_listing(root: &Path) -> Vec<String> {
    let out = Command::new("find")
        .arg(root)
        .args([
            "-mindepth",
            "1",
            "(",
            "-type",
            "d",
            "-printf",
            "%P d %m %T@\n",
            ")",
        ])
        .args(["-o", "-printf", "%P %y %s %m %T@ %l\n"])
        .output()
        .unwrap();
    assert!(out.status.success(), "{out:?}");
    let mut lines: Vec<String> = String::from_utf8(out.stdout)
        .unwrap()
        .lines()
        .map(String::from)
        .collect();
    lines.sort();
    lines
}

#[test]
fn a_walk_that_reads_only_names_instantiates_no_file_inodes() {
    let sc = Scratch::new();
    for i in 0..2000 {
        write(
            &sc.src,
            &format!("d{}/f{i}", i % 4),
            &noise(i, (i % 50) as usize),
        );
    }
    symlink("d0/f0", sc.src.join("link")).unwrap();
    sc.commit("s");
    let m = sc.mount();
    let root = m.point.join("s/gens/1");
    let names = Command::new("find").arg(&root).output().unwrap();
    assert_eq!(names.stdout.split(|b| *b == b'\n').count(), 2000 + 6 + 1);
    // Files went out bare: the kernel made no inode for them and looked
    // none up (only the few directories and synthetic nodes).
    assert!(counter(&sc.st, "bare_entries") >= 2001);
    let held = counter(&sc.st, "inodes");
    assert!(held < 50, "{held} inodes held after a names-only walk");
    let lookups = counter(&sc.st, "lookups");
    assert!(lookups < 50, "{lookups} lookups during a names-only walk");
    // A walk that stats everything sees exactly the committed attributes.
    // It looks up the files of its first directory (listed bare); from
    // then on it is listed with attributes, so it looks up far fewer than
    // the 2,001 non-directory entries.
    assert_eq!(stat_listing(&root), stat_listing(&sc.src));
    let looked_up = counter(&sc.st, "lookups") - lookups;
    assert!(
        (500..1500).contains(&looked_up),
        "{looked_up} lookups for a stat walk of 2,001 files in 4 directories"
    );
    assert!(
        counter(&sc.st, "inodes") > 2000,
        "the stat walk holds its inodes"
    );
}

/// A listing the kernel keeps bare (fetched by a walk that reads only
/// names) is dropped when a caller that stats comes, so that caller gets
/// its listings again with attributes instead of looking up every entry.
#[test]
fn bare_kept_listings_are_fetched_again_for_a_caller_that_stats() {
    let sc = Scratch::new();
    for i in 0..2000 {
        write(&sc.src, &format!("d{}/f{i}", i % 4), &noise(i, 10));
    }
    sc.commit("s");
    let m = sc.mount();
    let root = m.point.join("s/gens/1");
    let find = || {
        let out = Command::new("find").arg(&root).output().unwrap();
        assert!(out.status.success(), "{out:?}");
    };
    // Uncached, then kept (bare), then served by the kernel alone.
    for _ in 0..3 {
        find();
    }
    let reads = counter(&sc.st, "dir_reads");
    find();
    assert_eq!(counter(&sc.st, "dir_reads"), reads, "the listings are kept");
    let lookups = counter(&sc.st, "lookups");
    assert_eq!(stat_listing(&root), stat_listing(&sc.src));
    let looked_up = counter(&sc.st, "lookups") - lookups;
    assert!(
        (400..1500).contains(&looked_up),
        "{looked_up} lookups for a stat walk of 2,000 files in 4 directories kept bare"
    );
}

#[test]
fn the_kernel_keeps_listings_once_a_directory_is_opened_again() {
    let sc = Scratch::new();
    for i in 0..300 {
        write(&sc.src, &format!("d/f{i}"), b"x");
    }
    sc.commit("s");
    let m = sc.mount();
    let dir = m.point.join("s/gens/1/d");
    let reads_of_one_listing = || {
        let before = counter(&sc.st, "dir_reads");
        let out = Command::new("ls").arg("-f").arg(&dir).output().unwrap();
        assert!(out.status.success(), "{out:?}");
        assert_eq!(out.stdout.split(|b| *b == b'\n').count(), 300 + 2 + 1);
        counter(&sc.st, "dir_reads") - before
    };
    // First opening: served uncached; the second turns the kernel's
    // keeping of listings on and is served while it fills; from then on
    // the kernel answers alone (no opendir, no readdir).
    assert!(reads_of_one_listing() > 0, "first listing");
    assert!(reads_of_one_listing() > 0, "second listing");
    assert_eq!(reads_of_one_listing(), 0, "third listing");
    assert_eq!(reads_of_one_listing(), 0, "fourth listing");
}

/// `program` run as nobody (uid and gid 65534, no groups).
fn as_nobody(program: &str) -> Command {
    let mut c = Command::new("setpriv");
    c.args(["--reuid=65534", "--regid=65534", "--clear-groups", program]);
    c
}

/// Lazily detaches a mount point when dropped (a failed test leaves none).
struct DetachOnDrop(PathBuf);

impl Drop for DetachOnDrop {
    fn drop(&mut self) {
        detach(&self.0);
    }
}

#[test]
fn a_user_mounts_unmounts_and_recovers_a_mount_of_their_own() {
    let sc = Scratch::new();
    write(&sc.src, "f.txt", b"content");
    write(&sc.src, "big.bin", &noise(3, 3 << 20));
    fs::create_dir_all(&sc.mnt).unwrap();
    let chown = Command::new("chown")
        .args(["-R", "65534:65534"])
        .arg(sc.path())
        .status()
        .unwrap();
    assert!(chown.success());
    let _guard = DetachOnDrop(sc.mnt.clone());
    let strata = |args: &[&str]| {
        let o = as_nobody(bin())
            .arg("--store")
            .arg(&sc.st)
            .args(args)
            .output();
        let o = o.unwrap();
        let err = String::from_utf8_lossy(&o.stderr).into_owned();
        assert!(o.status.success(), "strata {args:?}: {err}");
        (String::from_utf8_lossy(&o.stdout).into_owned(), err)
    };
    let point = sc.mnt.to_str().unwrap();
    strata(&["commit", "--set", "s", sc.src.to_str().unwrap()]);
    // Debian's udev rule makes /dev/fuse 0666; this machine kind has no
    // udev and leaves it 0600, through which no user can mount: the
    // daemon's reason reaches the user. (Only this test mounts as a user.)
    let mode = |m| -> fs::Permissions { std::os::unix::fs::PermissionsExt::from_mode(m) };
    fs::set_permissions("/dev/fuse", mode(0o600)).unwrap();
    let mut refused = as_nobody(bin());
    let refused = refused.arg("--store").arg(&sc.st).args(["mount", point]);
    let refused = refused.output().unwrap();
    let said = String::from_utf8_lossy(&refused.stderr);
    assert!(!refused.status.success());
    assert!(said.contains("/dev/fuse readable and writable"), "{said}");
    fs::set_permissions("/dev/fuse", mode(0o666)).unwrap();
    let read = || {
        let o = as_nobody("cat").arg(sc.mnt.join("s/latest/f.txt")).output();
        o.unwrap().stdout
    };
    // umount2 needs root: a user's mount goes through fusermount3, both
    // for `strata unmount` and for the daemon's own detach.
    strata(&["mount", point]);
    assert_eq!(read(), b"content");
    // A standalone blob: no passthrough without CAP_SYS_ADMIN, so the
    // daemon serves its reads.
    let big = as_nobody("cat")
        .arg(sc.mnt.join("s/latest/big.bin"))
        .output();
    assert!(big.unwrap().stdout == noise(3, 3 << 20));
    strata(&["unmount", point]);
    assert!(!mounted(&sc.mnt));
    let (out, _) = strata(&["mount", point]);
    let pid = mounted_pid(&out);
    // SAFETY: signalling the daemon this test started.
    unsafe { libc::kill(pid, libc::SIGKILL) };
    wait_for("the daemon to die", || ended(pid));
    // A fresh mount by the same user detaches what the killed daemon left
    // (fusectl needs root, so the connection is not aborted) and serves.
    let (_, err) = strata(&["mount", point]);
    assert!(err.contains("detached the stale mount"), "{err}");
    assert_eq!(read(), b"content");
    assert_eq!(mount_ids(&sc.mnt).len(), 1, "the stale mount was detached");
    strata(&["unmount", point]);
    assert!(!mounted(&sc.mnt));
}

#[test]
fn verify_always_rechecks_a_blob_at_every_open() {
    let sc = Scratch::new();
    write(&sc.src, "big.bin", &noise(9, 2 << 20));
    sc.commit("s");
    let m = sc.mount_with(&["--verify", "always"]);
    let file = m.point.join("s/latest/big.bin");
    assert_eq!(fs::read(&file).unwrap(), noise(9, 2 << 20));
    flip_blob_byte(&sc.st, &sc.store, b"big.bin");
    let err = fs::read(&file).unwrap_err();
    assert_eq!(err.raw_os_error(), Some(libc::EIO), "{err}");
}

#[test]
fn owners_are_the_mounting_user_unless_preserved() {
    use std::os::unix::fs::MetadataExt;
    let sc = Scratch::new();
    write(&sc.src, "owned.txt", b"x");
    std::os::unix::fs::chown(sc.src.join("owned.txt"), Some(1234), Some(5678)).unwrap();
    sc.commit("s");
    let m = sc.mount();
    let md = fs::metadata(m.point.join("s/latest/owned.txt")).unwrap();
    // SAFETY: getuid has no preconditions.
    assert_eq!(md.uid(), unsafe { libc::getuid() });
    drop(m);
    let m = sc.mount_with(&["--preserve-owner"]);
    let md = fs::metadata(m.point.join("s/latest/owned.txt")).unwrap();
    assert_eq!((md.uid(), md.gid()), (1234, 5678));
    // A chown alone is a change the next commit records.
    std::os::unix::fs::chown(sc.src.join("owned.txt"), Some(4321), None).unwrap();
    assert_eq!(sc.commit("s"), 2);
    let md = fs::metadata(m.point.join("s/gens/2/owned.txt")).unwrap();
    assert_eq!(md.uid(), 4321);
}

/// Generation 2 of set `s` as a large delta over generation 1.
fn large_delta(store: &Store, src: &Path) {
    for i in 0..200 {
        write(src, &format!("d{}/f{i}", i % 5), &noise(i, 600));
    }
    write(src, "big.bin", &noise(77, 3 << 20));
    commit_gen(store, "s", src);
    for i in (0..200).step_by(2) {
        write(src, &format!("d{}/f{i}", i % 5), &noise(i + 900, 800));
    }
    commit_gen(store, "s", src);
}

fn reads_from(store: &Store, generation: u64) -> strata::format::manifest::RepKind {
    strata::compose::GenView::open(store, "s", Some(generation), "test")
        .unwrap()
        .top()
        .kind()
}

#[test]
fn readers_keep_working_through_materialization() {
    use std::io::{Read, Seek};
    let sc = Scratch::new();
    large_delta(&sc.store, &sc.src);
    let m = sc.mount_with(&["--no-materialize"]);
    let gen2 = m.point.join("s/gens/2");
    let mut open = fs::File::open(gen2.join("big.bin")).unwrap();
    let mut head = vec![0u8; 4096];
    open.read_exact(&mut head).unwrap();
    let cwd = Command::new("sh")
        .arg("-c")
        .arg("cd d1 && sleep 3 && cat f1 f6 | wc -c")
        .current_dir(&gen2)
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let out = materialize_gen(&sc.store, 2);
    assert_eq!(out.state, Some(strata::task::TaskState::Published));
    assert_eq!(
        reads_from(&sc.store, 2),
        strata::format::manifest::RepKind::Base
    );
    open.rewind().unwrap();
    let mut all = Vec::new();
    open.read_to_end(&mut all).unwrap();
    assert_eq!(
        all,
        fs::read(sc.src.join("big.bin")).unwrap(),
        "the open file"
    );
    let counted = cwd.wait_with_output().unwrap();
    assert!(counted.status.success(), "the cwd in the generation");
    assert_eq!(String::from_utf8_lossy(&counted.stdout).trim(), "1400");
    diff_r(&sc.src, &gen2);
    // Once the reader lets go, the daemon serves the new base only: the old
    // delta is no longer pinned by anyone.
    drop(open);
    wait_for("the old representation released", || {
        fs::write("/proc/sys/vm/drop_caches", "2").unwrap();
        let pins = strata::pin::list(&sc.store).unwrap();
        pins.iter().all(|p| p.representation == "base")
    });
}

#[test]
fn the_daemon_materializes_by_policy_and_on_request() {
    let sc = Scratch::new();
    large_delta(&sc.store, &sc.src);
    let args = ["--materialize-min-rows", "10", "--materialize-ratio", "0.1"];
    let m = sc.mount_with(&args);
    wait_for("policy materialization", || {
        reads_from(&sc.store, 2) == strata::format::manifest::RepKind::Base
    });
    diff_r(&sc.src, &m.point.join("s/gens/2"));
    // A request through the socket: generation 3, a delta below the policy's ratio.
    write(&sc.src, "d0/f0", b"small");
    sc.commit("s");
    let sock = control_socket(&sc.st);
    let replies = exchange(
        &sock,
        b"{\"version\":1,\"command\":\"materialize\",\"set\":\"s\",\"generation\":3,\"wait\":true}\n{\"version\":1,\"command\":\"materialize\"}\n{\"version\":1,\"command\":\"tasks\"}\n",
    );
    assert_eq!(
        replies[0]["result"]["state"], "PUBLISHED",
        "{:?}",
        replies[0]
    );
    assert_eq!(replies[1]["error"]["kind"], "invalid-request");
    assert_eq!(replies[2]["result"].as_array().unwrap().len(), 2);
    assert_eq!(
        reads_from(&sc.store, 3),
        strata::format::manifest::RepKind::Base
    );
    diff_r(&sc.src, &m.point.join("s/gens/3"));
}

#[test]
fn a_large_file_opened_twice_at_once_reads_in_both() {
    use std::io::Read;
    let sc = Scratch::new();
    write(&sc.src, "big.bin", &noise(5, 3 << 20));
    write(&sc.src, "copy.bin", &noise(5, 3 << 20));
    sc.commit("s");
    let m = sc.mount();
    // Three opens of one blob (two paths share its content) held together.
    let paths = ["s/gens/1/big.bin", "s/gens/1/big.bin", "s/latest/copy.bin"];
    let mut files: Vec<fs::File> = paths
        .iter()
        .map(|p| fs::File::open(m.point.join(p)).unwrap())
        .collect();
    for f in &mut files {
        let mut all = Vec::new();
        f.read_to_end(&mut all).unwrap();
        assert_eq!(all, noise(5, 3 << 20));
    }
}

/// Once a chunked file's assembled copy exists, reads of it are answered by
/// splicing the copy's pages into the reply: the bytes are the committed
/// ones at page-aligned and odd offsets, across and past the end, through
/// the page cache and with O_DIRECT (whose reads reach the daemon unaligned).
#[test]
fn spliced_reads_of_an_assembled_copy_are_the_committed_bytes() {
    use std::os::unix::fs::{FileExt, OpenOptionsExt};
    let sc = Scratch::new();
    let len = (3 << 20) + 123;
    let data = noise(9, len);
    write(&sc.src, "a.bin", &data);
    write(&sc.src, "b.bin", &data);
    sc.commit("s");
    let m = sc.mount_with(&["--opens", "none"]);
    let gen = m.point.join("s/latest");
    // The first open reads chunks while the copy is assembled.
    assert_eq!(fs::read(gen.join("a.bin")).unwrap(), data);
    let copies = sc.st.join(strata::store::keys::ASSEMBLED);
    wait_for("the assembled copy", || {
        fs::read_dir(&copies)
            .unwrap()
            .flatten()
            .any(|e| !e.file_name().as_bytes().starts_with(b"."))
    });
    // Same content, another inode: its reads come from the copy.
    assert_eq!(fs::read(gen.join("b.bin")).unwrap(), data);
    let spliced = counter(&sc.st, "spliced_reads");
    assert!(spliced > 0, "no read was spliced");
    let direct = fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_DIRECT)
        .open(gen.join("b.bin"))
        .unwrap();
    for (at, n) in [(0, 4096), (4097, 70_000), (len - 100, 1000), (len, 10)] {
        let mut buf = vec![0; n];
        let got = direct.read_at(&mut buf, at as u64).unwrap();
        assert_eq!(
            &buf[..got],
            &data[at.min(len)..(at + n).min(len)],
            "at {at}"
        );
    }
    assert!(
        counter(&sc.st, "spliced_reads") > spliced,
        "O_DIRECT reads were not spliced"
    );
}

#[test]
fn the_policy_also_triggers_on_delta_bytes_and_base_age() {
    for args in [
        [
            "--materialize-min-rows",
            "1000000",
            "--materialize-delta-bytes",
            "1",
        ],
        [
            "--materialize-min-rows",
            "1000000",
            "--materialize-max-age-s",
            "1",
        ],
    ] {
        let sc = Scratch::new();
        large_delta(&sc.store, &sc.src);
        let _m = sc.mount_with(&args);
        wait_for("policy materialization", || {
            reads_from(&sc.store, 2) == strata::format::manifest::RepKind::Base
        });
    }
}

fn sweep_now(store: &Store) -> strata::sweep::SweepReport {
    let opts = strata::sweep::SweepOptions {
        grace: Duration::ZERO,
        dry_run: false,
        holder: "test".into(),
        recount: false,
        budget: Default::default(),
        upload_age: strata::sweep::DEFAULT_UPLOAD_AGE,
    };
    strata::sweep::sweep(store, &opts).unwrap()
}

/// Store set `s`'s retention: keep the newest `n` generations.
fn keep_last(store: &Store, n: u64) {
    let policy = strata::retain::Policy {
        keep_last: Some(n),
        keep_within_s: None,
    };
    strata::retain::set_policy(store, "s", policy).unwrap();
}

/// Fold generation `g` of set `s` in this process.
fn materialize_gen(store: &Store, g: u64) -> strata::materialize::Outcome {
    let opts = strata::materialize::MaterializeOptions {
        set: "s".into(),
        generation: Some(g),
        wait: None,
        plan_only: false,
        cancel: Default::default(),
    };
    strata::materialize::materialize(store, &opts).unwrap()
}

fn pinned_generations(store: &Store) -> Vec<u64> {
    strata::pin::list(store)
        .unwrap()
        .into_iter()
        .filter(|p| p.state == strata::pin::PinState::Held)
        .map(|p| p.generation)
        .collect()
}

#[test]
fn readers_in_retired_generations_keep_reading_until_they_let_go() {
    let sc = Scratch::new();
    write(&sc.src, "a/old.txt", &noise(1, 300_000));
    commit_base(&sc.store, "s", &sc.src);
    fs::remove_dir_all(sc.src.join("a")).unwrap();
    write(&sc.src, "b.bin", &noise(2, 400_000));
    commit_base(&sc.store, "s", &sc.src);
    let m = sc.mount_with(&["--sweep-every-s", "0"]);
    let mut shell = Command::new("sh")
        .arg("-c")
        .arg("cd \"$1\" && read line && cat old.txt")
        .arg("sh")
        .arg(m.point.join("s/gens/1/a"))
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let mut open = fs::File::open(m.point.join("s/gens/2/b.bin")).unwrap();
    wait_for("the shell's cwd", || {
        pinned_generations(&sc.store).contains(&1)
    });
    for round in 3..=5 {
        write(&sc.src, "b.bin", &noise(round, 400_000));
        commit_base(&sc.store, "s", &sc.src);
    }
    keep_last(&sc.store, 1);
    let sock = control_socket(&sc.st);
    for _ in 0..2 {
        let r = exchange(
            &sock,
            b"{\"version\":1,\"command\":\"sweep\",\"grace_ms\":0}\n",
        );
        assert_eq!(r[0]["ok"], true, "{}", r[0]);
    }
    let listed: Vec<String> = fs::read_dir(m.point.join("s/gens"))
        .unwrap()
        .map(|e| e.unwrap().file_name().into_string().unwrap())
        .collect();
    assert!(listed.contains(&"5".to_string()), "{listed:?}");
    assert!(!listed.contains(&"3".to_string()), "retired: {listed:?}");
    let mut bytes = Vec::new();
    open.read_to_end(&mut bytes).unwrap();
    assert!(bytes == noise(2, 400_000), "the open file reads on");
    use std::io::Write;
    shell.stdin.take().unwrap().write_all(b"go\n").unwrap();
    let out = shell.wait_with_output().unwrap();
    assert!(out.stdout == noise(1, 300_000), "the cwd reads on");
    drop(open);
    // The kernel forgets the retired generations' inodes when it reclaims
    // them (memory pressure; here forced): then the daemon unpins them.
    wait_for("retired generations released", || {
        fs::write("/proc/sys/vm/drop_caches", "2").unwrap();
        pinned_generations(&sc.store).iter().all(|&g| g == 5)
    });
    let deleted = sweep_now(&sc.store).deleted.count + sweep_now(&sc.store).deleted.count;
    assert!(deleted > 0, "what the readers held is reclaimed");
    assert_eq!(sweep_now(&sc.store).condemned.count, 0);
    assert!(fs::read(m.point.join("s/latest/b.bin")).unwrap() == noise(5, 400_000));
    let report = strata::verify::verify(
        &sc.store,
        &["s".to_string()],
        strata::verify::Selection::All,
    )
    .unwrap();
    assert!(report.problems.is_empty(), "{:?}", report.problems);
}

#[test]
fn the_daemon_sweeps_on_its_schedule_and_reports_it() {
    let sc = Scratch::new();
    for round in 0..3 {
        write(&sc.src, "f.bin", &noise(round, 200_000));
        commit_base(&sc.store, "s", &sc.src);
    }
    keep_last(&sc.store, 1);
    let _m = sc.mount_with(&["--sweep-every-s", "1", "--sweep-grace-s", "0"]);
    let start = Instant::now();
    loop {
        let last = status(&sc.st)["last_sweep"].clone();
        if last["epoch"].as_u64() >= Some(2) && last["deleted"]["count"].as_u64() > Some(0) {
            break;
        }
        assert!(
            start.elapsed() < Duration::from_secs(20),
            "no scheduled sweep reclaimed anything: {last}"
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    let log = strata::index::GenIndex::new(&sc.store, "s").all().unwrap();
    let retired = log
        .values()
        .filter(|r| r.state == strata::format::record::State::Retired)
        .count();
    assert_eq!(retired, 2, "retention ran in the scheduled sweeps");
}

/// The pids of the sweep helpers (`strata sweep --serve`) of the store `st`
/// that run.
fn sweep_helpers(st: &Path) -> Vec<i32> {
    let store = st.to_string_lossy().into_owned();
    let mut pids = Vec::new();
    for entry in fs::read_dir("/proc").unwrap().flatten() {
        let Ok(pid) = entry.file_name().to_string_lossy().parse::<i32>() else {
            continue;
        };
        let args = fs::read(format!("/proc/{pid}/cmdline")).unwrap_or_default();
        let args: Vec<String> = args
            .split(|&b| b == 0)
            .map(|a| String::from_utf8_lossy(a).into_owned())
            .collect();
        if args.contains(&"--serve".to_string()) && args.contains(&store) && !ended(pid) {
            pids.push(pid);
        }
    }
    pids
}

/// One helper process serves the daemon's sweeps; one killed between
/// sweeps is replaced at the next sweep, and the helper ends with the
/// daemon.
#[test]
fn one_helper_serves_the_daemons_sweeps_and_is_replaced_when_killed() {
    let sc = Scratch::new();
    write(&sc.src, "f.txt", b"content");
    commit_base(&sc.store, "s", &sc.src);
    let m = sc.mount_with(&["--sweep-every-s", "0"]);
    let sock = control_socket(&sc.st);
    let sweep = || {
        let r = exchange(
            &sock,
            b"{\"version\":1,\"command\":\"sweep\",\"grace_ms\":0}\n",
        );
        assert_eq!(r[0]["ok"], true, "{}", r[0]);
    };
    assert!(
        sweep_helpers(&sc.st).is_empty(),
        "started at the first sweep"
    );
    sweep();
    let first = sweep_helpers(&sc.st);
    assert_eq!(first.len(), 1, "{first:?}");
    sweep();
    sweep();
    assert_eq!(sweep_helpers(&sc.st), first, "the same helper serves on");
    // SAFETY: signalling the helper this test's daemon started.
    unsafe { libc::kill(first[0], libc::SIGKILL) };
    wait_for("the helper to die", || ended(first[0]));
    sweep();
    let second = sweep_helpers(&sc.st);
    assert_eq!(second.len(), 1, "{second:?}");
    assert_ne!(second, first, "a new helper");
    assert_eq!(
        status(&sc.st)["last_sweep"]["error"],
        serde_json::Value::Null
    );
    m.signal(libc::SIGKILL);
    wait_for("the helper to end with the daemon", || ended(second[0]));
}

/// The daemon's sweeps run in a `strata sweep` helper: its typed refusal is
/// the daemon's answer and its last outcome, and the daemon keeps serving.
#[test]
fn a_failed_daemon_sweep_answers_the_sweeps_own_error() {
    let sc = Scratch::new();
    write(&sc.src, "f.txt", b"content");
    commit_base(&sc.store, "s", &sc.src);
    let m = sc.mount_with(&["--sweep-every-s", "0"]);
    assert_eq!(
        fs::read(m.point.join("s/latest/f.txt")).unwrap(),
        b"content"
    );
    let manifest = strata::compose::GenView::open(&sc.store, "s", None, "t")
        .unwrap()
        .top()
        .manifest_name
        .clone();
    fs::write(
        sc.st.join(format!("manifests/{manifest}.json")),
        b"{garbage",
    )
    .unwrap();
    let sock = control_socket(&sc.st);
    let r = exchange(
        &sock,
        b"{\"version\":1,\"command\":\"sweep\",\"grace_ms\":0}\n",
    );
    let msg = r[0]["error"]["message"].as_str().unwrap_or_default();
    assert_eq!(r[0]["ok"], false, "{}", r[0]);
    assert!(msg.starts_with("sweep deleted nothing"), "{msg}");
    assert!(msg.contains(&manifest), "names the manifest: {msg}");
    let last = status(&sc.st)["last_sweep"]["error"].clone();
    assert_eq!(last.as_str(), Some(msg), "the outcome is remembered");
    assert_eq!(
        fs::read(m.point.join("s/latest/f.txt")).unwrap(),
        b"content"
    );
}

#[test]
fn a_materialized_older_generation_serves_new_walks_from_its_new_base() {
    use std::io::{Read, Seek};
    let sc = Scratch::new();
    large_delta(&sc.store, &sc.src);
    let at2 = sc.path().join("at2");
    copy_tree(&sc.src, &at2);
    write(&sc.src, "later.txt", b"generation 3");
    sc.commit("s");
    let m = sc.mount_with(&["--no-materialize"]);
    let gen2 = m.point.join("s/gens/2");
    let mut open = fs::File::open(gen2.join("big.bin")).unwrap();
    let held_reps = |g: u64| -> Vec<String> {
        strata::pin::list(&sc.store)
            .unwrap()
            .into_iter()
            .filter(|p| p.generation == g && p.state == strata::pin::PinState::Held)
            .map(|p| p.representation)
            .collect()
    };
    assert_eq!(held_reps(2), vec!["delta".to_string()]);
    let out = materialize_gen(&sc.store, 2);
    assert_eq!(out.state, Some(strata::task::TaskState::Published));
    // The daemon notices within a few refreshes and serves new walks from
    // the base; the open file keeps the delta it was opened from.
    wait_for("the new base served", || {
        let _ = fs::read_dir(&gen2);
        held_reps(2).contains(&"base".to_string())
    });
    diff_r(&at2, &gen2);
    assert!(
        held_reps(2).contains(&"delta".to_string()),
        "the open file's view"
    );
    open.rewind().unwrap();
    let mut all = Vec::new();
    open.read_to_end(&mut all).unwrap();
    assert_eq!(all, fs::read(at2.join("big.bin")).unwrap());
    drop(open);
    wait_for("the old representation released", || {
        fs::write("/proc/sys/vm/drop_caches", "2").unwrap();
        !held_reps(2).contains(&"delta".to_string())
    });
    diff_r(&at2, &gen2);
}

/// `<set>/history/<path>/` lists one link per distinct version, named by
/// generation and readable with `cat` and `diff`; `history/` mirrors the
/// latest generation's directories, and a new version appears after a
/// commit.
#[test]
fn history_lists_the_versions_of_a_path() {
    let sc = Scratch::new();
    for data in [&b"one\n"[..], b"one\n", b"two\n"] {
        write(&sc.src, "d/f.txt", data);
        write(&sc.src, "other", &noise(data.len() as u64, 10));
        sc.commit("s");
    }
    let m = sc.mount();
    keep_listings(&m.point.join("s/gens/1"));
    let versions = m.point.join("s/history/d/f.txt");
    let listed = |p: &Path| -> Vec<String> {
        let mut v: Vec<String> = fs::read_dir(p)
            .unwrap()
            .map(|e| e.unwrap().file_name().into_string().unwrap())
            .collect();
        v.sort();
        v
    };
    assert_eq!(listed(&m.point.join("s/history")), ["d", "other"]);
    assert_eq!(listed(&versions), ["1", "3"]);
    assert_eq!(
        fs::read_link(versions.join("1")).unwrap(),
        Path::new("../../../gens/1/d/f.txt")
    );
    assert_eq!(fs::read(versions.join("1")).unwrap(), b"one\n");
    assert_eq!(fs::read(versions.join("3")).unwrap(), b"two\n");
    let diff = Command::new("diff")
        .arg(versions.join("1"))
        .arg(versions.join("3"))
        .output()
        .unwrap();
    assert_eq!(diff.status.code(), Some(1), "{diff:?}");
    assert!(String::from_utf8_lossy(&diff.stdout).contains("> two"));
    let cat = Command::new("cat")
        .arg(versions.join("3"))
        .output()
        .unwrap();
    assert_eq!(cat.stdout, b"two\n");
    assert!(!versions.join("2").exists());
    assert!(!m.point.join("s/history/nope").exists());

    write(&sc.src, "d/f.txt", b"three\n");
    sc.commit("s");
    wait_for("new version", || versions.join("4").exists());
    wait_for("new version listed", || {
        listed(&versions) == ["1", "3", "4"]
    });
    assert_eq!(fs::read(versions.join("4")).unwrap(), b"three\n");
}

/// The mount is private: no `allow_other`, so another uid is refused by the
/// kernel even where the path leading to it is open to everyone.
#[test]
fn the_mount_is_private_to_the_mounting_user() {
    use std::os::unix::fs::PermissionsExt;
    let sc = Scratch::new();
    write(&sc.src, "f.txt", b"x");
    sc.commit("s");
    let m = sc.mount();
    let open_to_all = fs::Permissions::from_mode(0o711);
    fs::set_permissions(sc.mnt.parent().unwrap(), open_to_all).unwrap();
    let file = m.point.join("s/latest/f.txt");
    assert_eq!(fs::read(&file).unwrap(), b"x");
    let out = Command::new("setpriv")
        .args(["--reuid=65534", "--regid=65534", "--clear-groups", "cat"])
        .arg(&file)
        .output()
        .unwrap();
    assert!(!out.status.success(), "another uid read the mount");
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("Permission denied"), "{err}");
}

/// `metrics` answers Prometheus text: every family has HELP and TYPE, every
/// sample line is `name{labels} value`, and the latest generation of each
/// set is there; `strata metrics` prints it, and says so when no daemon runs.
#[test]
fn metrics_are_prometheus_text() {
    let sc = Scratch::new();
    write(&sc.src, "f.txt", b"x");
    sc.commit("s");
    write(&sc.src, "g.txt", b"y");
    sc.commit("s");
    let strata = |args: &[&str]| {
        Command::new(bin())
            .arg("--store")
            .arg(&sc.st)
            .args(args)
            .output()
            .unwrap()
    };
    let none = strata(&["metrics"]);
    assert_eq!(none.status.code(), Some(5));
    let err = String::from_utf8_lossy(&none.stderr);
    assert!(err.contains("running mount daemon"), "{err}");
    let m = sc.mount();
    assert_eq!(fs::read(m.point.join("s/latest/g.txt")).unwrap(), b"y");
    let reply = exchange(
        &control_socket(&sc.st),
        b"{\"version\":1,\"command\":\"metrics\"}\n",
    );
    let text = reply[0]["result"]["text"].as_str().unwrap().to_string();
    let mut families = std::collections::HashSet::new();
    for line in text.lines() {
        if let Some(rest) = line.strip_prefix("# TYPE ") {
            let (name, kind) = rest.split_once(' ').unwrap();
            assert!(["gauge", "counter"].contains(&kind), "{line}");
            assert!(families.insert(name.to_string()), "{name} declared twice");
        } else if !line.starts_with("# HELP ") {
            let (series, value) = line.rsplit_once(' ').unwrap();
            value.parse::<f64>().unwrap();
            let name = series.split('{').next().unwrap();
            assert!(families.contains(name), "{name} sampled before its TYPE");
        }
    }
    assert!(
        text.contains("strata_set_latest_generation{set=\"s\"} 2"),
        "{text}"
    );
    assert!(text.contains("strata_mountd_pinned_generations "), "{text}");
    let printed = strata(&["metrics"]);
    assert!(printed.status.success(), "{printed:?}");
    assert!(String::from_utf8_lossy(&printed.stdout).contains("strata_mountd_uptime_seconds"));
}

/// Fuzzing of control-socket frames (issue 7): random bytes, random JSON
/// with fields of the wrong types, and requests cut anywhere, sent in
/// batches; every complete line gets one JSON reply and the daemon keeps
/// serving. `STRATA_FUZZ_CASES` sets the number of frames (default 256).
#[test]
fn control_socket_frames_are_fuzzed() {
    let sc = Scratch::new();
    write(&sc.src, "f.txt", b"x");
    sc.commit("s");
    let _m = sc.mount();
    let sock = control_socket(&sc.st);
    let cases: u64 = std::env::var("STRATA_FUZZ_CASES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(256);
    let seed = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_nanos() as u64
        | 1;
    eprintln!("control frame fuzz seed {seed}");
    let mut rng = seed;
    let mut next = move || {
        rng ^= rng << 13;
        rng ^= rng >> 7;
        rng ^= rng << 17;
        rng
    };
    let mut batch = Vec::new();
    let mut lines = 0;
    for i in 0..cases {
        let frame = fuzz_frame(&mut next);
        batch.extend_from_slice(&frame);
        batch.push(b'\n');
        lines += 1;
        if lines == 16 || i + 1 == cases {
            let replies = exchange(&sock, &batch);
            assert_eq!(replies.len(), lines, "seed {seed}: one reply per line");
            for r in &replies {
                assert!(r["ok"].is_boolean(), "seed {seed}: {r}");
            }
            batch.clear();
            lines = 0;
        }
    }
    // A request cut anywhere, then the connection closed: no reply, no harm.
    let whole = br#"{"version":1,"command":"status"}"#;
    for cut in 0..whole.len() {
        assert!(exchange(&sock, &whole[..cut]).is_empty());
    }
    let status = exchange(&sock, b"{\"version\":1,\"command\":\"status\"}\n");
    assert_eq!(status[0]["ok"], true, "seed {seed}: still serving");
}

/// One request line (without its newline) for the control-socket fuzzer.
fn fuzz_frame(next: &mut impl FnMut() -> u64) -> Vec<u8> {
    let commands = [
        "status", "sets", "pins", "tasks", "metrics", "refresh", "nope", "",
    ];
    let values = [
        "1",
        "-1",
        "1e999",
        "18446744073709551616",
        "null",
        "true",
        "\"x\"",
        "[]",
        "{}",
        "[[[[[[[[[[]]]]]]]]]]",
        "\"\\ud800\"",
        "\"s\\u0000\"",
    ];
    let fields = [
        "version",
        "command",
        "set",
        "generation",
        "wait",
        "grace_ms",
        "dry_run",
        "zz",
    ];
    match next() % 4 {
        0 => (0..next() % 200)
            .map(|_| (next() % 255) as u8 + 1)
            .filter(|b| *b != b'\n')
            .collect(),
        1 => {
            let mut parts = vec![
                "\"version\":1".to_string(),
                format!(
                    "\"command\":\"{}\"",
                    commands[next() as usize % commands.len()]
                ),
            ];
            for _ in 0..next() % 4 {
                let f = fields[next() as usize % fields.len()];
                let v = values[next() as usize % values.len()];
                parts.push(format!("\"{f}\":{v}"));
            }
            format!("{{{}}}", parts.join(",")).into_bytes()
        }
        2 => {
            let v = values[next() as usize % values.len()];
            format!("{{\"version\":{v},\"command\":\"status\"}}").into_bytes()
        }
        _ => {
            let mut b = br#"{"version":1,"command":"sets"}"#.to_vec();
            let i = next() as usize % b.len();
            b[i] = (next() % 255) as u8 + 1;
            b.retain(|c| *c != b'\n');
            b
        }
    }
}

/// `Type=notify`: with `$NOTIFY_SOCKET` set, the daemon sends `READY=1` once
/// the mount serves, and `STOPPING=1` when SIGTERM starts the drain.
#[test]
fn a_service_manager_is_told_ready_and_stopping() {
    use std::os::unix::net::UnixDatagram;
    let sc = Scratch::new();
    write(&sc.src, "f.txt", b"x");
    sc.commit("s");
    let notify = sc.path().join("notify.sock");
    let manager = UnixDatagram::bind(&notify).unwrap();
    manager
        .set_read_timeout(Some(Duration::from_secs(30)))
        .unwrap();
    fs::create_dir_all(&sc.mnt).unwrap();
    let child = Command::new(mountd_bin())
        .arg("--store")
        .arg(&sc.st)
        .arg(&sc.mnt)
        .env("NOTIFY_SOCKET", &notify)
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut m = Mount {
        child: Some(child),
        point: sc.mnt.clone(),
    };
    let mut buf = [0u8; 256];
    let n = manager.recv(&mut buf).unwrap();
    assert!(buf[..n].starts_with(b"READY=1"), "{:?}", &buf[..n]);
    assert!(mounted(&sc.mnt), "ready means mounted");
    assert_eq!(fs::read(sc.mnt.join("s/latest/f.txt")).unwrap(), b"x");
    m.signal(libc::SIGTERM);
    let n = manager.recv(&mut buf).unwrap();
    assert_eq!(&buf[..n], b"STOPPING=1");
    let (status, err) = m.wait();
    assert!(status.success(), "{err}");
}

/// Tasks under `tasks/` and compacted ones.
fn live_and_done(store: &Store) -> (Vec<strata::task::TaskRecord>, Vec<strata::task::TaskRecord>) {
    let tasks = strata::task::Tasks::new(store);
    (tasks.list().unwrap().tasks, tasks.compacted().unwrap())
}

/// No PREPARED representation in generation `g` of set `s`.
fn no_prepared(store: &Store, g: u64) -> bool {
    strata::index::GenIndex::new(store, "s")
        .load(g)
        .unwrap()
        .representations
        .iter()
        .all(|r| r.state != strata::format::record::State::Prepared)
}

/// Wait until every task is compacted; the compacted records.
fn all_compacted(store: &Store) -> Vec<strata::task::TaskRecord> {
    wait_for("every task final and compacted", || {
        let (live, done) = live_and_done(store);
        live.is_empty() && !done.is_empty()
    });
    live_and_done(store).1
}

/// Whether process `pid` is stopped (SIGSTOP).
fn stopped(pid: u32) -> bool {
    let stat = fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
    stat.rsplit(") ").next().is_some_and(|s| s.starts_with('T'))
}

#[test]
fn the_scanner_ends_a_task_of_a_set_the_daemon_does_not_serve() {
    let sc = Scratch::new();
    large_delta(&sc.store, &sc.src);
    let other = sc.path().join("other");
    write(&other, "x", b"x");
    commit_gen(&sc.store, "other", &other);
    let o = strata_failing(
        &sc.st,
        &["materialize", "--set", "s", "--in-process"],
        "rep-prepared=kill",
    );
    assert!(!o.status.success());
    write(&sc.src, "d0/f0", b"generation 3");
    sc.commit("s");
    let args = ["--no-materialize", "--task-scan-s", "1", "--set", "other"];
    let _m = sc.mount_with(&args);
    let done = all_compacted(&sc.store);
    assert_eq!(done[0].state, strata::task::TaskState::Published);
    assert!(no_prepared(&sc.store, 2));
    keep_last(&sc.store, 1);
    let plan = strata::retain::plan(&sc.store, "s", strata::token::now_ns()).unwrap();
    assert_eq!(plan.retire, [1, 2], "{plan:?}");
}

#[test]
fn a_daemon_killed_mid_attempt_is_followed_by_one_that_finishes_the_task() {
    let sc = Scratch::new();
    large_delta(&sc.store, &sc.src);
    let policy = ["--materialize-min-rows", "10", "--materialize-ratio", "0.1"];
    let mut m = Mount::start_env(
        &sc.st,
        &sc.mnt,
        &policy,
        &[("STRATA_FAILPOINTS", "folded=kill")],
    );
    let (status, _) = m.wait();
    assert_eq!(
        std::os::unix::process::ExitStatusExt::signal(&status),
        Some(9)
    );
    detach(&sc.mnt);
    let (live, _) = live_and_done(&sc.store);
    assert_eq!(live[0].state, strata::task::TaskState::Claimed);
    write(&sc.src, "d0/f0", b"generation 3");
    sc.commit("s");
    let _m = sc.mount_with(&["--no-materialize", "--task-scan-s", "1"]);
    let done = all_compacted(&sc.store);
    assert_eq!(done[0].state, strata::task::TaskState::Published);
    assert_eq!(done[0].attempt, 2, "taken over");
    assert_eq!(
        reads_from(&sc.store, 2),
        strata::format::manifest::RepKind::Base
    );
}

#[test]
fn shutdown_during_an_attempt_records_its_outcome_and_the_next_daemon_finishes() {
    let sc = Scratch::new();
    large_delta(&sc.store, &sc.src);
    let policy = ["--materialize-min-rows", "10", "--materialize-ratio", "0.1"];
    let mut m = Mount::start_env(
        &sc.st,
        &sc.mnt,
        &policy,
        &[("STRATA_FAILPOINTS", "task-claimed=stop")],
    );
    let pid = m.child.as_ref().unwrap().id();
    wait_for("the attempt paused after its claim", || stopped(pid));
    m.signal(libc::SIGTERM);
    m.signal(libc::SIGCONT);
    let (status, log) = m.wait();
    assert!(status.success(), "{log}");
    let (live, done) = live_and_done(&sc.store);
    let t = live.first().or(done.first()).expect("the task");
    eprintln!("outcome recorded at shutdown: {}", t.state.label());
    match t.state {
        // Cancelled at a checkpoint: due again at once, nothing published.
        strata::task::TaskState::RetryWait => {
            assert!(
                t.last_error.as_deref().unwrap().contains("cancelled"),
                "{t:?}"
            );
            assert_eq!(t.retry_at_ns, Some(t.written_ns));
            assert_eq!(
                reads_from(&sc.store, 2),
                strata::format::manifest::RepKind::Delta
            );
        }
        // Or the attempt was past its last checkpoint and finished.
        strata::task::TaskState::Published => {}
        other => panic!("no outcome recorded: {other:?}\n{log}"),
    }
    let _m = sc.mount_with(&["--no-materialize", "--task-scan-s", "1"]);
    let done = all_compacted(&sc.store);
    assert_eq!(done[0].state, strata::task::TaskState::Published);
    assert_eq!(
        reads_from(&sc.store, 2),
        strata::format::manifest::RepKind::Base
    );
}

#[test]
fn a_control_socket_wait_on_a_foreign_task_ends_within_its_bound() {
    let sc = Scratch::new();
    large_delta(&sc.store, &sc.src);
    let mut foreign = Command::new(bin())
        .args([
            "--store",
            sc.st.to_str().unwrap(),
            "materialize",
            "--set",
            "s",
            "--in-process",
        ])
        .env("STRATA_FAILPOINTS", "task-claimed=stop")
        .spawn()
        .unwrap();
    let pid = foreign.id();
    wait_for("the foreign attempt paused holding its lease", || {
        stopped(pid)
    });
    let _m = sc.mount_with(&["--no-materialize"]);
    let sock = control_socket(&sc.st);
    let waiting = {
        let sock = sock.clone();
        std::thread::spawn(move || {
            let start = Instant::now();
            let r = exchange(
                &sock,
                b"{\"version\":1,\"command\":\"materialize\",\"set\":\"s\",\"wait\":true,\"wait_ms\":1500}\n",
            );
            (r, start.elapsed())
        })
    };
    std::thread::sleep(Duration::from_millis(300));
    let served = exchange(&sock, b"{\"version\":1,\"command\":\"sets\"}\n");
    assert!(
        served[0]["result"].is_array(),
        "served meanwhile: {served:?}"
    );
    assert!(!waiting.is_finished(), "the wait is still running");
    let (reply, took) = waiting.join().unwrap();
    let message = reply[0]["error"]["message"].as_str().unwrap_or_default();
    assert!(message.contains("gave up waiting"), "{reply:?}");
    assert!(took >= Duration::from_millis(1500), "{took:?}");
    // SAFETY: signalling our own child.
    unsafe { libc::kill(pid as i32, libc::SIGKILL) };
    let _ = foreign.wait();
}

/// After `--idle-shed-ms` without a request the daemon drops its cached
/// segments and row groups and trims the allocator; what it serves next is
/// loaded again and is the same.
#[test]
fn an_idle_mount_sheds_its_caches_and_serves_the_same_tree_after() {
    let s = Scratch::new();
    for i in 0..60 {
        write(
            &s.src,
            &format!("d{}/f{i}", i % 6),
            format!("file {i}\n").as_bytes(),
        );
    }
    s.commit("s");
    let mut m = s.mount_with(&["--idle-shed-ms", "200"]);
    let latest = PathBuf::from(format!("{}/", s.mnt.join("s/latest").display()));
    diff_r(&s.src, &latest);
    std::thread::sleep(Duration::from_millis(1500));
    // Names the kernel has not seen: every lookup reaches the daemon.
    diff_r(&s.src, &s.mnt.join("s/gens/1"));
    m.signal(libc::SIGTERM);
    let (_, log) = m.wait();
    assert!(log.contains("caches shed"), "{log}");
}
