//! Scheduled sweeps in the daemon: one thread that runs `strata::sweep`
//! every interval with the configured grace, and the last outcome for
//! `status`. Explicit `sweep` requests on the control socket run on their
//! connection's thread; the store's sweeper lease keeps them one at a time.

use serde_json::{json, Value};
use std::sync::mpsc;
use std::sync::{Arc, Mutex, PoisonError};
use std::thread::JoinHandle;
use std::time::Duration;
use strata::sweep::{sweep, SweepOptions, SweepReport};
use strata::Store;
use tracing::{info, warn};

/// The outcome of the daemon's latest sweep (scheduled or requested), and
/// the grace its sweeps use unless a request names one.
pub(crate) struct LastSweep {
    last: Mutex<Option<Value>>,
    pub(crate) grace: Duration,
}

impl LastSweep {
    pub(crate) fn new(grace: Duration) -> LastSweep {
        LastSweep {
            last: Mutex::new(None),
            grace,
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

    /// Run one sweep and remember how it went.
    pub(crate) fn run(
        &self,
        store: &Store,
        grace: Duration,
        dry_run: bool,
        recount: bool,
    ) -> Result<SweepReport, String> {
        let opts = SweepOptions {
            grace,
            dry_run,
            holder: format!("strata-mountd pid={}", std::process::id()),
            recount,
        };
        let at = strata::token::now_ns();
        match sweep(store, &opts) {
            Ok(r) => {
                if !dry_run {
                    self.set(json!({ "at_ns": at, "epoch": r.epoch, "deleted": r.deleted,
                        "condemned": r.condemned, "deferred": r.deferred }));
                }
                Ok(r)
            }
            Err(e) => {
                let msg = strata::cli_chain(&e);
                if !dry_run {
                    self.set(json!({ "at_ns": at, "error": msg }));
                }
                Err(msg)
            }
        }
    }
}

/// Sweep every `every` until the returned sender is dropped.
pub(crate) fn spawn(
    store: Store,
    last: Arc<LastSweep>,
    every: Duration,
) -> std::io::Result<(mpsc::Sender<()>, JoinHandle<()>)> {
    let (stop, stopped) = mpsc::channel::<()>();
    let handle = std::thread::Builder::new()
        .name("sweep".into())
        .spawn(move || {
            strata::sweep::yield_cpu();
            while stopped.recv_timeout(every) == Err(mpsc::RecvTimeoutError::Timeout) {
                match last.run(&store, last.grace, false, false) {
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
