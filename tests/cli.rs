//! The `strata` binary as users and operators drive it: crashes at every
//! durability step, injected I/O errors, corruption, contention, bad input.

mod common;

use common::*;
use std::fs;
use std::os::unix::process::ExitStatusExt;
use std::path::Path;
use std::process::{Command, Output};
use strata::failpoint::Step;

fn latest(store: &Path, set: &str) -> u64 {
    let out = ok(&strata(store, &["log", "--set", set, "--json"]));
    let v: serde_json::Value = serde_json::from_str(&out).unwrap();
    v[0]["generation"].as_u64().unwrap()
}

fn setup(t: &Path) -> (std::path::PathBuf, std::path::PathBuf) {
    let (src, st) = (t.join("src"), t.join("store"));
    for i in 0..40 {
        write(&src, &format!("d{}/f{i}", i % 4), &noise(i, 2000));
    }
    write(&src, "large", &noise(99, 3 << 20));
    ok(&strata(&st, &["init"]));
    ok(&strata(
        &st,
        &["commit", "--set", "s", src.to_str().unwrap()],
    ));
    (src, st)
}

/// `setup`, then a second generation with one file changed; the store.
fn two_generations(t: &Path) -> std::path::PathBuf {
    let (src, st) = setup(t);
    write(&src, "d0/f0", b"changed");
    ok(&strata(
        &st,
        &["commit", "--set", "s", src.to_str().unwrap()],
    ));
    st
}

fn verify_clean(st: &Path) {
    let out = ok(&strata(st, &["verify", "--all"]));
    assert!(out.contains("\nok"), "{out}");
}

#[test]
fn kill_at_every_durability_step_keeps_the_last_committed_generation() {
    for step in Step::COMMIT {
        let t = tempfile::tempdir().unwrap();
        let (src, st) = setup(t.path());
        write(&src, "d1/f1", b"changed before the crash");
        // An edit inside the chunked file: most of its chunks stay shared.
        let mut large = noise(99, 3 << 20);
        large[1 << 20..(1 << 20) + 4096].copy_from_slice(&noise(100, 4096));
        large.splice(2 << 20..2 << 20, noise(101, 4096));
        write(&src, "large", &large);
        let spec = format!("{}=kill", step.name());
        let o = strata_env(
            &st,
            &["commit", "--set", "s", src.to_str().unwrap()],
            ("STRATA_FAILPOINTS", &spec),
        );
        assert_eq!(
            o.status.signal(),
            Some(9),
            "step {step} must be reached and kill the child"
        );
        let visible = latest(&st, "s");
        let committed_before_kill =
            matches!(step, Step::Committed | Step::LatestAdvanced | Step::Cleaned);
        assert_eq!(
            visible,
            if committed_before_kill { 2 } else { 1 },
            "after kill at {step}"
        );
        verify_clean(&st);
        write(&src, "d2/f2", b"next commit");
        ok(&strata(
            &st,
            &["commit", "--set", "s", src.to_str().unwrap()],
        ));
        assert_eq!(
            latest(&st, "s"),
            visible + 1,
            "next commit after kill at {step}"
        );
        verify_clean(&st);
        let got = ok(&strata(&st, &["cat", "--set", "s", "d2/f2"]));
        assert_eq!(got, "next commit");
        assert!(
            fs::read_dir(st.join("staging")).unwrap().all(|e| !e
                .unwrap()
                .file_name()
                .to_string_lossy()
                .ends_with(".owner")),
            "residue cleaned after {step}"
        );
    }
}

#[test]
fn injected_io_errors_at_every_step_fail_cleanly() {
    for errno in ["eio", "enospc", "exdev"] {
        for step in [
            Step::BlobsDurable,
            Step::JournalSealed,
            Step::SegmentsWritten,
            Step::ManifestWritten,
            Step::Prepared,
        ] {
            let t = tempfile::tempdir().unwrap();
            let (src, st) = setup(t.path());
            write(&src, "d0/f0", b"changed");
            let spec = format!("{}={errno}", step.name());
            let o = strata_env(
                &st,
                &["commit", "--set", "s", src.to_str().unwrap()],
                ("STRATA_FAILPOINTS", &spec),
            );
            assert_eq!(o.status.code(), Some(5), "{step}={errno}");
            let err = String::from_utf8_lossy(&o.stderr);
            assert!(err.contains(step.name()), "error names the step: {err}");
            assert_eq!(latest(&st, "s"), 1);
            verify_clean(&st);
            ok(&strata(
                &st,
                &["commit", "--set", "s", src.to_str().unwrap()],
            ));
            assert_eq!(latest(&st, "s"), 2);
        }
    }
}

fn flip_byte(path: &Path, at: usize) {
    let mut b = fs::read(path).unwrap();
    let i = at.min(b.len() - 1);
    b[i] ^= 0x40;
    fs::write(path, b).unwrap();
}

/// Offset of a packed file's frame inside its pack.
fn frame_offset(st: &Path, path: &[u8]) -> usize {
    let store = strata::Store::open_local(st).unwrap();
    let view = strata::compose::GenView::open(&store, "s", None, "test").unwrap();
    match view.lookup(path).unwrap().unwrap().blob {
        strata::row::BlobLoc::Packed { offset, .. } => offset as usize,
        other => panic!("not packed: {other:?}"),
    }
}

#[test]
fn a_flipped_byte_anywhere_is_caught_by_verify_and_by_cat() {
    for what in ["segments", "packs", "chunks", "chunklists", "manifests"] {
        let t = tempfile::tempdir().unwrap();
        let (_src, st) = setup(t.path());
        let at = match what {
            "packs" => frame_offset(&st, b"d1/f1") + 1,
            // Inside the first extent of a list of one or two.
            "chunklists" => 30,
            _ => 100,
        };
        for f in files_under(&st.join(what)) {
            flip_byte(&f, at);
        }
        let v = strata(&st, &["verify", "--all"]);
        assert_eq!(
            v.status.code(),
            Some(1),
            "verify must fail for corrupt {what}"
        );
        assert!(
            String::from_utf8_lossy(&v.stdout).contains("PROBLEM"),
            "{what}"
        );
        let target = match what {
            "chunks" | "chunklists" => "large",
            _ => "d1/f1",
        };
        let c = strata(&st, &["cat", "--set", "s", target]);
        assert!(!c.status.success(), "cat must refuse corrupt {what}");
        assert!(
            c.stdout.is_empty(),
            "no bytes of a corrupt {what} are served"
        );
        assert!(
            String::from_utf8_lossy(&c.stderr).contains("corrupt"),
            "{what}: {}",
            String::from_utf8_lossy(&c.stderr)
        );
    }
}

#[test]
fn newer_formats_are_refused_with_a_clear_message() {
    let t = tempfile::tempdir().unwrap();
    let (_src, st) = setup(t.path());
    let marker = fs::read_to_string(st.join("STORE")).unwrap();
    fs::write(
        st.join("STORE"),
        marker.replace("\"version\": 1", "\"version\": 9"),
    )
    .unwrap();
    let o = strata(&st, &["log", "--set", "s"]);
    assert_eq!(o.status.code(), Some(2));
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(
        err.contains("newer format") && err.contains("found=9"),
        "{err}"
    );
}

#[test]
fn oversized_pointer_is_refused_before_it_is_read() {
    let t = tempfile::tempdir().unwrap();
    let (_src, st) = setup(t.path());
    let f = fs::OpenOptions::new()
        .write(true)
        .open(st.join("sets/s/LATEST"))
        .unwrap();
    f.set_len(2 << 20).unwrap();
    let o = strata(&st, &["log", "--set", "s"]);
    let out = String::from_utf8_lossy(&o.stdout);
    assert!(
        out.contains("COMMITTED"),
        "log lists records without the hint: {out}"
    );
    let o = strata(&st, &["ls", "--set", "s"]);
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(!o.status.success() && err.contains("too large"), "{err}");
}

#[test]
fn oversized_manifest_is_refused_before_it_is_read() {
    let t = tempfile::tempdir().unwrap();
    let (_src, st) = setup(t.path());
    for m in files_under(&st.join("manifests")) {
        fs::OpenOptions::new()
            .write(true)
            .open(&m)
            .unwrap()
            .set_len(65 << 20)
            .unwrap();
    }
    for args in [
        &["ls", "--set", "s"][..],
        &["cat", "--set", "s", "d0/f0"][..],
    ] {
        let o = strata(&st, args);
        let err = String::from_utf8_lossy(&o.stderr);
        assert!(
            !o.status.success() && err.contains("too large") && err.contains("limit=67108864"),
            "{err}"
        );
    }
    let v = strata(&st, &["verify"]);
    assert_eq!(v.status.code(), Some(1));
}

#[test]
fn a_second_commit_fails_fast_naming_the_holder_or_waits() {
    use strata::storage::{Storage, TryLease};
    let t = tempfile::tempdir().unwrap();
    let (src, st) = setup(t.path());
    write(&src, "d0/f0", b"x");
    let storage = strata::storage::LocalStorage::new(&st);
    let TryLease::Acquired(lease) = storage
        .lease("sets/s/WRITER.lease", "test-holder pid=42", false)
        .unwrap()
    else {
        panic!()
    };
    let o = strata(&st, &["commit", "--set", "s", src.to_str().unwrap()]);
    assert_eq!(o.status.code(), Some(4));
    assert!(String::from_utf8_lossy(&o.stderr).contains("test-holder pid=42"));
    let child = Command::new(bin())
        .arg("--store")
        .arg(&st)
        .args(["commit", "--wait", "--set", "s", src.to_str().unwrap()])
        .spawn()
        .unwrap();
    std::thread::sleep(std::time::Duration::from_millis(300));
    drop(lease);
    let out = child.wait_with_output().unwrap();
    assert!(out.status.success());
    assert_eq!(latest(&st, "s"), 2);
}

#[test]
fn bad_paths_and_names_are_refused() {
    let t = tempfile::tempdir().unwrap();
    let (src, st) = setup(t.path());
    let o = strata(
        &st,
        &[
            "commit",
            "--set",
            "s",
            "--prefix",
            "../etc",
            src.to_str().unwrap(),
        ],
    );
    assert_eq!(o.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&o.stderr).contains(".."));
    let o = strata(&st, &["cat", "--set", "s", "d0/../../x"]);
    assert_eq!(o.status.code(), Some(2));
    let o = strata(&st, &["commit", "--set", "Bad/Name", src.to_str().unwrap()]);
    assert_eq!(o.status.code(), Some(2));
    let long = "x".repeat(300);
    let o = strata(&st, &["cat", "--set", "s", &long]);
    assert!(String::from_utf8_lossy(&o.stderr).contains("name is too large"));
}

#[test]
fn unreadable_files_fail_the_commit_unless_skipped() {
    let t = tempfile::tempdir().unwrap();
    let (src, st) = (t.path().join("src"), t.path().join("store"));
    write(&src, "ok", b"fine");
    write(&src, "secret", b"no access");
    ok(&strata(&st, &["init"]));
    chmod(&src, "secret", 0o000);
    Command::new("chown")
        .args(["-R", "65534:65534"])
        .arg(t.path())
        .status()
        .unwrap();
    let as_nobody = |extra: &[&str]| {
        let mut c = Command::new("setpriv");
        c.args([
            "--reuid=65534",
            "--regid=65534",
            "--clear-groups",
            bin(),
            "--store",
        ])
        .arg(&st)
        .args(["commit", "--set", "u"])
        .args(extra)
        .arg(&src);
        c.output().unwrap()
    };
    let o = as_nobody(&[]);
    assert_eq!(
        o.status.code(),
        Some(5),
        "{}",
        String::from_utf8_lossy(&o.stderr)
    );
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(
        err.contains("secret") && err.contains("nothing was published"),
        "{err}"
    );
    assert!(
        !strata(&st, &["log", "--set", "u"]).status.success(),
        "no generation was published"
    );
    let o = as_nobody(&["--skip-unreadable"]);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    assert!(String::from_utf8_lossy(&o.stderr).contains("skipped unreadable: secret"));
    let ls = ok(&strata(&st, &["ls", "--set", "u"]));
    assert!(ls.contains("ok") && !ls.contains("secret"), "{ls}");
}

#[test]
fn an_unworkable_sort_budget_is_refused_before_the_commit_starts() {
    let t = tempfile::tempdir().unwrap();
    let (src, st) = (t.path().join("src"), t.path().join("store"));
    write(&src, "f", b"x");
    ok(&strata(&st, &["init"]));
    let refused = |extra: &[&str], says: &str| {
        let mut args = vec!["commit", "--set", "s"];
        args.extend_from_slice(extra);
        args.push(src.to_str().unwrap());
        let o = strata(&st, &args);
        let err = String::from_utf8_lossy(&o.stderr);
        assert_eq!(o.status.code(), Some(2), "{err}");
        assert!(
            err.contains("invalid sort budget") && err.contains(says),
            "{err}"
        );
    };
    refused(&["--sort-fan-in", "1"], "fan_in=1");
    refused(&["--sort-fan-in", "0"], "fan-in is under 2");
    refused(&["--sort-memory", "0"], "memory budget is zero");
    assert!(
        !strata(&st, &["log", "--set", "s"]).status.success(),
        "nothing was published"
    );
    let o = strata(
        &st,
        &[
            "commit",
            "--set",
            "s",
            "--sort-fan-in",
            "2",
            "--sort-memory",
            "1",
            src.to_str().unwrap(),
        ],
    );
    ok(&o);
    assert_eq!(latest(&st, "s"), 1, "the smallest workable budget commits");
}

#[test]
fn commit_json_and_log_json_have_the_documented_fields() {
    let t = tempfile::tempdir().unwrap();
    let (src, st) = setup(t.path());
    write(&src, "d0/f0", b"y");
    let out = ok(&strata(
        &st,
        &[
            "commit",
            "--set",
            "s",
            "--json",
            "-m",
            "msg",
            src.to_str().unwrap(),
        ],
    ));
    let v: serde_json::Value = serde_json::from_str(&out).unwrap();
    assert_eq!(v["generation"], 2);
    assert_eq!(v["changed"], 1);
    let log: serde_json::Value =
        serde_json::from_str(&ok(&strata(&st, &["log", "--set", "s", "--json"]))).unwrap();
    for key in [
        "generation",
        "representation",
        "base",
        "identity",
        "files",
        "bytes",
        "message",
    ] {
        assert!(log[0].get(key).is_some(), "log --json lacks {key}");
    }
    assert_eq!(log[0]["representation"], "delta");
    assert_eq!(log[0]["base"], 1);
    let diff: serde_json::Value = serde_json::from_str(&ok(&strata(
        &st,
        &["diff", "--set", "s", "1", "2", "--json"],
    )))
    .unwrap();
    assert_eq!(
        diff.as_array()
            .unwrap()
            .iter()
            .filter(|e| e["change"] == "changed" && e["path"] == "d0/f0")
            .count(),
        1
    );
}

#[test]
fn mount_returns_when_ready_and_unmount_reports_a_busy_mount() {
    let daemon = Path::new(bin()).with_file_name("strata-mountd");
    assert!(
        daemon.exists(),
        "build the whole workspace first (cargo test --workspace): {}",
        daemon.display()
    );
    let t = tempfile::tempdir().unwrap();
    let (src, st) = setup(t.path());
    let mnt = t.path().join("mnt");
    fs::create_dir(&mnt).unwrap();
    let out = ok(&strata(&st, &["mount", mnt.to_str().unwrap()]));
    assert!(out.contains("mounted"), "{out}");
    assert_eq!(
        fs::read(mnt.join("s/latest/d1/f1")).unwrap(),
        fs::read(src.join("d1/f1")).unwrap()
    );
    let mut sleeper = Command::new("sleep")
        .arg("30")
        .current_dir(mnt.join("s/gens/1"))
        .spawn()
        .unwrap();
    let busy = strata(&st, &["unmount", mnt.to_str().unwrap()]);
    assert_eq!(busy.status.code(), Some(4));
    let err = String::from_utf8_lossy(&busy.stderr);
    assert!(
        err.contains(&format!("pid {} sleep", sleeper.id())),
        "holder is named: {err}"
    );
    sleeper.kill().unwrap();
    sleeper.wait().unwrap();
    ok(&strata(&st, &["unmount", mnt.to_str().unwrap()]));
    let start = std::time::Instant::now();
    while fs::read_dir(st.join("pins/s"))
        .map(|d| d.count())
        .unwrap_or(0)
        > 0
    {
        assert!(
            start.elapsed() < std::time::Duration::from_secs(10),
            "daemon released its pins"
        );
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    ok(&strata(&st, &["tag", "--set", "s", "v1"]));
    ok(&strata(&st, &["sweep", "--grace", "0s"]));
    assert_private(&st);
}

/// A scratch store with `setup`'s generation committed through the CLI,
/// and an empty mount point.
fn mount_scratch() -> Scratch {
    let sc = Scratch::new();
    setup(sc.path());
    fs::create_dir(&sc.mnt).unwrap();
    sc
}

#[test]
fn mount_runs_the_fuse_threads_asked_for_and_refuses_none() {
    let sc = mount_scratch();
    let m = sc.mnt.to_str().unwrap();
    let zero = strata(&sc.st, &["mount", "--threads", "0", m]);
    assert_eq!(zero.status.code(), Some(2), "a usage error");
    let err = String::from_utf8_lossy(&zero.stderr);
    assert!(err.contains("--threads"), "{err}");
    let pid = mounted_pid(&ok(&strata(&sc.st, &["mount", "--threads", "2", m])));
    // The daemon reports ready once mounted; the kernel queues requests until
    // the workers start, so they may appear a moment after `mount` returns.
    // Over io_uring the threads serve the kernel's per-CPU queues (at least
    // one each), and one more reads `/dev/fuse` for forgets.
    let (kind, want): (fn(&str) -> bool, usize) = match uring_queues() {
        Some(queues) => (ring_thread, queues * (2 / queues).max(1)),
        None => (device_thread, 2),
    };
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    while fuse_threads(pid, kind) < want && std::time::Instant::now() < deadline {
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    assert_eq!(fuse_threads(pid, kind), want);
    ok(&strata(&sc.st, &["unmount", m]));
}

/// The kernel's FUSE queues (one per possible CPU) when the daemon takes
/// FUSE over io_uring (`RingHost`).
fn uring_queues() -> Option<usize> {
    let taken = RingHost::now().taken();
    let possible = fs::read_to_string("/sys/devices/system/cpu/possible").ok()?;
    let count = possible.trim().split(',').try_fold(0, |n, part| {
        let (lo, hi) = part.split_once('-').unwrap_or((part, part));
        Some(n + hi.parse::<usize>().ok()? - lo.parse::<usize>().ok()? + 1)
    })?;
    taken.then_some(count)
}

/// A `/dev/fuse` reader: `fuser-N`.
fn device_thread(name: &str) -> bool {
    name.strip_prefix("fuser-")
        .is_some_and(|n| n.bytes().all(|b| b.is_ascii_digit()))
}

/// A ring queue's server: `fuser-qQ-K`.
fn ring_thread(name: &str) -> bool {
    name.starts_with("fuser-q")
}

/// How many of the process's threads `kind` names.
fn fuse_threads(pid: i32, kind: fn(&str) -> bool) -> usize {
    fs::read_dir(format!("/proc/{pid}/task"))
        .unwrap()
        .filter_map(|t| fs::read_to_string(t.unwrap().path().join("comm")).ok())
        .filter(|comm| kind(comm.trim()))
        .count()
}

fn kill_and_reap(pid: i32) {
    // SAFETY: signalling a daemon this test started.
    unsafe { libc::kill(pid, libc::SIGKILL) };
    wait_exited(pid);
}

#[test]
fn mount_and_unmount_recover_a_dead_mount_and_refuse_a_served_one() {
    let sc = mount_scratch();
    let m = sc.mnt.to_str().unwrap();
    let pid = mounted_pid(&ok(&strata(&sc.st, &["mount", m])));
    let twice = strata(&sc.st, &["mount", m]);
    let err = String::from_utf8_lossy(&twice.stderr);
    assert!(!twice.status.success());
    assert!(
        err.contains(&format!("already mounted: strata-mountd pid {pid} serves")),
        "{err}"
    );
    kill_and_reap(pid);
    let gone = strata(&sc.st, &["unmount", m]);
    assert!(gone.status.success(), "{gone:?}");
    assert!(String::from_utf8_lossy(&gone.stderr).contains("is gone"));
    assert!(fs::read_dir(&sc.mnt).unwrap().next().is_none(), "detached");
    kill_and_reap(mounted_pid(&ok(&strata(&sc.st, &["mount", m]))));
    let again = strata(&sc.st, &["mount", m]);
    assert!(again.status.success(), "{again:?}");
    assert!(String::from_utf8_lossy(&again.stderr).contains("detached the stale mount"));
    assert_eq!(
        fs::read(sc.mnt.join("s/latest/d1/f1")).unwrap(),
        fs::read(sc.src.join("d1/f1")).unwrap()
    );
    ok(&strata(&sc.st, &["unmount", m]));
}

/// Nothing under a store (objects, index, pins, leases, sockets, logs) is
/// open to group or others.
fn assert_private(st: &Path) {
    use std::os::unix::fs::PermissionsExt;
    let mut stack = vec![st.to_path_buf()];
    let mut seen = 0;
    while let Some(p) = stack.pop() {
        let md = fs::symlink_metadata(&p).unwrap();
        let mode = md.permissions().mode() & 0o777;
        assert_eq!(mode & 0o077, 0, "{} has mode {mode:o}", p.display());
        seen += 1;
        if md.is_dir() {
            stack.extend(fs::read_dir(&p).unwrap().map(|e| e.unwrap().path()));
        }
    }
    assert!(seen > 10, "walked {seen} paths");
}

#[test]
fn pins_lists_holders_and_tells_held_from_unheld() {
    let t = tempfile::tempdir().unwrap();
    let (src, st) = setup(t.path());
    let mut reader = Command::new("bash")
        .arg("-c")
        .arg(format!(
            "exec {} --store {} cat --set s large | (sleep 30; cat >/dev/null)",
            bin(),
            st.display()
        ))
        .spawn()
        .unwrap();
    let start = std::time::Instant::now();
    let held = loop {
        let v: serde_json::Value =
            serde_json::from_str(&ok(&strata(&st, &["pins", "--json"]))).unwrap();
        if let Some(p) = v.as_array().unwrap().iter().find(|p| p["state"] == "held") {
            break p.clone();
        }
        assert!(
            start.elapsed() < std::time::Duration::from_secs(10),
            "no held pin appeared"
        );
        std::thread::sleep(std::time::Duration::from_millis(20));
    };
    assert_eq!(
        (
            held["set"].as_str(),
            held["generation"].as_u64(),
            held["representation"].as_str()
        ),
        (Some("s"), Some(1), Some("base"))
    );
    assert!(
        held["holder"].as_str().unwrap().starts_with("cat pid="),
        "{held}"
    );
    Command::new("pkill")
        .args(["-KILL", "-P"])
        .arg(reader.id().to_string())
        .status()
        .unwrap();
    reader.kill().unwrap();
    reader.wait().unwrap();
    let start = std::time::Instant::now();
    loop {
        let out = ok(&strata(&st, &["pins"]));
        if out.contains("unheld") || out.lines().count() == 1 {
            break;
        }
        assert!(
            start.elapsed() < std::time::Duration::from_secs(10),
            "pin still held: {out}"
        );
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    drop(src);
}

#[test]
fn tags_name_committed_generations_and_refuse_to_move_silently() {
    let t = tempfile::tempdir().unwrap();
    let st = two_generations(t.path());
    ok(&strata(&st, &["tag", "--set", "s", "--gen", "1", "v1.0"]));
    ok(&strata(&st, &["tag", "--set", "s", "--gen", "1", "v1.0"]));
    let moved = strata(&st, &["tag", "--set", "s", "--gen", "2", "v1.0"]);
    assert_eq!(moved.status.code(), Some(4), "moving a tag is a conflict");
    assert!(String::from_utf8_lossy(&moved.stderr).contains("untag it first"));
    ok(&strata(&st, &["tag", "--set", "s", "newest"]));
    let listed: serde_json::Value =
        serde_json::from_str(&ok(&strata(&st, &["tags", "--set", "s", "--json"]))).unwrap();
    let pairs: Vec<(String, u64)> = listed
        .as_array()
        .unwrap()
        .iter()
        .map(|t| {
            let name = t["name"].as_str().unwrap().to_string();
            (name, t["generation"].as_u64().unwrap())
        })
        .collect();
    assert_eq!(pairs, [("newest".into(), 2), ("v1.0".into(), 1)]);
    for bad in ["../x", ".hidden", "a/b", ""] {
        let o = strata(&st, &["tag", "--set", "s", bad]);
        assert_eq!(o.status.code(), Some(2), "tag name {bad:?}");
    }
    let missing = strata(&st, &["tag", "--set", "s", "--gen", "9", "nine"]);
    assert_ne!(missing.status.code(), Some(0));
    ok(&strata(&st, &["untag", "--set", "s", "v1.0"]));
    assert_eq!(
        strata(&st, &["untag", "--set", "s", "v1.0"]).status.code(),
        Some(5)
    );
    ok(&strata(&st, &["tag", "--set", "s", "--gen", "2", "v1.0"]));
}

#[test]
fn a_relative_store_path_works() {
    let t = tempfile::tempdir().unwrap();
    write(t.path(), "src/f", b"x");
    let run = |args: &[&str]| {
        Command::new(bin())
            .current_dir(t.path())
            .args(["--store", "st"])
            .args(args)
            .output()
            .unwrap()
    };
    ok(&run(&["init"]));
    ok(&run(&["commit", "--set", "s", "src"]));
    assert_eq!(ok(&run(&["cat", "--set", "s", "f"])), "x");
}

/// `strata history` lists one line per distinct version, newest first, each
/// under the oldest committed generation holding it: a rewrite with equal
/// bytes is not a version, a removal is a gap, and a retired generation's
/// version is listed where it can still be read.
#[test]
fn history_lists_each_distinct_version_of_a_path() {
    let t = tempfile::tempdir().unwrap();
    let (src, st) = (t.path().join("src"), t.path().join("store"));
    ok(&strata(&st, &["init"]));
    let commit = |data: Option<&[u8]>| {
        match data {
            Some(d) => write(&src, "d/f", d),
            None => drop(fs::remove_file(src.join("d/f"))),
        }
        write(&src, "other", &noise(latest_or_zero(&st), 10));
        ok(&strata(
            &st,
            &["commit", "--set", "s", src.to_str().unwrap()],
        ));
    };
    commit(Some(b"one")); // 1
    commit(Some(b"one")); // 2: same bytes, new mtime
    commit(Some(b"two")); // 3
    commit(None); // 4: removed
    commit(Some(b"three")); // 5
    commit(Some(b"three")); // 6
    let out = ok(&strata(&st, &["history", "--set", "s", "d/f", "--json"]));
    let v: serde_json::Value = serde_json::from_str(&out).unwrap();
    let gens: Vec<u64> = v
        .as_array()
        .unwrap()
        .iter()
        .map(|e| e["generation"].as_u64().unwrap())
        .collect();
    assert_eq!(gens, [5, 3, 1], "{out}");
    assert_eq!(v[0]["size"], 5);
    assert_eq!(v[2]["digest"], hex::encode(blake3::hash(b"one").as_bytes()));
    for (g, data) in [(5, "three"), (3, "two"), (1, "one")] {
        let cat = ok(&strata(
            &st,
            &["cat", "--set", "s", "--gen", &g.to_string(), "d/f"],
        ));
        assert_eq!(cat, data);
    }
    let table = ok(&strata(&st, &["history", "--set", "s", "d/f"]));
    assert!(
        table.starts_with("GEN") && table.lines().count() == 4,
        "{table}"
    );

    // Generation 1 retired: its version is now listed under generation 2,
    // which still holds it.
    ok(&strata(&st, &["retain", "--set", "s", "--keep-last", "5"]));
    let out = ok(&strata(&st, &["history", "--set", "s", "d/f", "--json"]));
    let v: serde_json::Value = serde_json::from_str(&out).unwrap();
    assert_eq!(v[2]["generation"], 2, "{out}");

    let missing = strata(&st, &["history", "--set", "s", "nope"]);
    assert_eq!(missing.status.code(), Some(5), "{missing:?}");
    assert!(String::from_utf8_lossy(&missing.stderr).contains("path not found"));
    let escape = strata(&st, &["history", "--set", "s", "../etc/passwd"]);
    assert_eq!(escape.status.code(), Some(2), "{escape:?}");
    let no_set = strata(&st, &["history", "--set", "t", "d/f"]);
    assert!(
        String::from_utf8_lossy(&no_set.stderr).contains("set not found"),
        "{no_set:?}"
    );
}

fn latest_or_zero(st: &Path) -> u64 {
    let out = strata(st, &["log", "--set", "s", "--json"]);
    serde_json::from_slice::<serde_json::Value>(&out.stdout)
        .ok()
        .and_then(|v| v[0]["generation"].as_u64())
        .unwrap_or(0)
}

/// Completions and man pages come from the CLI definition: every command
/// is in them, with its flags.
#[test]
fn completions_and_man_pages_are_generated() {
    let t = tempfile::tempdir().unwrap();
    let st = t.path().join("store");
    for shell in ["bash", "zsh", "fish"] {
        let out = ok(&strata(&st, &["completions", shell]));
        assert!(
            out.contains("history") && out.contains("keep-last"),
            "{shell}"
        );
    }
    let bad = strata(&st, &["completions", "cmd.exe"]);
    assert_eq!(bad.status.code(), Some(2));
    let man = t.path().join("man");
    ok(&strata(&st, &["manpages", man.to_str().unwrap()]));
    let page = fs::read_to_string(man.join("strata-commit.1")).unwrap();
    assert!(
        page.contains(".TH STRATA-COMMIT") && page.contains("skip\\-unreadable"),
        "{page}"
    );
    assert!(man.join("strata.1").exists() && man.join("strata-history.1").exists());
}

/// A tmpfs of `mib` MiB mounted at `at` for one test, detached on drop.
struct Tmpfs(std::path::PathBuf);

impl Tmpfs {
    fn mount(at: &Path, mib: u64) -> Tmpfs {
        fs::create_dir_all(at).unwrap();
        let size = format!("size={mib}m");
        let out = Command::new("mount")
            .args(["-t", "tmpfs", "-o", &size, "tmpfs"])
            .arg(at)
            .output()
            .unwrap();
        assert!(out.status.success(), "mount tmpfs: {out:?}");
        Tmpfs(at.to_path_buf())
    }
}

impl Drop for Tmpfs {
    fn drop(&mut self) {
        let _ = Command::new("umount").arg("-l").arg(&self.0).status();
    }
}

/// Disk budget on a real small filesystem: a commit that would cross the
/// free-space floor is refused with a storage-gap error before it writes
/// the blob, a store size limit likewise, and with no floor a real ENOSPC
/// mid-write fails the commit the same way. Each time nothing is
/// published, no staging is left, verify passes, and the next commit that
/// fits lands.
#[test]
fn a_full_disk_is_refused_or_fails_cleanly() {
    let t = tempfile::tempdir().unwrap();
    let disk = Tmpfs::mount(&t.path().join("fs"), 24);
    let (src, st) = (t.path().join("src"), disk.0.join("store"));
    write(&src, "small", &noise(1, 1000));
    ok(&strata(&st, &["init"]));
    let commit = || strata(&st, &["commit", "--set", "s", src.to_str().unwrap()]);
    ok(&commit());
    let unchanged = |out: Output| {
        assert_eq!(out.status.code(), Some(5), "{out:?}");
        assert_eq!(latest(&st, "s"), 1);
        verify_clean(&st);
        let staging = fs::read_dir(st.join("staging")).map_or(0, |d| d.count());
        assert_eq!(staging, 0, "no staging left");
        String::from_utf8_lossy(&out.stderr).to_string()
    };
    write(&src, "big1", &noise(2, 12 << 20));
    ok(&strata(&st, &["budget", "--min-free", "16M"]));
    let err = unchanged(commit());
    assert!(
        err.contains("storage gap") && err.contains("free-space floor"),
        "{err}"
    );
    ok(&strata(
        &st,
        &["budget", "--min-free", "0", "--max-store", "4M"],
    ));
    let err = unchanged(commit());
    assert!(err.contains("store size limit"), "{err}");
    // No budget, and another process fills the disk: the commit's own
    // writes meet a real ENOSPC.
    ok(&strata(&st, &["budget", "--max-store", "none"]));
    fs::remove_file(src.join("big1")).unwrap();
    write(&src, "more", &noise(3, 60 << 10));
    // Where exactly the commit's writes stop fitting depends on the
    // filesystem's accounting, so the room left grows 4 KiB at a time: the
    // budget refuses while the blob alone does not fit, then the real
    // ENOSPC comes from a later write of the same commit.
    let filler = disk.0.join("filler");
    let mut enospc = 0;
    for room in (64u64..256).step_by(4) {
        let free = available(&disk.0);
        fs::write(&filler, vec![0u8; (free - (room << 10)) as usize]).unwrap();
        let out = commit();
        fs::remove_file(&filler).unwrap();
        if out.status.success() {
            break;
        }
        let err = unchanged(out);
        assert!(
            err.contains("storage gap") || err.contains("No space left on device"),
            "{err}"
        );
        enospc += usize::from(err.contains("No space left on device"));
    }
    assert!(enospc > 0, "a real ENOSPC was met");
    if latest(&st, "s") == 1 {
        ok(&commit());
    }
    assert_eq!(latest(&st, "s"), 2);
    verify_clean(&st);
    // A materialization is admitted before it claims its task; the refusal
    // is recorded in the task (a backoff, no attempt counted).
    ok(&strata(&st, &["budget", "--max-store", "1K"]));
    let fold = strata(&st, &["materialize", "--set", "s", "--in-process"]);
    assert_eq!(fold.status.code(), Some(5), "{fold:?}");
    assert!(String::from_utf8_lossy(&fold.stderr).contains("storage gap"));
    let tasks = ok(&strata(&st, &["tasks"]));
    assert!(
        tasks.contains("RETRY_WAIT") && tasks.contains("storage gap"),
        "{tasks}"
    );
    ok(&strata(&st, &["budget", "--max-store", "none"]));
    ok(&strata(
        &st,
        &["materialize", "--set", "s", "--in-process", "--wait"],
    ));
    verify_clean(&st);
}

/// Bytes available to us on the filesystem holding `dir` (`df`).
fn available(dir: &Path) -> u64 {
    let out = Command::new("df")
        .args(["--output=avail", "-B1"])
        .arg(dir)
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    text.lines().nth(1).unwrap().trim().parse().unwrap()
}

/// `strata status` shows per set: latest, generations, base and delta
/// sizes and the delta ratio, held pins and open tasks.
#[test]
fn status_shows_each_set_with_its_delta_ratio() {
    let t = tempfile::tempdir().unwrap();
    let st = two_generations(t.path());
    let set = |st: &Path| -> serde_json::Value {
        let v: serde_json::Value =
            serde_json::from_str(&ok(&strata(st, &["status", "--json"]))).unwrap();
        v["sets"][0].clone()
    };
    let s = set(&st);
    assert_eq!(
        (s["set"].as_str(), s["latest"].as_u64()),
        (Some("s"), Some(2))
    );
    assert_eq!(s["generations"], 2);
    assert_eq!(s["base_rows"], 46, "{s}");
    assert!(s["delta_rows"].as_u64().unwrap() >= 1, "{s}");
    assert!(s["delta_ratio"].as_f64().unwrap() > 0.0, "{s}");
    let table = ok(&strata(&st, &["status"]));
    assert!(
        table.contains("RATIO") && table.contains("46 rows"),
        "{table}"
    );
    ok(&strata(&st, &["materialize", "--set", "s", "--in-process"]));
    let s = set(&st);
    assert_eq!(
        (s["delta_rows"].as_u64(), s["base_rows"].as_u64()),
        (Some(0), Some(46))
    );
}

/// Issue 7's bar: every command explains bad input — a missing store, an
/// unknown set or generation, a bad flag, and a daemon that is not running
/// — in one line naming what is wrong, with a non-zero exit.
#[test]
fn every_command_explains_bad_input() {
    let t = tempfile::tempdir().unwrap();
    let (_src, st) = setup(t.path());
    let missing = t.path().join("nowhere");
    let expect = |store: &Path, args: &[&str], code: i32, says: &str| {
        let out = strata(store, args);
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(code), "{args:?}: {err}");
        assert!(err.contains(says), "{args:?} should say `{says}`: {err}");
    };
    for args in [
        &["log", "--set", "s"][..],
        &["sets"],
        &["status"],
        &["verify"],
        &["sweep", "--dry-run"],
        &["budget"],
    ] {
        expect(
            &missing,
            args,
            2,
            "no strata store here (run `strata init`)",
        );
    }
    for args in [
        &["log", "--set", "nope"][..],
        &["ls", "--set", "nope"],
        &["cat", "--set", "nope", "x"],
        &["history", "--set", "nope", "x"],
        &["tags", "--set", "nope"],
        &["tag", "--set", "nope", "v1"],
        &["materialize", "--set", "nope", "--in-process"],
    ] {
        expect(&st, args, 5, "not found");
    }
    for args in [
        &["cat", "--set", "s", "--gen", "99", "large"][..],
        &["ls", "--set", "s", "--gen", "99"],
        &["diff", "--set", "s", "1", "99"],
        &["tag", "--set", "s", "--gen", "99", "v1"],
        &["verify", "--set", "s", "--gen", "99"],
    ] {
        expect(&st, args, 5, "generation not found: name=`s@99`");
    }
    expect(
        &st,
        &["log", "--sett", "s"],
        2,
        "tip: a similar argument exists: '--set'",
    );
    expect(
        &st,
        &["retain", "--set", "s", "--keep-last", "x"],
        2,
        "invalid value 'x'",
    );
    expect(&st, &["metrics"], 5, "running mount daemon");
    let plain = t.path().join("plain");
    fs::create_dir(&plain).unwrap();
    expect(&st, &["unmount", plain.to_str().unwrap()], 2, "not mounted");
}

/// The JSON summary of a commit of `src` into set `s`.
fn commit_json(st: &Path, src: &Path, extra: &[&str]) -> serde_json::Value {
    let mut args = vec!["commit", "--set", "s", "--json"];
    args.extend_from_slice(extra);
    args.push(src.to_str().unwrap());
    serde_json::from_str(&ok(&strata(st, &args))).unwrap()
}

/// A store whose first commit of `src` was killed once its journal was
/// sealed; (src, store).
fn killed_after_seal(t: &Path) -> (std::path::PathBuf, std::path::PathBuf) {
    let (src, st) = (t.join("src"), t.join("store"));
    for i in 0..40 {
        write(&src, &format!("d{}/f{i}", i % 4), &noise(i, 2000));
    }
    write(&src, "large", &noise(99, 3 << 20));
    settle();
    ok(&strata(&st, &["init"]));
    let o = strata_failing(
        &st,
        &["commit", "--set", "s", src.to_str().unwrap()],
        "journal-sealed=kill",
    );
    assert_eq!(o.status.signal(), Some(9));
    (src, st)
}

fn resumable(st: &Path) -> Vec<serde_json::Value> {
    let status: serde_json::Value =
        serde_json::from_str(&ok(&strata(st, &["status", "--json"]))).unwrap();
    status["resumable_journals"].as_array().unwrap().clone()
}

#[test]
fn an_interrupted_commit_resumes_from_its_sealed_journal_reading_nothing_again() {
    let t = tempfile::tempdir().unwrap();
    let (src, st) = killed_after_seal(t.path());
    let listed = resumable(&st);
    assert_eq!(listed.len(), 1, "{listed:?}");
    assert_eq!(listed[0]["generation"], 1);
    // Sweeps keep what the journal names while it is resumable.
    for _ in 0..2 {
        ok(&strata(&st, &["sweep", "--grace", "0s"]));
    }
    let s = commit_json(&st, &src, &[]);
    assert_eq!(s["resumed_from"], listed[0]["token"], "{s}");
    assert_eq!(s["hashed_files"], 0, "{s}");
    assert_eq!(s["resumed_files"], 41, "{s}");
    assert_eq!(s["generation"], 1);
    verify_clean(&st);
    let store = strata::Store::open_local(&st).unwrap();
    assert!(snapshot_gen(&store, "s", Some(1)) == snapshot_dir(&src));
    assert!(resumable(&st).is_empty(), "the resumed journal is gone");
    assert_eq!(fs::read_dir(st.join("journals/s")).unwrap().count(), 0);
}

#[test]
fn resuming_reads_again_exactly_the_files_whose_stat_changed() {
    let t = tempfile::tempdir().unwrap();
    let (src, st) = killed_after_seal(t.path());
    write(&src, "d1/f1", b"changed after the crash");
    write(&src, "d2/new", b"new after the crash");
    let s = commit_json(&st, &src, &[]);
    assert!(s["resumed_from"].is_string(), "{s}");
    assert_eq!(s["hashed_files"], 2, "{s}");
    verify_clean(&st);
    let got = ok(&strata(&st, &["cat", "--set", "s", "d1/f1"]));
    assert_eq!(got, "changed after the crash");
    let store = strata::Store::open_local(&st).unwrap();
    assert!(snapshot_gen(&store, "s", Some(1)) == snapshot_dir(&src));
}

#[test]
fn no_resume_starts_fresh_and_a_journal_on_an_older_parent_is_dropped() {
    let t = tempfile::tempdir().unwrap();
    let (src, st) = killed_after_seal(t.path());
    let s = commit_json(&st, &src, &["--no-resume"]);
    assert!(s["resumed_from"].is_null(), "{s}");
    assert_eq!(s["hashed_files"], 41, "{s}");
    // The dead journal was observed on no parent; generation 1 exists now.
    assert!(resumable(&st).is_empty());
    write(&src, "d0/f0", b"next");
    let s = commit_json(&st, &src, &[]);
    assert!(s["resumed_from"].is_null(), "{s}");
    assert_eq!(fs::read_dir(st.join("journals/s")).unwrap().count(), 0);
    verify_clean(&st);
}

#[test]
fn an_unsealed_journal_is_never_resumed() {
    let t = tempfile::tempdir().unwrap();
    let (src, st) = (t.path().join("src"), t.path().join("store"));
    write(&src, "a", b"a");
    settle();
    ok(&strata(&st, &["init"]));
    let o = strata_failing(
        &st,
        &["commit", "--set", "s", src.to_str().unwrap()],
        "blobs-durable=kill",
    );
    assert_eq!(o.status.signal(), Some(9));
    assert!(resumable(&st).is_empty());
    let s = commit_json(&st, &src, &[]);
    assert!(s["resumed_from"].is_null(), "{s}");
    assert_eq!(s["hashed_files"], 1, "{s}");
    verify_clean(&st);
}
