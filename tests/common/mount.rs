//! Mounts for tests, each detached when dropped so a failing test leaves
//! none: through the CLI (`Mounted`) or a daemon started directly (`Mount`);
//! and `Scratch`, a temporary store, source tree and mount point.

use super::cli::{bin, mountd_bin, ok, strata_s3};
use super::store::{commit_gen, new_local_store};
use std::fs;
use std::io::Read;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::time::{Duration, Instant};
use strata::Store;

/// The host settings that decide whether a daemon takes FUSE over
/// io_uring: whether the kernel offers it to new mounts
/// (`fuse.enable_uring`) and whether it schedules each session as a group
/// (`kernel.sched_autogroup_enabled`). The CI script runs the mount tests
/// with the first off, then with it on and the second off.
pub struct RingHost {
    pub offered: bool,
    pub grouped: bool,
}

impl RingHost {
    pub fn now() -> RingHost {
        let on = |path: &str| fs::read_to_string(path).is_ok_and(|v| matches!(v.trim(), "Y" | "1"));
        RingHost {
            offered: on("/sys/module/fuse/parameters/enable_uring"),
            grouped: on("/proc/sys/kernel/sched_autogroup_enabled"),
        }
    }

    /// Whether a daemon mounting now takes the ring.
    pub fn taken(&self) -> bool {
        self.offered && !self.grouped
    }
}

/// Whether `point` is a mount point now (in `/proc/self/mounts`).
pub fn mounted(point: &Path) -> bool {
    let mounts = fs::read_to_string("/proc/self/mounts").unwrap();
    let p = point.to_str().unwrap();
    mounts.lines().any(|l| l.split(' ').nth(1) == Some(p))
}

/// Wait up to 10 s for `f` to hold, polling every 20 ms.
pub fn wait_for(what: &str, mut f: impl FnMut() -> bool) {
    let start = Instant::now();
    while !f() {
        assert!(
            start.elapsed() < Duration::from_secs(10),
            "timed out waiting for {what}"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// Detach `point` lazily with `umount -l` if it is mounted.
pub fn detach(point: &Path) {
    if mounted(point) {
        let _ = Command::new("umount").arg("-l").arg(point).status();
    }
}

/// A mount made by `strata mount`, detached when dropped.
#[must_use = "the mount is detached when this is dropped"]
pub struct Mounted(PathBuf);

impl Drop for Mounted {
    fn drop(&mut self) {
        unmount(&self.0);
    }
}

/// Mount the S3 store of `dir` at `point` (no policy materializations or
/// scheduled sweeps), as a host whose local state is `local`.
pub fn s3_mount(dir: &Path, local: &Path, point: &Path) -> Mounted {
    fs::create_dir_all(point).unwrap();
    let at = point.to_str().unwrap();
    let args = ["mount", at, "--no-materialize", "--sweep-every", "0s"];
    ok(&strata_s3(dir, local, &args));
    Mounted(point.to_path_buf())
}

/// Unmount lazily through the CLI (a test's readers may still hold files).
pub fn unmount(point: &Path) {
    let _ = Command::new(bin())
        .args(["unmount", "--lazy"])
        .arg(point)
        .output();
}

/// A `strata-mountd` this test started in the foreground: killed and its
/// mount detached when dropped.
pub struct Mount {
    pub child: Option<Child>,
    pub point: PathBuf,
}

impl Mount {
    /// Serve the local store `store` at `point`; returns once it is mounted.
    pub fn start(store: &Path, point: &Path) -> Mount {
        Mount::start_with(store, point, &[])
    }

    /// `start` with more daemon arguments.
    pub fn start_with(store: &Path, point: &Path, args: &[&str]) -> Mount {
        Mount::start_env(store, point, args, &[])
    }

    /// `start_with` and environment variables (e.g. `STRATA_FAILPOINTS`).
    pub fn start_env(store: &Path, point: &Path, args: &[&str], env: &[(&str, &str)]) -> Mount {
        fs::create_dir_all(point).unwrap();
        let child = Command::new(mountd_bin())
            .envs(env.iter().copied())
            .arg("--store")
            .arg(store)
            .args(args)
            .arg(point)
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        wait_for("mount", || mounted(point));
        Mount {
            child: Some(child),
            point: point.to_path_buf(),
        }
    }

    pub fn signal(&self, sig: i32) {
        let pid = self.child.as_ref().unwrap().id() as i32;
        // SAFETY: signalling our own child process.
        unsafe { libc::kill(pid, sig) };
    }

    /// Wait for the daemon to exit; returns its status and stderr.
    pub fn wait(&mut self) -> (ExitStatus, String) {
        let mut child = self.child.take().unwrap();
        let mut err = String::new();
        child
            .stderr
            .take()
            .unwrap()
            .read_to_string(&mut err)
            .unwrap();
        (child.wait().unwrap(), err)
    }
}

impl Drop for Mount {
    fn drop(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
        detach(&self.point);
    }
}

/// A temporary directory holding a new local store, a source tree and a
/// mount point; all removed when dropped (the directory last: fields drop
/// in order).
pub struct Scratch {
    /// The store at `st`, opened.
    pub store: Store,
    /// The store's directory, `<dir>/store` (initialized).
    pub st: PathBuf,
    /// The source tree, `<dir>/src` (not created: writing a file makes it).
    pub src: PathBuf,
    /// The mount point, `<dir>/mnt` (not created: mounting makes it).
    pub mnt: PathBuf,
    /// The temporary directory everything is in.
    pub dir: tempfile::TempDir,
}

impl Scratch {
    pub fn new() -> Scratch {
        let dir = tempfile::tempdir().unwrap();
        let st = dir.path().join("store");
        let store = new_local_store(&st);
        Scratch {
            store,
            st,
            src: dir.path().join("src"),
            mnt: dir.path().join("mnt"),
            dir,
        }
    }

    /// The temporary directory.
    pub fn path(&self) -> &Path {
        self.dir.path()
    }

    /// Commit `src` to `set` through the library; the new generation.
    pub fn commit(&self, set: &str) -> u64 {
        commit_gen(&self.store, set, &self.src)
    }

    /// Serve the store at `mnt` with a daemon of this test.
    pub fn mount(&self) -> Mount {
        Mount::start(&self.st, &self.mnt)
    }

    /// `mount` with more daemon arguments.
    pub fn mount_with(&self, args: &[&str]) -> Mount {
        Mount::start_with(&self.st, &self.mnt, args)
    }
}
