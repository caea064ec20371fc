//! Background materialization in the daemon: one worker thread, one active
//! job plus at most one pending one (further policy triggers coalesce).
//!
//! The policy looks at each set's latest generation after every refresh: a
//! job is queued when its delta has at least `min_rows` rows and at least
//! `ratio` times as many rows as its base, or its segments take at least
//! `max_bytes`, or its base is older than `max_age`. The job itself re-reads the
//! authoritative index (`strata::materialize`); what the policy saw is only a
//! trigger. Explicit requests from the control socket use the same queue,
//! and so does the task recovery scanner (`strata::materialize::recover`),
//! queued at start and every scan period: it drives every task of every
//! set and generation to a final state.
//!
//! The worker never waits for a task held elsewhere: a control-socket
//! request that waits re-queues its attempt from its own connection thread
//! until its bound, so other requests are served meanwhile.
//!
//! Shutdown closes the queue and cancels the running attempt at its next
//! checkpoint (between row groups, before PREPARED; a publication that
//! began is finished), which records RETRY_WAIT; the worker is joined, so
//! the outcome is recorded before the daemon exits.

use crate::error::DaemonError;
use crate::gen::Gen;
use std::collections::HashSet;
use std::sync::mpsc::{self, Receiver, SyncSender, TrySendError};
use std::sync::{Arc, Mutex, PoisonError};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};
use strata::materialize::recover::{recover, RecoverOptions};
use strata::materialize::{materialize, Cancel, MaterializeOptions, Outcome, MAX_WAIT};
use strata::Store;
use tracing::{debug, info, warn};

/// When the daemon folds a delta into a new base on its own.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Policy {
    pub(crate) enabled: bool,
    /// Delta rows at least this fraction of base rows.
    pub(crate) ratio: f64,
    /// And at least this many delta rows.
    pub(crate) min_rows: u64,
    /// Or delta segments of at least this many bytes.
    pub(crate) max_bytes: u64,
    /// Or a base older than this (`None`: no age trigger).
    pub(crate) max_age: Option<Duration>,
}

impl Policy {
    fn due(&self, gen: &Gen) -> bool {
        let Some(delta) = &gen.view.delta else {
            return false;
        };
        let d = delta.manifest.counts.rows;
        let b = gen.view.base.manifest.counts.rows;
        let rows = d >= self.min_rows && d as f64 >= self.ratio * b as f64;
        let bytes: u64 = delta.manifest.segments.iter().map(|s| s.size).sum();
        let age_ns = strata::token::now_ns() - gen.view.base.manifest.created_ns;
        let old = self
            .max_age
            .is_some_and(|a| age_ns > 0 && age_ns as u128 >= a.as_nanos());
        self.enabled && d > 0 && (rows || bytes >= self.max_bytes || old)
    }
}

type Reply = mpsc::Sender<strata::Result<Outcome>>;

enum Job {
    /// One attempt (never a wait) on a set's generation.
    Materialize {
        set: String,
        generation: Option<u64>,
        reply: Option<Reply>,
    },
    /// One pass of the task recovery scanner.
    Recover,
}

pub(crate) struct Materializer {
    queue: Mutex<Option<SyncSender<Job>>>,
    thread: Mutex<Option<JoinHandle<()>>>,
    policy: Policy,
    cancel: Cancel,
    /// Generations whose task reached a final state: not triggered again.
    settled: Arc<Mutex<HashSet<(String, u64)>>>,
}

impl Materializer {
    pub(crate) fn start(store: Store, policy: Policy) -> std::io::Result<Materializer> {
        let (tx, rx) = mpsc::sync_channel::<Job>(1);
        let settled = Arc::new(Mutex::new(HashSet::new()));
        let done = settled.clone();
        let cancel = Cancel::default();
        let stop = cancel.clone();
        let thread = std::thread::Builder::new()
            .name("materialize".into())
            .spawn(move || work(&store, rx, &done, &stop))?;
        Ok(Materializer {
            queue: Mutex::new(Some(tx)),
            thread: Mutex::new(Some(thread)),
            policy,
            cancel,
            settled,
        })
    }

    fn sender(&self) -> Option<SyncSender<Job>> {
        self.queue
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }

    /// Queue a materialization if the policy says `gen` is due.
    pub(crate) fn consider(&self, gen: &Gen) {
        let key = (gen.set.clone(), gen.generation);
        let settled = self
            .settled
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .contains(&key);
        if settled || !self.policy.due(gen) {
            return;
        }
        let Some(tx) = self.sender() else { return };
        let job = Job::Materialize {
            set: gen.set.clone(),
            generation: Some(gen.generation),
            reply: None,
        };
        match tx.try_send(job) {
            Ok(()) => info!(
                "policy: materialization of set={} gen={} queued",
                gen.set, gen.generation
            ),
            Err(TrySendError::Full(_)) | Err(TrySendError::Disconnected(_)) => {}
        }
    }

    /// Queue a recovery scan unless a job is already pending.
    pub(crate) fn scan(&self) {
        if let Some(tx) = self.sender() {
            let _ = tx.try_send(Job::Recover);
        }
    }

    /// An explicit request: queued behind at most one job, answered when
    /// done. With `wait`, a task held elsewhere (or waiting to retry) is
    /// tried again from this thread every poll until `wait` (at most
    /// [`MAX_WAIT`]) runs out; the worker itself never waits.
    pub(crate) fn materialize(
        &self,
        set: &str,
        generation: Option<u64>,
        wait: Option<Duration>,
    ) -> Result<Outcome, DaemonError> {
        let start = Instant::now();
        let bound = wait.map(|w| w.min(MAX_WAIT));
        loop {
            match self.attempt(set, generation)? {
                Err(e) if e.kind() == strata::ErrorKind::Conflict => match bound {
                    Some(b) if start.elapsed() < b && !self.cancel.is_cancelled() => {
                        std::thread::sleep(POLL.min(b.saturating_sub(start.elapsed())));
                    }
                    Some(_) => {
                        return Err(DaemonError::Materialize {
                            set: set.to_string(),
                            source: strata::Error::WaitTimeout {
                                what: strata::cli_chain(&e),
                                waited_ms: start.elapsed().as_millis() as u64,
                            },
                        })
                    }
                    None => return Err(materialize_error(set, e)),
                },
                outcome => return outcome.map_err(|e| materialize_error(set, e)),
            }
        }
    }

    /// One attempt on the worker, answered when it ends.
    fn attempt(
        &self,
        set: &str,
        generation: Option<u64>,
    ) -> Result<strata::Result<Outcome>, DaemonError> {
        let tx = self.sender().ok_or(DaemonError::ShuttingDown)?;
        let (reply, answer) = mpsc::channel();
        let job = Job::Materialize {
            set: set.to_string(),
            generation,
            reply: Some(reply),
        };
        tx.send(job).map_err(|_| DaemonError::ShuttingDown)?;
        answer.recv().map_err(|_| DaemonError::WorkerGone {
            set: set.to_string(),
        })
    }

    /// Cancel the running attempt at its next checkpoint (shutdown begins).
    pub(crate) fn cancel(&self) {
        self.cancel.cancel();
    }

    /// Stop admitting work, cancel the running attempt at its next
    /// checkpoint and wait up to `deadline` for the worker, which records
    /// the attempt's outcome before it ends.
    pub(crate) fn shutdown(&self, deadline: Duration) {
        self.queue
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .take();
        self.cancel.cancel();
        let Some(thread) = self
            .thread
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .take()
        else {
            return;
        };
        let start = Instant::now();
        while !thread.is_finished() && start.elapsed() < deadline {
            std::thread::sleep(Duration::from_millis(20));
        }
        if thread.is_finished() {
            let _ = thread.join();
        } else {
            warn!("materialization still running at shutdown (a publication finishing); the recovery scanner of the next start ends its task");
        }
    }
}

/// How often a waiting request re-tries a task held elsewhere.
const POLL: Duration = Duration::from_millis(200);

fn materialize_error(set: &str, source: strata::Error) -> DaemonError {
    DaemonError::Materialize {
        set: set.to_string(),
        source,
    }
}

fn work(
    store: &Store,
    rx: Receiver<Job>,
    settled: &Mutex<HashSet<(String, u64)>>,
    cancel: &Cancel,
) {
    for job in rx {
        match job {
            Job::Materialize {
                set,
                generation,
                reply,
            } => {
                let result = run_one(store, &set, generation, cancel, settled);
                if let Some(reply) = reply {
                    let _ = reply.send(result);
                }
            }
            Job::Recover => scan(store, cancel),
        }
    }
}

fn run_one(
    store: &Store,
    set: &str,
    generation: Option<u64>,
    cancel: &Cancel,
    settled: &Mutex<HashSet<(String, u64)>>,
) -> strata::Result<Outcome> {
    let opts = MaterializeOptions {
        set: set.to_string(),
        generation,
        wait: None,
        plan_only: false,
        cancel: cancel.clone(),
    };
    let result =
        std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| materialize(store, &opts)))
            .unwrap_or_else(|_| Err(strata::Error::internal("materialization panicked")));
    match &result {
        Ok(o) => {
            info!(
                "materialization of set={} gen={}: {}",
                o.set,
                o.generation,
                o.state.map_or("already a base", |s| s.label())
            );
            if o.state.is_none_or(|s| s.is_final()) {
                settled
                    .lock()
                    .unwrap_or_else(PoisonError::into_inner)
                    .insert((o.set.clone(), o.generation));
            }
        }
        // Another worker holds the task, or it waits to retry: not news.
        Err(e) if e.kind() == strata::ErrorKind::Conflict => {
            debug!("materialization of set={set}: {}", strata::cli_chain(e))
        }
        Err(e) => warn!("materialization of set={set}: {}", strata::cli_chain(e)),
    }
    result
}

/// One recovery pass over every task; what it did is logged.
fn scan(store: &Store, cancel: &Cancel) {
    let opts = RecoverOptions {
        cancel: cancel.clone(),
        ..RecoverOptions::default()
    };
    let report = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| recover(store, &opts)))
        .unwrap_or_else(|_| Err(strata::Error::internal("task recovery panicked")));
    match report {
        Ok(r) => {
            for t in r.tasks.iter().filter(|t| t.action != "left") {
                info!(
                    "task recovery: {} set={} gen={}: {} {}",
                    t.id,
                    t.set,
                    t.generation,
                    t.action,
                    t.state.label()
                );
            }
            for c in &r.corrupt {
                warn!("task recovery: corrupt task record {} ({})", c.key, c.error);
            }
        }
        Err(strata::Error::Cancelled(_)) => {}
        Err(e) => warn!("task recovery: {}", strata::cli_chain(&e)),
    }
}
