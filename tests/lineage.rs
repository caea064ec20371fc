//! Lineage and coverage through the `strata` binary: what a manifest
//! records of its commit's observed scope, the parent and base bindings that
//! `verify` checks, the budgeted ancestry walk (`strata lineage`) with each
//! of its ends, and the boundary-safe render (`strata manifest --redacted`).

mod common;

use common::*;
use serde_json::Value;
use std::path::{Path, PathBuf};
use std::process::Command;
use strata::format::manifest::{paths_digest, ScopeKind};

/// A store at `t/store` with set `set` of `gens` generations (one file
/// changed per generation), and the source tree.
fn generations(t: &Path, set: &str, gens: u64) -> (PathBuf, PathBuf) {
    let (src, st) = (t.join("src"), t.join("store"));
    if !st.exists() {
        ok(&strata(&st, &["init"]));
    }
    for g in 1..=gens {
        write(&src, "d/f", format!("version {g}").as_bytes());
        write(&src, &format!("d/only-{g}"), b"x");
        commit(&st, set, &src, &[]);
    }
    (src, st)
}

fn commit(st: &Path, set: &str, src: &Path, extra: &[&str]) -> String {
    let mut args = vec!["commit", "--set", set];
    args.extend_from_slice(extra);
    args.push(src.to_str().unwrap());
    ok(&strata(st, &args))
}

fn json(out: &str) -> Value {
    serde_json::from_str(out).unwrap_or_else(|e| panic!("{e}: {out}"))
}

fn lineage(st: &Path, set: &str, extra: &[&str]) -> (i32, Value) {
    let mut args = vec!["lineage", "--set", set, "--json"];
    args.extend_from_slice(extra);
    let o = strata(st, &args);
    let code = o.status.code().unwrap();
    assert!(
        [0, 1, 4].contains(&code),
        "{}",
        String::from_utf8_lossy(&o.stderr)
    );
    (code, json(&String::from_utf8_lossy(&o.stdout)))
}

/// `verify` of `set` (every retained generation) that must find problems;
/// its listing.
fn verify_problems(st: &Path, set: &str) -> String {
    let o = strata(st, &["verify", "--set", set, "--all"]);
    let out = String::from_utf8_lossy(&o.stdout).into_owned();
    assert_eq!(o.status.code(), Some(1), "{out}");
    out
}

#[test]
fn a_commit_records_its_observed_scope_and_a_fold_keeps_it() {
    let t = tempfile::tempdir().unwrap();
    let (src, st) = generations(t.path(), "s", 1);
    let (_, m) = read_manifest(&st, "s", 1);
    let c = m.coverage.expect("a new manifest records coverage");
    assert_eq!(
        (c.scope, c.covered, c.complete, c.skipped),
        (ScopeKind::Whole, 1, true, 0)
    );

    write(&src, "a/x", b"1");
    write(&src, "b/y", b"2");
    commit(&st, "s", &src, &["--prefix", "b", "--prefix", "a/"]);
    let (_, m) = read_manifest(&st, "s", 2);
    let c = m.coverage.unwrap();
    assert_eq!(c.scope, ScopeKind::Prefixes);
    assert_eq!(c.prefixes, vec![hex::encode("a"), hex::encode("b")]);
    assert_eq!((c.covered, c.complete), (2, true));

    write(&src, "b/y", b"3");
    let list = t.path().join("list");
    std::fs::write(&list, "b/y\nd/f\nb/y\n").unwrap();
    commit(&st, "s", &src, &["--paths-from", list.to_str().unwrap()]);
    let (_, m) = read_manifest(&st, "s", 3);
    let c = m.coverage.clone().unwrap();
    assert_eq!(c.scope, ScopeKind::Paths);
    assert!(c.prefixes.is_empty());
    let listed = [b"b/y".to_vec(), b"d/f".to_vec()];
    assert_eq!(c.paths_digest, Some(paths_digest(&listed)));
    assert_eq!(c.covered, 2);

    assert_eq!(m.representation.label(), "delta");
    ok(&strata(
        &st,
        &[
            "materialize",
            "--set",
            "s",
            "--gen",
            "3",
            "--in-process",
            "--wait",
        ],
    ));
    let (_, folded) = read_manifest(&st, "s", 3);
    assert_eq!(folded.representation.label(), "base");
    assert_eq!(
        folded.coverage,
        Some(c),
        "the fold carries the generation's coverage"
    );
}

#[test]
fn a_commit_that_skips_unreadable_paths_records_partial_coverage() {
    let t = tempfile::tempdir().unwrap();
    let (src, st) = (t.path().join("src"), t.path().join("store"));
    write(&src, "ok", b"fine");
    write(&src, "secret", b"no access");
    write(&src, "also-secret", b"no access");
    ok(&strata(&st, &["init"]));
    chmod(&src, "secret", 0o000);
    chmod(&src, "also-secret", 0o000);
    let chown = Command::new("chown")
        .args(["-R", "65534:65534"])
        .arg(t.path())
        .status()
        .unwrap();
    assert!(chown.success());
    let o = Command::new("setpriv")
        .args(["--reuid=65534", "--regid=65534", "--clear-groups", bin()])
        .arg("--store")
        .arg(&st)
        .args(["commit", "--set", "u", "--skip-unreadable"])
        .arg(&src)
        .output()
        .unwrap();
    ok(&o);
    let (_, m) = read_manifest(&st, "u", 1);
    let c = m.coverage.unwrap();
    assert_eq!(
        (c.scope, c.complete, c.skipped),
        (ScopeKind::Whole, false, 2)
    );
    let redacted = json(&ok(&strata(&st, &["manifest", "--set", "u", "--redacted"])));
    assert_eq!(redacted["coverage"]["complete"], false);
    assert_eq!(redacted["coverage"]["skipped"], 2);
}

#[test]
fn verify_catches_a_flipped_parent_binding() {
    let t = tempfile::tempdir().unwrap();
    let (_, st) = generations(t.path(), "s", 3);
    ok(&strata(&st, &["verify", "--set", "s", "--all"]));
    let (gen1, _) = read_manifest(&st, "s", 1);
    rewrite_manifest(&st, "s", 3, |m| {
        m.parent.as_mut().unwrap().manifest = gen1.clone()
    });
    let out = verify_problems(&st, "s");
    assert!(
        out.contains(
            "s@3: binding: parent manifest digest is none of the parent's representations"
        ) && out.contains(&gen1),
        "{out}"
    );
    assert_eq!(out.matches("PROBLEM").count(), 1, "{out}");

    rewrite_manifest(&st, "s", 3, |m| m.parent.as_mut().unwrap().generation = 1);
    let out = verify_problems(&st, "s");
    assert!(
        out.contains(
            "s@3: binding: parent binding names a generation other than the previous one: named=1"
        ),
        "{out}"
    );

    rewrite_manifest(&st, "s", 3, |m| m.parent = None);
    let out = verify_problems(&st, "s");
    assert!(
        out.contains("s@3: binding: parent binding missing"),
        "{out}"
    );

    let (gen2, m2) = read_manifest(&st, "s", 2);
    rewrite_manifest(&st, "s", 3, |m| {
        m.parent = m2.parent.clone().map(|mut p| {
            p.generation = 2;
            p.manifest = gen2.clone();
            p
        })
    });
    ok(&strata(&st, &["verify", "--set", "s", "--all"]));
    let record = st.join(strata::store::keys::index_record("s", 3, 2));
    let text = std::fs::read_to_string(&record).unwrap();
    assert!(text.contains("\"parent\": 2"), "{text}");
    std::fs::write(&record, text.replace("\"parent\": 2", "\"parent\": 1")).unwrap();
    let out = verify_problems(&st, "s");
    assert!(out.contains("s@3: binding: index record and manifest name different parents: record=Some(1) manifest=Some(2)"), "{out}");

    let (_, st1) = generations(&t.path().join("one"), "t", 1);
    let (own, _) = read_manifest(&st1, "t", 1);
    rewrite_manifest(&st1, "t", 1, |m| {
        m.parent = Some(strata::format::manifest::ParentBinding {
            generation: 1,
            manifest: own.clone(),
        })
    });
    let out = verify_problems(&st1, "t");
    assert!(
        out.contains("t@1: binding: generation 1 names a parent: named=1"),
        "{out}"
    );
}

#[test]
fn verify_catches_a_base_manifest_of_another_set() {
    let t = tempfile::tempdir().unwrap();
    let (_, st) = generations(t.path(), "s", 2);
    let (_, mut base) = read_manifest(&st, "s", 1);
    base.set = "other".into();
    let foreign = store_manifest_file(&st, &base);
    rewrite_manifest(&st, "s", 2, |m| {
        m.base.as_mut().unwrap().manifest = foreign.clone()
    });
    let out = verify_problems(&st, "s");
    assert!(
        out.contains("s@2:") && out.contains("base manifest belongs to another set"),
        "{out}"
    );
    let (code, v) = lineage(&st, "s", &[]);
    assert_eq!(code, 1);
    assert_eq!(v["end"]["result"], "broken-binding");
    assert_eq!(v["end"]["generation"], 2);
    assert_eq!(v["end"]["broken"]["problem"], "base-set");
    assert_eq!(v["end"]["broken"]["found"], "other");
}

#[test]
fn the_ancestry_walk_is_complete_and_stops_at_its_budget() {
    let t = tempfile::tempdir().unwrap();
    let (_, st) = generations(t.path(), "s", 3);
    let (code, v) = lineage(&st, "s", &[]);
    assert_eq!((code, v["end"]["result"].as_str()), (0, Some("complete")));
    let visited: Vec<u64> = v["visited"]
        .as_array()
        .unwrap()
        .iter()
        .map(|n| n["generation"].as_u64().unwrap())
        .collect();
    assert_eq!(visited, vec![3, 2, 1]);

    let (code, v) = lineage(&st, "s", &["--budget", "1"]);
    assert_eq!(code, 4);
    assert_eq!(v["end"]["result"], "budget-exceeded");
    assert_eq!(
        (v["end"]["budget"].as_u64(), v["end"]["generation"].as_u64()),
        (Some(1), Some(2))
    );
    let (code, v) = lineage(&st, "s", &["--budget", "3"]);
    assert_eq!((code, v["end"]["result"].as_str()), (0, Some("complete")));
    let (code, v) = lineage(&st, "s", &["--gen", "2", "--budget", "2"]);
    assert_eq!((code, v["end"]["result"].as_str()), (0, Some("complete")));

    let text = ok(&strata(&st, &["lineage", "--set", "s"]));
    assert!(
        text.contains("complete: every binding holds from generation 3 down to 1"),
        "{text}"
    );
}

#[test]
fn the_ancestry_walk_names_a_broken_binding() {
    let t = tempfile::tempdir().unwrap();
    let (_, st) = generations(t.path(), "s", 4);
    let (gen1, _) = read_manifest(&st, "s", 1);
    let (gen3, _) = read_manifest(&st, "s", 3);
    rewrite_manifest(&st, "s", 3, |m| {
        m.parent.as_mut().unwrap().manifest = gen1.clone()
    });
    // Generation 4 names generation 3's original manifest, which generation
    // 3's records no longer list.
    let (code, v) = lineage(&st, "s", &[]);
    assert_eq!(code, 1);
    assert_eq!(v["end"]["result"], "broken-binding");
    assert_eq!(v["end"]["generation"], 4);
    assert_eq!(v["end"]["broken"]["problem"], "parent-manifest");
    assert_eq!(v["end"]["broken"]["named"], gen3.as_str());
    assert!(v["visited"].as_array().unwrap().is_empty());
    let (code, v) = lineage(&st, "s", &["--gen", "3"]);
    assert_eq!(code, 1);
    assert_eq!(v["end"]["generation"], 3);
    assert_eq!(v["end"]["broken"]["problem"], "parent-manifest");
    assert_eq!(v["end"]["broken"]["named"], gen1.as_str());
    let o = strata(&st, &["lineage", "--set", "s", "--gen", "3"]);
    assert_eq!(o.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&o.stdout)
        .contains("broken-binding: generation 3: parent manifest digest"));
}

#[test]
fn the_ancestry_walk_ends_at_a_retired_parent_and_holds_across_a_fold() {
    let t = tempfile::tempdir().unwrap();
    let (_, st) = generations(t.path(), "s", 3);
    // Fold generation 2: its delta is retired, and generation 3's binding
    // names that delta; the binding still holds.
    ok(&strata(
        &st,
        &[
            "materialize",
            "--set",
            "s",
            "--gen",
            "2",
            "--in-process",
            "--wait",
        ],
    ));
    let (_, folded) = read_manifest(&st, "s", 2);
    assert_eq!(folded.representation.label(), "base");
    let (code, v) = lineage(&st, "s", &[]);
    assert_eq!((code, v["end"]["result"].as_str()), (0, Some("complete")));
    ok(&strata(&st, &["verify", "--set", "s", "--all"]));

    ok(&strata(&st, &["retain", "--set", "s", "--keep-last", "1"]));
    let (code, v) = lineage(&st, "s", &[]);
    assert_eq!(code, 0);
    assert_eq!(v["end"]["result"], "parent-retired");
    assert_eq!(v["end"]["generation"], 2);
    ok(&strata(&st, &["sweep", "--in-process", "--grace", "0s"]));
    ok(&strata(&st, &["sweep", "--in-process", "--grace", "0s"]));
    let (code, v) = lineage(&st, "s", &[]);
    assert_eq!(
        (code, v["end"]["result"].as_str()),
        (0, Some("parent-retired"))
    );
    ok(&strata(&st, &["verify", "--set", "s", "--all"]));
    let o = strata(&st, &["lineage", "--set", "s", "--gen", "1"]);
    assert_eq!(
        o.status.code(),
        Some(2),
        "a walk starts at a committed generation"
    );
}

fn hostname() -> String {
    std::fs::read_to_string("/proc/sys/kernel/hostname")
        .unwrap()
        .trim()
        .to_string()
}

fn manifest_out(st: &Path, extra: &[&str]) -> String {
    let mut args = vec!["manifest", "--set", "otter-photos"];
    args.extend_from_slice(extra);
    ok(&strata(st, &args))
}

#[test]
fn the_redacted_manifest_names_no_path_key_message_or_host() {
    let t = tempfile::tempdir().unwrap();
    let (src, st) = (t.path().join("src"), t.path().join("store"));
    ok(&strata(&st, &["init"]));
    write(&src, "quokka-dir/zebra-secret.txt", b"one");
    write(&src, "quokka-dir/pelican-notes.md", &noise(1, 3 << 20));
    write(&src, "walrus-top", b"two");
    commit(
        &st,
        "otter-photos",
        &src,
        &["-m", "narwhal migration message"],
    );
    write(&src, "quokka-dir/zebra-secret.txt", b"three");
    commit(
        &st,
        "otter-photos",
        &src,
        &["--prefix", "quokka-dir", "-m", "second narwhal message"],
    );

    let secrets: Vec<String> = [
        "quokka-dir",
        "zebra-secret",
        "pelican-notes",
        "walrus-top",
        "narwhal",
        "otter-photos",
    ]
    .iter()
    .flat_map(|s| [s.to_string(), hex::encode(s)])
    .collect();
    let keys = [
        "sets/",
        "manifests/",
        "segments/",
        "packs/",
        "chunks/",
        "chunklists/",
        "blobs/",
        "journals/",
        "staging/",
        "pins/",
    ];
    for gen in ["1", "2"] {
        let full = manifest_out(&st, &["--gen", gen]);
        assert!(
            full.contains("narwhal") && full.contains(&hex::encode("quokka-dir")),
            "{full}"
        );
        let redacted = manifest_out(&st, &["--gen", gen, "--redacted"]);
        for s in secrets.iter().map(String::as_str).chain(keys) {
            assert!(
                !redacted.contains(s),
                "`{s}` in the redacted render: {redacted}"
            );
        }
        let host = hostname();
        assert!(
            host.is_empty() || !redacted.contains(&host),
            "host name in {redacted}"
        );
        let v = json(&redacted);
        assert_eq!(v["type"], "strata-manifest-redacted");
        assert_eq!(v["generation"].as_u64(), gen.parse().ok());
        assert!(v["counts"]["files"].as_u64().unwrap() >= 3);
        assert!(v["sizes"]["segments"].as_u64().unwrap() > 0);
    }
    let v = json(&manifest_out(&st, &["--gen", "2", "--redacted"]));
    let (gen1, _) = read_manifest(&st, "otter-photos", 1);
    assert_eq!(v["lineage"]["parent"]["generation"], 1);
    assert_eq!(v["lineage"]["parent"]["manifest"], gen1.as_str());
    assert_eq!(v["lineage"]["base"]["manifest"], gen1.as_str());
    assert_eq!(v["coverage"]["scope"], "prefixes");
    assert_eq!(
        (
            v["coverage"]["covered"].as_u64(),
            v["coverage"]["complete"].as_bool()
        ),
        (Some(1), Some(true))
    );
}
