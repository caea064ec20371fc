//! The `strata` binary as tests run it, and the processes it starts.

use super::store::s3_flags;
use std::path::Path;
use std::process::{Command, Output};
use std::sync::OnceLock;
use std::time::{Duration, Instant};

/// The `strata` binary. Cargo names it to the root package's tests; the
/// mount daemon's tests find it next to `strata-mountd` (the workspace
/// builds both into one directory).
pub fn bin() -> &'static str {
    static BIN: OnceLock<String> = OnceLock::new();
    BIN.get_or_init(|| match option_env!("CARGO_BIN_EXE_strata") {
        Some(b) => b.to_string(),
        None => sibling("strata"),
    })
}

/// The `strata-mountd` binary (for the root package's tests: next to `strata`).
pub fn mountd_bin() -> &'static str {
    static BIN: OnceLock<String> = OnceLock::new();
    BIN.get_or_init(|| match option_env!("CARGO_BIN_EXE_strata-mountd") {
        Some(b) => b.to_string(),
        None => sibling("strata-mountd"),
    })
}

/// `name` in the directory of whichever workspace binary cargo named.
fn sibling(name: &str) -> String {
    let known = option_env!("CARGO_BIN_EXE_strata")
        .or(option_env!("CARGO_BIN_EXE_strata-mountd"))
        .or(option_env!("CARGO_BIN_EXE_lazyfs"))
        .expect("cargo names a workspace binary to every test");
    Path::new(known)
        .with_file_name(name)
        .to_str()
        .unwrap()
        .to_string()
}

/// Run the CLI on the store at `store`.
pub fn strata(store: &Path, args: &[&str]) -> Output {
    Command::new(bin())
        .arg("--store")
        .arg(store)
        .args(args)
        .output()
        .unwrap()
}

/// Run the CLI on the store at `store` with one environment variable set.
pub fn strata_env(store: &Path, args: &[&str], env: (&str, &str)) -> Output {
    Command::new(bin())
        .arg("--store")
        .arg(store)
        .args(args)
        .env(env.0, env.1)
        .output()
        .unwrap()
}

/// Run the CLI on the store at `store` with the failpoints `spec`
/// (`STRATA_FAILPOINTS`, e.g. `step=kill`).
pub fn strata_failing(store: &Path, args: &[&str], spec: &str) -> Output {
    strata_env(store, args, ("STRATA_FAILPOINTS", spec))
}

/// Run the CLI on the S3 store of `dir` as a host whose local state is `local`.
pub fn strata_s3(dir: &Path, local: &Path, args: &[&str]) -> Output {
    Command::new(bin())
        .args(s3_flags(dir, local))
        .args(args)
        .output()
        .unwrap()
}

/// The stdout of a command that must have succeeded (else its output).
pub fn ok(o: &Output) -> String {
    assert!(
        o.status.success(),
        "failed: {}\n{}",
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    );
    String::from_utf8(o.stdout.clone()).unwrap()
}

/// The daemon pid a `strata mount` printed.
pub fn mounted_pid(out: &str) -> i32 {
    out.split("strata-mountd pid ")
        .nth(1)
        .and_then(|s| s.split(|c: char| !c.is_ascii_digit()).next())
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| panic!("no daemon pid in {out}"))
}

/// The state letter of process `pid` in `/proc/<pid>/stat` (None when gone).
fn proc_state(pid: u32) -> Option<char> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    Some(
        stat.rsplit(')')
            .next()
            .unwrap_or("")
            .trim_start()
            .chars()
            .next()
            .unwrap_or(' '),
    )
}

/// Whether process `pid` has ended (gone, or a zombie its parent has not
/// reaped yet).
pub fn ended(pid: i32) -> bool {
    proc_state(pid as u32).is_none_or(|s| s == 'Z')
}

/// Wait until process `pid` has exited (gone, or a zombie nobody reaped yet).
pub fn wait_exited(pid: i32) {
    let deadline = Instant::now() + Duration::from_secs(30);
    while !ended(pid) {
        assert!(Instant::now() < deadline, "process {pid} did not exit");
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// Wait until a child stopped itself (a `stop` failpoint).
pub fn wait_stopped(child: &std::process::Child) {
    let deadline = Instant::now() + Duration::from_secs(60);
    while Instant::now() < deadline {
        let state = proc_state(child.id());
        if state == Some('T') {
            return;
        }
        assert!(state != Some('Z'), "the committer exited before its pause");
        std::thread::sleep(Duration::from_millis(20));
    }
    panic!("the committer never reached its pause");
}

pub fn nix_kill(pid: u32, sig: i32) {
    // SAFETY: signalling a child we spawned.
    unsafe { libc::kill(pid as i32, sig) };
}
