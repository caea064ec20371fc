//! The task recovery scanner: every task that is not final is driven to a
//! final state, so work a crash left behind is finished or released, and
//! every final task's records are compacted. The mount daemon runs it at
//! start and periodically (every set, served or not, every generation);
//! `strata tasks --recover` runs it once.
//!
//! Per task, in pages of [`RecoverOptions::batch`] ids:
//! - final: re-read against the index (a PREPARED representation the task
//!   added is withdrawn if a crash left it), then compacted
//!   ([`Tasks::compact`]);
//! - an attempt holds it (its lease is held), or it waits to retry: left to
//!   a later pass;
//! - its generation is retired or gone, or reads neither the planned source
//!   nor the task's output: SOURCE_RETIRED (withdrawing its PREPARED
//!   representation);
//! - otherwise one attempt: a recorded, re-verified output is published
//!   without folding again (the source is still selected), else the fold
//!   runs; a failure records RETRY_WAIT with backoff, or FAILED with its
//!   evidence after [`crate::task::MAX_ATTEMPTS`].
//!
//! Upholds: no task stays non-final longer than its backoff allows while a
//! scanner runs, and no PREPARED representation outlives its task.

use super::{attempt, busy, remove_dead_staging, Cancel};
use crate::error::{ErrorKind, Result};
use crate::format::record::{IndexRecord, State};
use crate::index::{holds_prepared_rep_of, GenIndex};
use crate::store::Store;
use crate::task::{CorruptTask, TaskRecord, TaskState, Tasks};
use serde::Serialize;

/// Ids read per page.
pub const DEFAULT_BATCH: usize = 64;

/// What a scan covers.
#[derive(Debug, Clone)]
pub struct RecoverOptions {
    /// Only tasks of these sets (`None`: every set).
    pub sets: Option<Vec<String>>,
    /// Ids per page.
    pub batch: usize,
    /// Checked between tasks and by the attempts the scan runs.
    pub cancel: Cancel,
}

impl Default for RecoverOptions {
    fn default() -> RecoverOptions {
        RecoverOptions {
            sets: None,
            batch: DEFAULT_BATCH,
            cancel: Cancel::default(),
        }
    }
}

/// What one task came to in a scan.
#[derive(Debug, Clone, Serialize)]
pub struct Settled {
    pub id: String,
    pub set: String,
    pub generation: u64,
    /// The state the task is in after the scan.
    pub state: TaskState,
    /// What the scan did: `compacted`, `attempted`, `ended`, `left`.
    pub action: &'static str,
    /// Why it was left, or how the attempt failed.
    pub detail: Option<String>,
}

/// One scan's result.
#[derive(Debug, Clone, Default, Serialize)]
pub struct RecoveryReport {
    pub scanned: u64,
    pub tasks: Vec<Settled>,
    /// Records that do not parse (quarantine with `strata tasks --quarantine`).
    pub corrupt: Vec<CorruptTask>,
}

impl RecoveryReport {
    /// Tasks still not final after the scan.
    pub fn open(&self) -> usize {
        self.tasks.iter().filter(|t| !t.state.is_final()).count()
    }
}

/// Scan every task once (page by page).
pub fn recover(store: &Store, opts: &RecoverOptions) -> Result<RecoveryReport> {
    let tasks = Tasks::new(store);
    let mut report = RecoveryReport::default();
    for page in tasks.ids()?.chunks(opts.batch.max(1)) {
        for id in page {
            opts.cancel.check("between tasks")?;
            // Only the live chain: a compacted task is done with (some
            // object stores list its emptied prefix for a while).
            match tasks.newest_live(id) {
                Ok(Some(t)) if covered(opts, &t) => {
                    report.scanned += 1;
                    report.tasks.push(settle(store, t, &opts.cancel)?);
                }
                Ok(_) => {}
                Err(e) if e.kind() == ErrorKind::Corrupt => {
                    report.corrupt.push(CorruptTask::new(id, &e))
                }
                Err(e) => return Err(e),
            }
        }
    }
    Ok(report)
}

fn covered(opts: &RecoverOptions, t: &TaskRecord) -> bool {
    opts.sets.as_ref().is_none_or(|s| s.contains(&t.set))
}

/// Drive task `t` one step toward its end (see the module docs).
fn settle(store: &Store, t: TaskRecord, cancel: &Cancel) -> Result<Settled> {
    let tasks = Tasks::new(store);
    let index = GenIndex::new(store, &t.set);
    if t.state.is_final() {
        index.withdraw_rep(t.target.generation, &t.id)?;
        tasks.compact(&t)?;
        return Ok(settled(&t, t.state, "compacted", None));
    }
    if let Some(why) = busy(&tasks, &t)? {
        return Ok(settled(&t, t.state, "left", Some(why)));
    }
    let generation = index.newest(t.target.generation)?;
    if !source_or_output_selected(generation.as_ref(), &t) {
        remove_dead_staging(store, &t)?;
        let why = "the generation no longer reads the planned source".to_string();
        let ended = tasks.end_unpublished(&t, TaskState::SourceRetired, Some(why))?;
        return Ok(settled(
            &ended,
            ended.state,
            "ended",
            ended.last_error.clone(),
        ));
    }
    match attempt(store, &t, cancel) {
        Ok(done) => Ok(settled(&done, done.state, "attempted", None)),
        Err(e) if e.kind() == ErrorKind::Conflict && !matches!(e, crate::Error::Cancelled(_)) => {
            Ok(settled(&t, t.state, "left", Some(crate::cli_chain(&e))))
        }
        Err(e) => {
            let now = tasks.newest(&t.id)?.unwrap_or(t);
            Ok(settled(
                &now,
                now.state,
                "attempted",
                Some(crate::cli_chain(&e)),
            ))
        }
    }
}

/// Whether the generation is COMMITTED and reads the task's planned source
/// or already its output (PREPARED by it or COMMITTED).
fn source_or_output_selected(generation: Option<&IndexRecord>, t: &TaskRecord) -> bool {
    let Some(r) = generation.filter(|r| r.state == State::Committed) else {
        return false;
    };
    let source = t.sources.last().map(|s| s.manifest.as_str());
    let reads = r.read_rep().map(|x| x.manifest.as_str());
    let output = t.output.as_deref();
    reads == source || (output.is_some() && reads == output) || holds_prepared_rep_of(r, &t.id)
}

fn settled(
    t: &TaskRecord,
    state: TaskState,
    action: &'static str,
    detail: Option<String>,
) -> Settled {
    Settled {
        id: t.id.clone(),
        set: t.set.clone(),
        generation: t.target.generation,
        state,
        action,
        detail,
    }
}
