//! Materialization as operators run it: folding a delta into a base keeps
//! the generation's identity and bytes, survives a kill at every step, lets
//! exactly one of two racing workers publish, retries injected I/O errors,
//! and gives up on a source that was swept before it was protected.

mod common;

use common::*;
use std::fs;
use std::os::unix::process::ExitStatusExt;
use std::path::{Path, PathBuf};
use std::process::Command;
use strata::compose::GenView;
use strata::failpoint::Step;
use strata::format::manifest::RepKind;

/// A store whose generation 2 is a large delta over generation 1.
fn delta_store(t: &Path) -> (PathBuf, PathBuf) {
    let (src, st) = (t.join("src"), t.join("store"));
    for i in 0..300 {
        write(&src, &format!("d{}/f{i}", i % 9), &noise(i, 700));
    }
    write(&src, "large", &noise(1000, 2 << 20));
    let store = new_store(&st);
    commit_dir(&store, "s", &src);
    for i in (0..300).step_by(3) {
        write(&src, &format!("d{}/f{i}", i % 9), &noise(i + 5000, 900));
    }
    for i in 300..400 {
        write(&src, &format!("new/f{i}"), &noise(i, 100));
    }
    fs::remove_dir_all(src.join("d8")).unwrap();
    commit_dir(&store, "s", &src);
    (src, st)
}

fn representation(st: &Path, generation: u64) -> RepKind {
    let view = GenView::open(
        &strata::Store::open_local(st).unwrap(),
        "s",
        Some(generation),
        "t",
    )
    .unwrap();
    view.top().kind()
}

fn task_json(st: &Path) -> serde_json::Value {
    let out = ok(&strata(st, &["tasks", "--json"]));
    let v: serde_json::Value = serde_json::from_str(&out).unwrap();
    assert_eq!(v.as_array().unwrap().len(), 1, "{v}");
    v[0].clone()
}

fn staging_entries(st: &Path) -> usize {
    fs::read_dir(st.join("staging")).map_or(0, |d| d.count())
}

fn verify_all(st: &Path) {
    let out = ok(&strata(st, &["verify", "--all"]));
    assert!(out.contains("\nok"), "{out}");
}

#[test]
fn materialize_keeps_identity_and_bytes_and_the_next_commit_is_small() {
    let t = tempfile::tempdir().unwrap();
    let (src, st) = delta_store(t.path());
    let store = strata::Store::open_local(&st).unwrap();
    let before = snapshot_gen(&store, "s", Some(2));
    let identity = GenView::open(&store, "s", Some(2), "t")
        .unwrap()
        .pin
        .record
        .identity
        .clone();
    assert_eq!(representation(&st, 2), RepKind::Delta);
    let out = ok(&strata(&st, &["materialize", "--set", "s", "--json"]));
    let o: serde_json::Value = serde_json::from_str(&out).unwrap();
    assert_eq!(o["state"], "PUBLISHED");
    assert_eq!(o["attempt"], 1);
    assert_eq!(representation(&st, 2), RepKind::Base);
    let log: serde_json::Value =
        serde_json::from_str(&ok(&strata(&st, &["log", "--set", "s", "--json"]))).unwrap();
    assert_eq!(log[0]["representation"], "base");
    assert_eq!(log[0]["identity"], identity.as_str());
    assert_eq!(snapshot_gen(&store, "s", Some(2)), before);
    assert_eq!(snapshot_dir(&src), before);
    verify_all(&st);
    // Asked again: nothing to do.
    let again = ok(&strata(&st, &["materialize", "--set", "s"]));
    assert!(again.contains("already reads from a base"), "{again}");
    // The next commit is a small delta over the new base.
    write(&src, "d0/f0", b"one small change");
    settle();
    commit_dir(&store, "s", &src);
    let view = GenView::open(&store, "s", Some(3), "t").unwrap();
    let delta = view.delta.as_ref().expect("a delta");
    assert_eq!(view.base.manifest.generation, 2);
    assert!(
        delta.manifest.counts.rows <= 3,
        "{:?}",
        delta.manifest.counts
    );
    assert_eq!(staging_entries(&st), 0);
}

#[test]
fn a_kill_at_every_step_is_taken_over_or_found_published() {
    for step in Step::MATERIALIZE {
        let t = tempfile::tempdir().unwrap();
        let (_src, st) = delta_store(t.path());
        let store = strata::Store::open_local(&st).unwrap();
        let before = snapshot_gen(&store, "s", Some(2));
        let spec = format!("{}=kill", step.name());
        let o = strata_failing(&st, &["materialize", "--set", "s"], &spec);
        assert_eq!(o.status.signal(), Some(9), "killed at {step}");
        let switched = matches!(step, Step::RepCommitted | Step::ProtectionTransferred);
        let expect = if switched {
            RepKind::Base
        } else {
            RepKind::Delta
        };
        assert_eq!(
            representation(&st, 2),
            expect,
            "readers' selection after a kill at {step}"
        );
        assert_eq!(snapshot_gen(&store, "s", Some(2)), before, "{step}");
        let out = ok(&strata(&st, &["materialize", "--set", "s", "--json"]));
        let o: serde_json::Value = serde_json::from_str(&out).unwrap();
        assert_eq!(o["state"], "PUBLISHED", "{step}");
        assert_eq!(o["attempt"], 2, "taken over with attempt + 1 after {step}");
        assert_eq!(representation(&st, 2), RepKind::Base, "{step}");
        assert_eq!(snapshot_gen(&store, "s", Some(2)), before, "{step}");
        assert_eq!(staging_entries(&st), 0, "dead staging removed after {step}");
        verify_all(&st);
    }
}

#[test]
fn two_racing_workers_publish_exactly_once() {
    let t = tempfile::tempdir().unwrap();
    let (_src, st) = delta_store(t.path());
    let spawn = || {
        Command::new(bin())
            .arg("--store")
            .arg(&st)
            .args(["materialize", "--set", "s", "--wait", "--json"])
            .output()
    };
    let (a, b) = std::thread::scope(|s| {
        let a = s.spawn(spawn);
        let b = s.spawn(spawn);
        (a.join().unwrap().unwrap(), b.join().unwrap().unwrap())
    });
    for o in [&a, &b] {
        let v: serde_json::Value = serde_json::from_str(&ok(o)).unwrap();
        assert_eq!(v["state"], "PUBLISHED");
    }
    // Generation 2's records: PREPARED and COMMITTED by the commit, then one
    // PREPARED and one COMMITTED representation by the single publisher.
    let records = fs::read_dir(st.join("sets/s/index"))
        .unwrap()
        .filter(|e| {
            let e = e.as_ref().unwrap();
            e.file_name()
                .to_string_lossy()
                .starts_with("00000000000000000002.")
        })
        .count();
    assert_eq!(records, 4);
    let task = task_json(&st);
    assert_eq!(task["state"], "PUBLISHED");
    assert_eq!(task["attempt"], 1, "one attempt did the work");
    verify_all(&st);
}

#[test]
fn injected_io_errors_wait_and_retry_then_succeed() {
    for errno in ["eio", "enospc"] {
        let t = tempfile::tempdir().unwrap();
        let (_src, st) = delta_store(t.path());
        let spec = format!("folded={errno}");
        let o = strata_failing(&st, &["materialize", "--set", "s"], &spec);
        assert_eq!(o.status.code(), Some(5), "{errno}");
        let task = task_json(&st);
        assert_eq!(task["state"], "RETRY_WAIT");
        assert_eq!(task["attempt"], 1);
        assert!(
            task["last_error"].as_str().unwrap().contains("failpoint"),
            "{task}"
        );
        assert_eq!(representation(&st, 2), RepKind::Delta);
        assert_eq!(
            staging_entries(&st),
            0,
            "a failed attempt removes its staging"
        );
        // Within the retry delay a second worker stands back (a starved test
        // thread may already be past it; then the retry simply runs).
        let busy = strata(&st, &["materialize", "--set", "s"]);
        assert!(matches!(busy.status.code(), Some(0 | 4)), "{busy:?}");
        let out = ok(&strata(
            &st,
            &["materialize", "--set", "s", "--wait", "--json"],
        ));
        let v: serde_json::Value = serde_json::from_str(&out).unwrap();
        assert_eq!(v["state"], "PUBLISHED");
        assert_eq!(v["attempt"], 2);
        verify_all(&st);
    }
}

#[test]
fn a_source_swept_before_protection_retires_the_task() {
    let t = tempfile::tempdir().unwrap();
    let (_src, st) = delta_store(t.path());
    let planned = ok(&strata(
        &st,
        &["materialize", "--set", "s", "--plan", "--json"],
    ));
    let planned: serde_json::Value = serde_json::from_str(&planned).unwrap();
    assert_eq!(planned["state"], "PLANNED");
    let task = task_json(&st);
    let delta = GenView::open(&strata::Store::open_local(&st).unwrap(), "s", Some(2), "t")
        .unwrap()
        .top()
        .manifest
        .segments[0]
        .name
        .clone();
    let seg = st.join(strata::store::keys::segment(&delta));
    fs::remove_file(&seg).unwrap();
    let o = strata(&st, &["materialize", "--set", "s", "--json"]);
    assert_eq!(
        o.status.code(),
        Some(1),
        "{}",
        String::from_utf8_lossy(&o.stderr)
    );
    let v: serde_json::Value = serde_json::from_str(&String::from_utf8_lossy(&o.stdout)).unwrap();
    assert_eq!(v["state"], "SOURCE_RETIRED");
    assert_eq!(task_json(&st)["id"], task["id"]);
    // Asked again, a new task finds the source still gone.
    let again = strata(&st, &["materialize", "--set", "s", "--json"]);
    assert_eq!(again.status.code(), Some(1), "the source is still gone");
    assert_eq!(staging_entries(&st), 0);
    let id = task["id"].as_str().unwrap();
    let ended = strata(&st, &["tasks", "--cancel", id]);
    assert_eq!(
        ended.status.code(),
        Some(4),
        "a final task is not cancelled"
    );
}

#[test]
fn a_cancelled_task_changes_nothing_and_a_new_one_can_follow() {
    let t = tempfile::tempdir().unwrap();
    let (_src, st) = delta_store(t.path());
    ok(&strata(&st, &["materialize", "--set", "s", "--plan"]));
    let id = task_json(&st)["id"].as_str().unwrap().to_string();
    ok(&strata(&st, &["tasks", "--cancel", &id]));
    assert_eq!(task_json(&st)["state"], "CANCELLED");
    assert_eq!(representation(&st, 2), RepKind::Delta);
    verify_all(&st);
    // The cancelled task keeps its evidence; the next request plans anew.
    let out = ok(&strata(&st, &["materialize", "--set", "s", "--json"]));
    let v: serde_json::Value = serde_json::from_str(&out).unwrap();
    assert_eq!(v["state"], "PUBLISHED");
    assert_eq!(v["task"], format!("{id}-r2"));
    let all: serde_json::Value =
        serde_json::from_str(&ok(&strata(&st, &["tasks", "--json"]))).unwrap();
    let states: Vec<&str> = all
        .as_array()
        .unwrap()
        .iter()
        .map(|t| t["state"].as_str().unwrap())
        .collect();
    assert_eq!(states, ["CANCELLED", "PUBLISHED"]);
    assert_eq!(representation(&st, 2), RepKind::Base);
    verify_all(&st);
}

#[test]
fn mostly_dead_packs_are_rewritten_and_dropped_from_the_new_base() {
    let t = tempfile::tempdir().unwrap();
    let (src, st, store, old_packs) = mostly_dead_packs(t.path());
    let before = snapshot_gen(&store, "s", Some(2));
    ok(&strata(&st, &["materialize", "--set", "s"]));
    let view = GenView::open(&store, "s", Some(2), "t").unwrap();
    assert_eq!(view.top().kind(), RepKind::Base);
    let packs: Vec<&String> = view.base.manifest.packs.iter().map(|p| &p.name).collect();
    for old in &old_packs {
        assert!(!packs.contains(&old), "pack {old} (20% live) was rewritten");
    }
    assert_eq!(snapshot_gen(&store, "s", Some(2)), before);
    assert_eq!(snapshot_dir(&src), before);
    verify_all(&st);
}
