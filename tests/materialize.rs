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
    let id = planned_task(&st);
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

/// Generation 2's newest index record has no PREPARED representation.
fn no_prepared_rep(st: &Path, generation: u64) -> bool {
    let store = strata::Store::open_local(st).unwrap();
    let r = strata::index::GenIndex::new(&store, "s")
        .load(generation)
        .unwrap();
    r.representations
        .iter()
        .all(|x| x.state != strata::format::record::State::Prepared)
}

/// Generation 2's (delta) manifest.
fn delta_manifest(store: &strata::Store) -> String {
    let view = GenView::open(store, "s", Some(2), "t").unwrap();
    view.top().manifest_name.clone()
}

/// Commit a change as generation 3, superseding generation 2.
fn commit_generation_3(store: &strata::Store, src: &Path) {
    write(src, "d0/f0", b"generation 3");
    settle();
    commit_dir(store, "s", src);
}

/// Plan the materialization of latest; the task's id.
fn planned_task(st: &Path) -> String {
    ok(&strata(st, &["materialize", "--set", "s", "--plan"]));
    task_json(st)["id"].as_str().unwrap().to_string()
}

/// Run one recovery scan; its JSON report.
fn recover(st: &Path) -> serde_json::Value {
    let o = strata(st, &["tasks", "--recover", "--json"]);
    serde_json::from_slice(&o.stdout)
        .unwrap_or_else(|e| panic!("{e}: {}", String::from_utf8_lossy(&o.stderr)))
}

fn gen_dir_exists(st: &Path, manifest: &str) -> bool {
    st.join(strata::store::keys::manifest(manifest)).exists()
}

/// The reproduction at every step: a kill leaves a task behind,
/// the generation is superseded; one recovery scan ends every task, then
/// retention retires the generation and sweeps reclaim its delta.
#[test]
fn after_a_kill_at_every_step_a_scan_ends_the_task_and_retention_retires_the_generation() {
    for step in Step::MATERIALIZE {
        let t = tempfile::tempdir().unwrap();
        let (src, st) = delta_store(t.path());
        let store = strata::Store::open_local(&st).unwrap();
        let delta = delta_manifest(&store);
        let spec = format!("{}=kill", step.name());
        let o = strata_failing(&st, &["materialize", "--set", "s", "--in-process"], &spec);
        assert_eq!(o.status.signal(), Some(9), "killed at {step}");
        commit_generation_3(&store, &src);
        let report = recover(&st);
        assert_eq!(report["scanned"], 1, "{step}: {report}");
        let state = report["tasks"][0]["state"].as_str().unwrap();
        assert_eq!(state, "PUBLISHED", "{step}: {report}");
        assert!(no_prepared_rep(&st, 2), "{step}");
        // A second scan compacts the final task: nothing is left under tasks/.
        let again = recover(&st);
        assert_eq!(again["tasks"][0]["action"], "compacted", "{step}: {again}");
        assert_eq!(recover(&st)["scanned"], 0, "{step}");
        assert_eq!(fs::read_dir(st.join("tasks")).unwrap().count(), 0, "{step}");
        let all: serde_json::Value =
            serde_json::from_str(&ok(&strata(&st, &["tasks", "--all", "--json"]))).unwrap();
        assert_eq!(all[0]["state"], "PUBLISHED", "{step}: {all}");
        let kept = ok(&strata(&st, &["retain", "--set", "s", "--keep-last", "1"]));
        assert!(
            kept.contains("kept: 3") && !kept.contains("kept: 2"),
            "{step}: {kept}"
        );
        for _ in 0..2 {
            ok(&strata(&st, &["sweep", "--grace", "0s"]));
        }
        assert!(
            !gen_dir_exists(&st, &delta),
            "{step}: the old delta is reclaimed"
        );
        assert_eq!(staging_entries(&st), 0, "{step}");
        verify_all(&st);
    }
}

/// Attempt `n` of a task failing after its PREPARED representation.
fn fail_after_prepared(st: &Path) -> std::process::Output {
    strata_failing(
        st,
        &["materialize", "--set", "s", "--wait=30s", "--json"],
        "rep-prepared=eio",
    )
}

#[test]
fn a_fifth_failure_after_rep_prepared_withdraws_the_representation() {
    let t = tempfile::tempdir().unwrap();
    let (_src, st) = delta_store(t.path());
    for attempt in 1..=strata::task::MAX_ATTEMPTS {
        let o = fail_after_prepared(&st);
        let task = task_json(&st);
        assert_eq!(task["attempt"], attempt, "{o:?}");
        if attempt < strata::task::MAX_ATTEMPTS {
            assert_eq!(o.status.code(), Some(5), "{o:?}");
            assert_eq!(task["state"], "RETRY_WAIT");
            assert!(!no_prepared_rep(&st, 2), "PREPARED until the task ends");
        }
    }
    let task = task_json(&st);
    assert_eq!(task["state"], "FAILED", "{task}");
    assert!(task["last_error"].as_str().unwrap().contains("failpoint"));
    assert!(
        no_prepared_rep(&st, 2),
        "a failed task leaves no PREPARED representation"
    );
    assert_eq!(representation(&st, 2), RepKind::Delta);
    let plan = ok(&strata(
        &st,
        &["retain", "--set", "s", "--keep-last", "1", "--dry-run"],
    ));
    assert!(!plan.contains("materializing"), "{plan}");
    verify_all(&st);
}

#[test]
fn cancelling_a_task_waiting_after_rep_prepared_withdraws_the_representation() {
    let t = tempfile::tempdir().unwrap();
    let (_src, st) = delta_store(t.path());
    let o = fail_after_prepared(&st);
    assert_eq!(o.status.code(), Some(5), "{o:?}");
    let task = task_json(&st);
    assert_eq!(task["state"], "RETRY_WAIT");
    assert!(!no_prepared_rep(&st, 2));
    ok(&strata(
        &st,
        &["tasks", "--cancel", task["id"].as_str().unwrap()],
    ));
    assert_eq!(task_json(&st)["state"], "CANCELLED");
    assert!(no_prepared_rep(&st, 2));
    assert_eq!(representation(&st, 2), RepKind::Delta);
    verify_all(&st);
}

#[test]
fn a_bounded_wait_ends_with_exit_4_and_the_admission_refusal_is_recorded() {
    let t = tempfile::tempdir().unwrap();
    let (_src, st) = delta_store(t.path());
    let o = strata_failing(&st, &["materialize", "--set", "s"], "folded=eio");
    assert_eq!(o.status.code(), Some(5), "{o:?}");
    // Within the retry delay (500 ms), a 1 ms wait runs out.
    let o = strata(&st, &["materialize", "--set", "s", "--wait=1ms"]);
    let err = String::from_utf8_lossy(&o.stderr);
    assert_eq!(o.status.code(), Some(4), "{err}");
    assert!(err.contains("gave up waiting"), "{err}");
    // A store size limit below what the fold writes: refused before the
    // claim, recorded with a backoff (no new attempt is counted).
    let before = task_json(&st)["record"].as_u64().unwrap();
    std::thread::sleep(std::time::Duration::from_millis(600));
    ok(&strata(&st, &["budget", "--max-store", "1K"]));
    let o = strata(&st, &["materialize", "--set", "s"]);
    assert_eq!(o.status.code(), Some(5), "{o:?}");
    let task = task_json(&st);
    assert_eq!(task["state"], "RETRY_WAIT", "{task}");
    assert_eq!(task["attempt"], 1, "{task}");
    assert_eq!(task["record"].as_u64().unwrap(), before + 1, "{task}");
    assert!(
        task["last_error"].as_str().unwrap().contains("storage gap"),
        "{task}"
    );
    assert!(task["retry_at_ns"].as_i64().unwrap() > task["written_ns"].as_i64().unwrap());
}

#[test]
fn a_corrupt_task_record_is_reported_holds_back_only_its_sources_and_is_quarantined() {
    let t = tempfile::tempdir().unwrap();
    let (src, st) = delta_store(t.path());
    let store = strata::Store::open_local(&st).unwrap();
    let delta = delta_manifest(&store);
    let id = planned_task(&st);
    let bad = st.join(strata::store::keys::task_record(&id, 2));
    fs::write(&bad, b"{ not a task record").unwrap();
    commit_generation_3(&store, &src);
    ok(&strata(&st, &["retain", "--set", "s", "--keep-last", "1"]));
    let listed = strata(&st, &["tasks"]);
    let err = String::from_utf8_lossy(&listed.stderr);
    assert!(
        err.contains("corrupt task record") && err.contains("000002.json"),
        "{err}"
    );
    let status = ok(&strata(&st, &["status"]));
    assert!(status.contains("corrupt task record"), "{status}");
    for _ in 0..2 {
        let out = ok(&strata(&st, &["sweep", "--grace", "0s"]));
        assert!(
            out.contains("000002.json"),
            "the sweep says what it holds back: {out}"
        );
    }
    assert!(gen_dir_exists(&st, &delta), "held back: the task's source");
    let q = ok(&strata(&st, &["tasks", "--quarantine", &id]));
    assert!(q.contains("2 record(s) moved"), "{q}");
    assert!(st
        .join(format!("tasks-quarantine/{id}/000002.json"))
        .exists());
    assert!(String::from_utf8_lossy(&strata(&st, &["tasks"]).stderr).is_empty());
    for _ in 0..2 {
        let out = ok(&strata(&st, &["sweep", "--grace", "0s"]));
        assert!(!out.contains("000002.json"), "{out}");
    }
    assert!(!gen_dir_exists(&st, &delta), "reclaimed once quarantined");
    verify_all(&st);
}

#[test]
fn a_readable_task_is_not_quarantined() {
    let t = tempfile::tempdir().unwrap();
    let (_src, st) = delta_store(t.path());
    let id = planned_task(&st);
    let o = strata(&st, &["tasks", "--quarantine", &id]);
    assert_eq!(o.status.code(), Some(2), "{o:?}");
}

#[test]
fn compacted_records_go_after_their_keep_period_and_a_resurrection_is_refused() {
    let t = tempfile::tempdir().unwrap();
    let (_src, st) = delta_store(t.path());
    ok(&strata(&st, &["materialize", "--set", "s"]));
    recover(&st);
    let store = strata::Store::open_local(&st).unwrap();
    let tasks = strata::task::Tasks::new(&store);
    let done = tasks.compacted().unwrap();
    assert_eq!(done.len(), 1);
    assert!(tasks.list().unwrap().tasks.is_empty());
    // A writer that read an older record while the chain was deleted.
    let mut stale = done[0].clone();
    stale.record = 1;
    stale.state = strata::task::TaskState::Planned;
    let e = tasks.put(&stale).unwrap_err();
    assert_eq!(e.kind(), strata::ErrorKind::Conflict, "{e}");
    assert!(tasks.list().unwrap().tasks.is_empty(), "taken back");
    let now = strata::token::now_ns();
    assert_eq!(
        tasks.remove_expired(strata::task::DONE_KEEP, now).unwrap(),
        0
    );
    assert_eq!(
        tasks
            .remove_expired(std::time::Duration::ZERO, now + 1)
            .unwrap(),
        1
    );
    assert!(tasks.compacted().unwrap().is_empty());
}

#[test]
fn a_task_with_no_readable_record_holds_back_its_generation_named_by_its_id() {
    let t = tempfile::tempdir().unwrap();
    let (src, st) = delta_store(t.path());
    let store = strata::Store::open_local(&st).unwrap();
    let delta = delta_manifest(&store);
    let id = planned_task(&st);
    assert_eq!(
        strata::task::target_of_id(&store, &id).unwrap(),
        [("s".to_string(), 2)]
    );
    fs::write(st.join(strata::store::keys::task_record(&id, 1)), b"\xff").unwrap();
    commit_generation_3(&store, &src);
    ok(&strata(&st, &["retain", "--set", "s", "--keep-last", "1"]));
    for _ in 0..2 {
        let out = ok(&strata(&st, &["sweep", "--grace", "0s"]));
        assert!(out.contains("held back"), "{out}");
    }
    assert!(
        gen_dir_exists(&st, &delta),
        "held back by the id's generation"
    );
    ok(&strata(&st, &["tasks", "--quarantine", &id]));
    for _ in 0..2 {
        ok(&strata(&st, &["sweep", "--grace", "0s"]));
    }
    assert!(!gen_dir_exists(&st, &delta));
}
