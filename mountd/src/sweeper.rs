//! Sweeps for the daemon: scheduled ones on their own thread, requested
//! ones (the control socket's `sweep`) on their connection's thread, and
//! the last outcome for `status`; the store's sweeper lease keeps them one
//! at a time.
//!
//! Sweeps run in a helper process, `strata sweep --serve`, started at the
//! first sweep and kept: one JSON request line to its stdin per sweep, one
//! answer line back. It lives in a session of its own whose scheduling
//! autogroup is at nice 19, and ends when its stdin closes (the daemon
//! stopped or died). It is started with posix_spawn (no `pre_exec` hook),
//! so the daemon's address space is never forked: a fork would copy its
//! page tables under the memory-map lock the FUSE threads need. In the
//! daemon itself a full sweep of a 1M-object store took the FUSE threads'
//! CPU and process-wide resources (its allocations, its kernel work) and
//! doubled stat and quadrupled cat p99 on the mount; in its own low-weight
//! autogroup it leaves stat p99 where it was. A process started per sweep
//! cost more than the sweep: back to back, the starts alone took the
//! mount's cat p99 from 0.37 to 1.79 ms (docs/BENCHMARKS.md, "Sweep").
//! The helper's answer is the daemon's; its error, with the sweep's own
//! message, is the daemon's error; a helper that died is started again at
//! the next sweep. The daemon's memory does not grow with the store it
//! sweeps.

use std::ffi::OsString;
use std::io::{BufRead, BufReader, Write};
use std::path::PathBuf;
use std::process::{Child, ChildStdin, ChildStdout, Command, Stdio};
use std::sync::mpsc;
use std::sync::{Arc, Mutex, PoisonError};
use std::thread::JoinHandle;
use std::time::Duration;
use strata::control::protocol::SweepSummary;
use strata::control::sweep_helper::{SweepAnswer, SweepJob};
use strata::sweep::SweepReport;
use tracing::{info, warn};

/// Why a sweep of the daemon did not give a report. The message is the
/// control socket's `failed` error and `status`'s `last_sweep.error`.
#[derive(Debug, thiserror::Error)]
pub(crate) enum SweepError {
    /// The helper could not be started.
    #[error("cannot run `{}` to sweep: {error}", bin.display())]
    Spawn { bin: PathBuf, error: std::io::Error },
    /// The helper started without its stdin or stdout.
    #[error("the sweep helper started without its pipes")]
    NoPipes,
    /// Writing the request or reading the answer failed.
    #[error("the sweep helper (pid {pid}) did not answer: {error}")]
    NoAnswer { pid: u32, error: std::io::Error },
    /// The helper's stdout closed before it answered.
    #[error("the sweep helper (pid {pid}) ended during the sweep ({status})")]
    Ended { pid: u32, status: String },
    /// The answer line is not a [`SweepAnswer`].
    #[error("unreadable answer from the sweep helper (pid {pid}): {error}")]
    Unreadable { pid: u32, error: serde_json::Error },
    /// The sweep itself failed; the helper's message (`strata sweep`'s).
    #[error("{0}")]
    Sweep(String),
}

/// The outcome of the daemon's latest sweep (scheduled or requested), the
/// grace its sweeps use unless a request names one, how the helper opens
/// the store, and the helper once started.
pub(crate) struct LastSweep {
    last: Mutex<Option<SweepSummary>>,
    pub(crate) grace: Duration,
    store_args: Vec<OsString>,
    helper: Mutex<Option<Helper>>,
}

impl LastSweep {
    pub(crate) fn new(grace: Duration, store_args: Vec<OsString>) -> LastSweep {
        LastSweep {
            last: Mutex::new(None),
            grace,
            store_args,
            helper: Mutex::new(None),
        }
    }

    /// How the latest (not dry-run) sweep ended; `None` before the first.
    pub(crate) fn get(&self) -> Option<SweepSummary> {
        self.last
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }

    fn set(&self, v: SweepSummary) {
        *self.last.lock().unwrap_or_else(PoisonError::into_inner) = Some(v);
    }

    /// Run one sweep (in the helper) and remember how it went.
    pub(crate) fn run(
        &self,
        grace: Duration,
        dry_run: bool,
        recount: bool,
    ) -> Result<SweepReport, SweepError> {
        let at_ns = strata::token::now_ns();
        let outcome = self.ask_helper(&SweepJob::new(grace, dry_run, recount));
        if !dry_run {
            self.set(match &outcome {
                Ok(r) => SweepSummary::Done {
                    at_ns,
                    condemned: r.condemned,
                    deferred: r.deferred.clone(),
                    deleted: r.deleted,
                    epoch: r.epoch,
                },
                Err(e) => SweepSummary::Failed {
                    at_ns,
                    error: e.to_string(),
                },
            });
        }
        outcome
    }

    /// Send `job` to the helper (started first if there is none or it
    /// ended) and read its answer. A helper that fails to answer is let go,
    /// and the next sweep starts another.
    fn ask_helper(&self, job: &SweepJob) -> Result<SweepReport, SweepError> {
        let mut slot = self.helper.lock().unwrap_or_else(PoisonError::into_inner);
        if slot.as_mut().is_some_and(|h| !h.alive()) {
            *slot = None;
        }
        let helper = match slot.as_mut() {
            Some(h) => h,
            None => slot.insert(Helper::start(&self.store_args)?),
        };
        let answer = helper.ask(job);
        if answer.is_err() {
            *slot = None;
        }
        match answer? {
            SweepAnswer::Report(r) => Ok(*r),
            SweepAnswer::Failed(message) => Err(SweepError::Sweep(message)),
        }
    }
}

/// The running `strata sweep --serve` process and its pipes. Dropping it
/// stops the process (only ever done between sweeps).
struct Helper {
    child: Child,
    input: ChildStdin,
    output: BufReader<ChildStdout>,
}

impl Helper {
    fn start(store_args: &[OsString]) -> Result<Helper, SweepError> {
        let bin = strata::sibling_binary("strata");
        let mut child = match Command::new(&bin)
            .args(store_args)
            .args(["sweep", "--in-process", "--serve"])
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .spawn()
        {
            Ok(c) => c,
            Err(error) => return Err(SweepError::Spawn { bin, error }),
        };
        let (Some(input), Some(output)) = (child.stdin.take(), child.stdout.take()) else {
            let _ = child.kill();
            let _ = child.wait();
            return Err(SweepError::NoPipes);
        };
        info!("sweep helper started: pid {}", child.id());
        Ok(Helper {
            child,
            input,
            output: BufReader::new(output),
        })
    }

    fn alive(&mut self) -> bool {
        matches!(self.child.try_wait(), Ok(None))
    }

    fn ask(&mut self, job: &SweepJob) -> Result<SweepAnswer, SweepError> {
        let pid = self.child.id();
        let mut line = String::new();
        writeln!(self.input, "{}", job.to_line())
            .and_then(|()| self.input.flush())
            .and_then(|()| self.output.read_line(&mut line))
            .map_err(|error| SweepError::NoAnswer { pid, error })?;
        if line.is_empty() {
            let status = self
                .child
                .wait()
                .map_or_else(|e| e.to_string(), |s| s.to_string());
            return Err(SweepError::Ended { pid, status });
        }
        SweepAnswer::parse(&line).map_err(|error| SweepError::Unreadable { pid, error })
    }
}

impl Drop for Helper {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
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
