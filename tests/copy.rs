//! `strata copy`: generations replicated local → S3 (the suite's SeaweedFS)
//! → local with equal identities and clean verifies, an incremental copy
//! that sends exactly the objects a commit added, and copies racing commits
//! on both sides that lose nothing.

mod common;

use common::*;
use std::fs;
use std::path::Path;
use std::process::Output;

fn json(out: &str) -> serde_json::Value {
    serde_json::from_str(out).unwrap()
}

/// `(generation, identity)` of every generation of `set`, by `strata log`.
fn identities(o: &Output) -> Vec<(u64, String)> {
    let v = json(&ok(o));
    v.as_array()
        .unwrap()
        .iter()
        .map(|g| {
            let n = g["generation"].as_u64().unwrap();
            (n, g["identity"].as_str().unwrap().to_string())
        })
        .collect()
}

/// Content-named objects of a local store.
fn objects(store: &Path) -> usize {
    [
        "manifests",
        "segments",
        "packs",
        "blobs",
        "chunks",
        "chunklists",
    ]
    .iter()
    .map(|d| count_files(&store.join(d)))
    .sum()
}

fn count_files(dir: &Path) -> usize {
    let Ok(entries) = fs::read_dir(dir) else {
        return 0;
    };
    entries
        .map(|e| e.unwrap().path())
        .map(|p| if p.is_dir() { count_files(&p) } else { 1 })
        .sum()
}

/// The CLI on the local store `st` with the S3 test server's options (for
/// a `--to` on S3, whose cache goes under `s3_dir`).
fn strata_to_s3(st: &Path, s3_dir: &Path, args: &[&str]) -> Output {
    let flags = s3_flags(s3_dir, &s3_dir.join("cache"));
    // --s3-endpoint URL --allow-http, and --lease-ttl D.
    let s3: Vec<&String> = flags[2..5].iter().chain(&flags[7..9]).collect();
    std::process::Command::new(bin())
        .env("XDG_CACHE_HOME", s3_dir.join("cache"))
        .arg("--store")
        .arg(st)
        .args(s3)
        .args(args)
        .output()
        .unwrap()
}

#[test]
fn a_set_copied_local_to_s3_to_local_keeps_its_identities_and_sends_only_what_is_new() {
    let s = Scratch::new();
    write(&s.src, "a/one", b"first\n");
    write(&s.src, "big", &noise(7, 3 << 20));
    let src = s.src.to_str().unwrap();
    ok(&strata(&s.st, &["commit", "--set", "t", src]));
    write(&s.src, "a/two", b"second\n");
    ok(&strata(&s.st, &["commit", "--set", "t", src]));
    ok(&strata(
        &s.st,
        &["tag", "--set", "t", "--gen", "1", "first"],
    ));
    let s3 = s.path().join("bucket");
    let url = s3_url(&s3);
    let sent = json(&ok(&strata_to_s3(
        &s.st,
        &s3,
        &["copy", "--to", &url, "--json"],
    )));
    assert_eq!(sent["sets"][0]["copied"], serde_json::json!([1, 2]));
    assert_eq!(sent["sets"][0]["tags"], 1);
    let back = s.path().join("back");
    let local = s.path().join("s3-host");
    ok(&strata_s3(
        &s3,
        &local,
        &["copy", "--to", back.to_str().unwrap()],
    ));
    let log = ["log", "--set", "t", "--json"];
    let want = identities(&strata(&s.st, &log));
    assert_eq!(identities(&strata_s3(&s3, &local, &log)), want);
    assert_eq!(identities(&strata(&back, &log)), want);
    ok(&strata(&s.st, &["verify", "--all"]));
    ok(&strata_s3(&s3, &local, &["verify", "--all"]));
    ok(&strata(&back, &["verify", "--all"]));
    assert!(ok(&strata(&back, &["tags", "--set", "t"])).contains("first"));
    let restored = s.path().join("restored");
    ok(&strata(
        &back,
        &["restore", "--set", "t", restored.to_str().unwrap()],
    ));
    assert_eq!(snapshot_dir(&restored), snapshot_dir(&s.src));

    // One more commit: the next copy sends exactly the objects it added.
    let before = objects(&s.st);
    write(&s.src, "a/three", b"third\n");
    ok(&strata(&s.st, &["commit", "--set", "t", src]));
    let added = objects(&s.st) - before;
    let again = json(&ok(&strata_to_s3(
        &s.st,
        &s3,
        &["copy", "--to", &url, "--json"],
    )));
    assert_eq!(again["sets"][0]["copied"], serde_json::json!([3]));
    assert_eq!(
        again["objects_sent"].as_u64().unwrap() as usize,
        added,
        "{again}"
    );
    let idle = json(&ok(&strata_to_s3(
        &s.st,
        &s3,
        &["copy", "--to", &url, "--json"],
    )));
    assert_eq!(idle["objects_sent"], 0);
    assert_eq!(idle["sets"][0]["present"], 3);
}

#[test]
fn copies_racing_commits_on_either_side_lose_nothing() {
    let s = Scratch::new();
    let target = s.path().join("target");
    let to = target.to_str().unwrap().to_string();
    write(&s.src, "f0", b"0\n");
    ok(&strata(
        &s.st,
        &["commit", "--set", "t", s.src.to_str().unwrap()],
    ));
    std::thread::scope(|scope| {
        let committer = scope.spawn(|| {
            for i in 1..6 {
                write(&s.src, &format!("f{i}"), format!("{i}\n").as_bytes());
                ok(&strata(
                    &s.st,
                    &["commit", "--set", "t", "--wait", s.src.to_str().unwrap()],
                ));
            }
        });
        for _ in 0..6 {
            ok(&strata(&s.st, &["copy", "--to", &to]));
        }
        committer.join().unwrap();
    });
    ok(&strata(&s.st, &["copy", "--to", &to]));
    let log = ["log", "--set", "t", "--json"];
    let source = identities(&strata(&s.st, &log));
    assert_eq!(source.len(), 6);
    assert_eq!(identities(&strata(&target, &log)), source);

    // A commit of the target's own races the next copies: whichever wins,
    // both stores keep every generation they committed.
    let own = s.path().join("own");
    write(&own, "mine", b"the target's own\n");
    write(&s.src, "f6", b"6\n");
    ok(&strata(
        &s.st,
        &["commit", "--set", "t", s.src.to_str().unwrap()],
    ));
    let (copied, committed) = std::thread::scope(|scope| {
        let copy = scope.spawn(|| strata(&s.st, &["copy", "--to", &to]));
        let commit = strata(
            &target,
            &["commit", "--set", "t", "--wait", own.to_str().unwrap()],
        );
        (copy.join().unwrap(), commit)
    });
    ok(&committed);
    let after = identities(&strata(&target, &log));
    match copied.status.success() {
        // The copy went first: the target's commit is generation 8 on top.
        true => assert_eq!(after.len(), 8),
        // The commit went first: generation 7 is the target's own, and the
        // copy refused the diverged set without writing.
        false => {
            let err = String::from_utf8_lossy(&copied.stderr);
            assert!(err.contains("diverged"), "{err}");
            assert_eq!(after.len(), 7);
        }
    }
    assert_eq!(after[after.len() - 6..], source[..]);
    ok(&strata(&s.st, &["verify", "--all"]));
    ok(&strata(&target, &["verify", "--all"]));
    let refused = strata(&s.st, &["copy", "--to", &to]);
    assert!(!refused.status.success());
    assert!(String::from_utf8_lossy(&refused.stderr).contains("diverged"));
}

#[test]
fn a_copy_killed_before_publishing_leaves_nothing_visible_and_a_rerun_sends_no_object_twice() {
    let s = Scratch::new();
    write(&s.src, "a", b"one\n");
    write(&s.src, "big", &noise(3, 2 << 20));
    ok(&strata(
        &s.st,
        &["commit", "--set", "t", s.src.to_str().unwrap()],
    ));
    let target = s.path().join("target");
    let to = target.to_str().unwrap();
    let killed = strata_failing(&s.st, &["copy", "--to", to], "copy-sent=kill");
    assert_eq!(
        std::os::unix::process::ExitStatusExt::signal(&killed.status),
        Some(libc::SIGKILL)
    );
    let sent = objects(&target);
    assert_eq!(sent, objects(&s.st), "every object went over");
    let log = ["log", "--set", "t", "--json"];
    assert!(
        !strata(&target, &log).status.success() || identities(&strata(&target, &log)).is_empty()
    );
    ok(&strata(&target, &["verify", "--all"]));
    let rerun = json(&ok(&strata(&s.st, &["copy", "--to", to, "--json"])));
    assert_eq!(rerun["objects_sent"], 0, "{rerun}");
    assert_eq!(rerun["sets"][0]["copied"], serde_json::json!([1]));
    assert_eq!(
        identities(&strata(&target, &log)),
        identities(&strata(&s.st, &log))
    );
}
