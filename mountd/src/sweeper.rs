//! Sweeps for the daemon: scheduled ones on their own thread, requested
//! ones (the control socket's `sweep`) on their connection's thread, and
//! the last outcome for `status`; the store's sweeper lease keeps them one
//! at a time.
//!
//! Each sweep runs in a child process, `strata sweep --in-process
//! --background --json`: in a session of its own whose scheduling
//! autogroup is at nice 19. The child is started with posix_spawn (no
//! `pre_exec` hook), so the daemon's address space is never forked: a fork
//! would copy its page tables under the memory-map lock the FUSE threads
//! need. In the daemon itself a full sweep of a 1M-object store took the
//! FUSE threads' CPU and process-wide resources (its allocations, its
//! kernel work) and doubled stat and quadrupled cat p99 on the mount; in
//! its own low-weight autogroup it leaves stat p99 where it was
//! (docs/BENCHMARKS.md). The
//! child's report is the daemon's answer; its failure, with the child's
//! message, is the daemon's error. The daemon's memory does not grow with
//! the store it sweeps.

use serde_json::{json, Value};
use std::ffi::OsString;
use std::process::{Command, Stdio};
use std::sync::mpsc;
use std::sync::{Arc, Mutex, PoisonError};
use std::thread::JoinHandle;
use std::time::Duration;
use strata::sweep::SweepReport;
use tracing::{info, warn};

/// The outcome of the daemon's latest sweep (scheduled or requested), the
/// grace its sweeps use unless a request names one, and how a child opens
/// the store.
pub(crate) struct LastSweep {
    last: Mutex<Option<Value>>,
    pub(crate) grace: Duration,
    store_args: Vec<OsString>,
}

impl LastSweep {
    pub(crate) fn new(grace: Duration, store_args: Vec<OsString>) -> LastSweep {
        LastSweep {
            last: Mutex::new(None),
            grace,
            store_args,
        }
    }

    pub(crate) fn get(&self) -> Value {
        self.last
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
            .unwrap_or(Value::Null)
    }

    fn set(&self, v: Value) {
        *self.last.lock().unwrap_or_else(PoisonError::into_inner) = Some(v);
    }

    /// Run one sweep (in a child) and remember how it went.
    pub(crate) fn run(
        &self,
        grace: Duration,
        dry_run: bool,
        recount: bool,
    ) -> Result<SweepReport, String> {
        let at = strata::token::now_ns();
        let outcome = run_child(&self.store_args, grace, dry_run, recount);
        if !dry_run {
            self.set(match &outcome {
                Ok(r) => json!({ "at_ns": at, "epoch": r.epoch, "deleted": r.deleted,
                    "condemned": r.condemned, "deferred": r.deferred }),
                Err(msg) => json!({ "at_ns": at, "error": msg }),
            });
        }
        outcome
    }
}

fn run_child(
    store_args: &[OsString],
    grace: Duration,
    dry_run: bool,
    recount: bool,
) -> Result<SweepReport, String> {
    let bin = strata::sibling_binary("strata");
    let mut cmd = Command::new(&bin);
    cmd.args(store_args)
        .args(["sweep", "--in-process", "--background", "--json", "--grace"])
        .arg(format!("{}ms", grace.as_millis()))
        .stdin(Stdio::null());
    if dry_run {
        cmd.arg("--dry-run");
    }
    if recount {
        cmd.arg("--recount");
    }
    let out = cmd
        .output()
        .map_err(|e| format!("cannot run `{}` to sweep: {e}", bin.display()))?;
    if !out.status.success() {
        let err = String::from_utf8_lossy(&out.stderr);
        let err = err.trim();
        return Err(match err.strip_prefix("strata: error: ") {
            Some(msg) => msg.to_string(),
            None => format!("`{} sweep` failed ({}): {err}", bin.display(), out.status),
        });
    }
    serde_json::from_slice(&out.stdout)
        .map_err(|e| format!("unreadable report from `{} sweep`: {e}", bin.display()))
}

/// Sweep every `every` until the returned sender is dropped.
pub(crate) fn spawn(
    last: Arc<LastSweep>,
    every: Duration,
) -> std::io::Result<(mpsc::Sender<()>, JoinHandle<()>)> {
    let (stop, stopped) = mpsc::channel::<()>();
    let handle = std::thread::Builder::new()
        .name("sweep".into())
        .spawn(move || {
            while stopped.recv_timeout(every) == Err(mpsc::RecvTimeoutError::Timeout) {
                match last.run(last.grace, false, false) {
                    Ok(r) => info!(
                        "sweep epoch {}: deleted {} object(s), {} condemned",
                        r.epoch, r.deleted.count, r.condemned.count
                    ),
                    Err(e) => warn!("sweep: {e}"),
                }
            }
        })?;
    Ok((stop, handle))
}
