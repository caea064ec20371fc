//! A killed S3 server, restarted under a running commit and a mount. This is
//! its own test binary because it stops the server every other test uses
//! (cargo runs test binaries one at a time).

mod common;

use common::*;
use std::io::Read;
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

/// The directory of the server scripts/test.sh started.
fn server_dir() -> String {
    std::env::var("STRATA_TEST_S3_DIR").expect("run the suite with scripts/test.sh")
}

fn kill_server() {
    let pid = std::fs::read_to_string(format!("{}/weed.pid", server_dir())).unwrap();
    nix_kill(pid.trim().parse().unwrap(), libc::SIGKILL);
}

fn restart_server() {
    let script = concat!(env!("CARGO_MANIFEST_DIR"), "/scripts/s3-server.sh");
    ok(&Command::new(script)
        .args(["start", &server_dir()])
        .output()
        .unwrap());
}

/// S3 flags with a lease ttl long enough to outlast the restart, so the
/// outcome is decided by the request retries, not by fencing.
fn long_lease_flags(st: &Path, local: &Path) -> Vec<String> {
    let mut f = s3_flags(st, local);
    let i = f.iter().position(|x| x == "--lease-ttl").unwrap();
    f[i + 1] = "60s".into();
    f
}

fn wait_for_latest(point: &Path, want: &Path) {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let d = Command::new("diff")
            .arg("-r")
            .arg(want)
            .arg(point)
            .output()
            .unwrap();
        if d.status.success() {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "latest never showed the new generation: {}",
            String::from_utf8_lossy(&d.stdout)
        );
        std::thread::sleep(Duration::from_millis(200));
    }
}

#[test]
fn a_killed_server_restarted_leaves_the_store_consistent() {
    let t = tempfile::tempdir().unwrap();
    let (st, src) = (t.path().join("store"), t.path().join("src"));
    for i in 0..200 {
        write(&src, &format!("d{}/f{i}", i % 7), &noise(i, 2000));
    }
    write(&src, "big", &noise(1000, 24 << 20));
    settle();
    let store = new_s3_store(&st);
    let host = t.path().join("committer");
    ok(&strata_s3(
        &st,
        &host,
        &["commit", "--set", "n", src.to_str().unwrap()],
    ));
    let want1 = std::fs::read(src.join("big")).unwrap();
    let point = t.path().join("m");
    let _mount = s3_mount(&st, &t.path().join("mounter"), &point);
    let mut held = std::fs::File::open(point.join("n/gens/1/big")).unwrap();

    // A second commit pauses once its blobs are uploaded; the server is
    // killed, the commit resumes against a refused port, and the server
    // comes back on the same data directory.
    for i in (0..200).step_by(3) {
        write(&src, &format!("d{}/f{i}", i % 7), &noise(i + 7, 2100));
    }
    write(&src, "big2", &noise(2000, 12 << 20));
    settle();
    let child = Command::new(bin())
        .args(long_lease_flags(&st, &host))
        .args(["commit", "--set", "n"])
        .arg(&src)
        .env("STRATA_FAILPOINTS", "blobs-durable=stop")
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    wait_stopped(&child);
    kill_server();
    nix_kill(child.id(), libc::SIGCONT);
    std::thread::sleep(Duration::from_millis(300));
    restart_server();
    let out = child.wait_with_output().unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);

    // Retried and landed, or failed cleanly as an unavailable store.
    eprintln!("commit across the restart: {:?} {stderr}", out.status);
    if !out.status.success() {
        assert_eq!(out.status.code(), Some(5), "{stderr}");
        assert!(stderr.contains("remote store request failed"), "{stderr}");
        let latest = strata::index::GenIndex::new(&store, "n")
            .latest()
            .unwrap()
            .unwrap();
        assert_eq!(latest.generation, 1, "a failed commit published nothing");
        ok(&strata_s3(
            &st,
            &host,
            &["commit", "--set", "n", src.to_str().unwrap()],
        ));
    }
    ok(&strata_s3(
        &st,
        &t.path().join("verifier"),
        &["verify", "--all"],
    ));
    assert_eq!(snapshot_gen(&store, "n", None), snapshot_dir(&src));

    // The mount rode out the outage: the open file reads back, and latest
    // moves to the new generation.
    let mut data = Vec::new();
    held.read_to_end(&mut data).unwrap();
    assert!(data == want1, "open file in generation 1 changed");
    wait_for_latest(&point.join("n/latest"), &src);
    drop(held);
}
