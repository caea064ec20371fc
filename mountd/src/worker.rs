//! Background materialization in the daemon: one worker thread, one active
//! pass plus at most one pending job (further policy triggers coalesce).
//!
//! The policy looks at each set's latest generation after every refresh: a
//! job is queued when its delta has at least `min_rows` rows and at least
//! `ratio` times as many rows as its base, or its segments take at least
//! `max_bytes`, or its base is older than `max_age`. The job itself re-reads the
//! authoritative index (`strata::materialize`); what the policy saw is only a
//! trigger. Explicit requests from the control socket use the same queue.
//!
//! Shutdown closes the queue, lets the active pass finish within a deadline,
//! and otherwise leaves it: an attempt that dies with the process is taken
//! over on the next start (its lease is released by the kernel).

use crate::error::DaemonError;
use crate::gen::Gen;
use std::collections::HashSet;
use std::sync::mpsc::{self, Receiver, SyncSender, TrySendError};
use std::sync::{Arc, Mutex, PoisonError};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};
use strata::materialize::{materialize, MaterializeOptions, Outcome};
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

struct Job {
    set: String,
    generation: Option<u64>,
    wait: bool,
    reply: Option<Reply>,
}

pub(crate) struct Materializer {
    queue: Mutex<Option<SyncSender<Job>>>,
    thread: Mutex<Option<JoinHandle<()>>>,
    policy: Policy,
    /// Generations whose task reached a final state: not triggered again.
    settled: Arc<Mutex<HashSet<(String, u64)>>>,
}

impl Materializer {
    pub(crate) fn start(store: Store, policy: Policy) -> std::io::Result<Materializer> {
        let (tx, rx) = mpsc::sync_channel::<Job>(1);
        let settled = Arc::new(Mutex::new(HashSet::new()));
        let done = settled.clone();
        let thread = std::thread::Builder::new()
            .name("materialize".into())
            .spawn(move || work(&store, rx, &done))?;
        Ok(Materializer {
            queue: Mutex::new(Some(tx)),
            thread: Mutex::new(Some(thread)),
            policy,
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
        let job = Job {
            set: gen.set.clone(),
            generation: Some(gen.generation),
            wait: false,
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

    /// An explicit request: queued behind at most one job, answered when done.
    pub(crate) fn materialize(
        &self,
        set: &str,
        generation: Option<u64>,
        wait: bool,
    ) -> Result<Outcome, DaemonError> {
        let tx = self.sender().ok_or(DaemonError::ShuttingDown)?;
        let (reply, answer) = mpsc::channel();
        let job = Job {
            set: set.to_string(),
            generation,
            wait,
            reply: Some(reply),
        };
        tx.send(job).map_err(|_| DaemonError::ShuttingDown)?;
        let outcome = answer.recv().map_err(|_| DaemonError::WorkerGone {
            set: set.to_string(),
        })?;
        outcome.map_err(|source| DaemonError::Materialize {
            set: set.to_string(),
            source,
        })
    }

    /// Stop admitting work; wait up to `deadline` for the active pass.
    pub(crate) fn shutdown(&self, deadline: Duration) {
        self.queue
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .take();
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
            warn!("materialization still running at shutdown; its task resumes on the next start");
        }
    }
}

fn work(store: &Store, rx: Receiver<Job>, settled: &Mutex<HashSet<(String, u64)>>) {
    for job in rx {
        let opts = MaterializeOptions {
            set: job.set.clone(),
            generation: job.generation,
            wait: job.wait,
            plan_only: false,
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
            Err(e) if e.kind() == strata::ErrorKind::Conflict => debug!(
                "materialization of set={}: {}",
                job.set,
                strata::cli_chain(e)
            ),
            Err(e) => warn!(
                "materialization of set={}: {}",
                job.set,
                strata::cli_chain(e)
            ),
        }
        if let Some(reply) = job.reply {
            let _ = reply.send(result);
        }
    }
}
