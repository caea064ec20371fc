//! Materialization: fold a generation's base + cumulative delta into a new
//! base, as a durable, leased, verified task (`task.rs`). Never a second
//! commit protocol: the generation keeps its number and identity; only its
//! representation changes, and only the index record that commits the new
//! representation changes what readers select.
//!
//! One attempt, each step a named [`Step`]:
//! claim (CLAIMED record, attempt lease held) → protect (pin the source
//! representation, check it is exactly the planned one) → fold (stream rows
//! in key order into staging segments; memory is one row group per input and
//! one per output) → output (segments and manifest in their final
//! content-addressed names, re-read and verified: parse, digests, key order,
//! identity) → OUTPUT_READY → PUBLISHING → PREPARED representation →
//! COMMITTED representation (readers switch; the replaced one is RETIRED and
//! stays readable for its pins) → release the task's pins → PUBLISHED.
//!
//! Sparse packs (live bytes in the generation under
//! [`crate::liveness::REPACK_BELOW`] of their frames) are rewritten on the way: their live frames are copied
//! (verified) into new packs before the fold, and the folded rows point at
//! the copies, so the old packs become unreachable once older
//! representations are retired.
//!
//! A failed attempt records RETRY_WAIT with backoff (FAILED after
//! [`MAX_ATTEMPTS`]); a dead attempt (lease unheld) is taken over with
//! attempt + 1, its staging removed. A takeover after OUTPUT_READY reuses the
//! recorded, re-verified output instead of writing a second copy. A task
//! that ends without publishing withdraws its PREPARED representation
//! first; a refusal before the claim (the disk budget) is recorded with a
//! backoff; a [`Cancel`] stops an attempt at its checkpoints (between row
//! groups, before PREPARED) with RETRY_WAIT due at once; waits are bounded
//! by [`MAX_WAIT`]. `recover.rs` drives every task to a final state.

mod fold;
mod plan;
pub mod recover;
mod repack;
mod verify;

use crate::compose::{GenView, Representation};
use crate::error::{Error, Result};
use crate::failpoint::Step;
use crate::format::manifest::RepKind;
use crate::format::record::{RepRecord, State};
use crate::index::GenIndex;
use crate::staging::Staging;
use crate::storage::fence;
use crate::store::{keys, Store};
use crate::task::{TaskRecord, TaskState, Tasks, MAX_ATTEMPTS};
use fold::fold;
use plan::{pending_task, plan};
use serde::{Deserialize, Serialize};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};
use verify::verify_output;

/// How often a waiting caller re-reads a task someone else works on.
const POLL: Duration = Duration::from_millis(200);

/// What a missing or changed source is reported as (SOURCE_RETIRED).
const SOURCE_GONE: &str = "planned source representation";
/// The longest `--wait` (and its default): a caller never waits unbounded.
pub const MAX_WAIT: Duration = Duration::from_secs(600);

/// A cancellation request an attempt checks between row groups and before
/// its representation is PREPARED (never after: a publication that began
/// is finished). A cancelled attempt records RETRY_WAIT, due at once.
#[derive(Debug, Clone, Default)]
pub struct Cancel(Arc<AtomicBool>);

impl Cancel {
    pub fn cancel(&self) {
        self.0.store(true, Ordering::SeqCst);
    }

    pub fn is_cancelled(&self) -> bool {
        self.0.load(Ordering::SeqCst)
    }

    /// `Err(Cancelled)` once cancelled: a checkpoint.
    pub fn check(&self, at: &str) -> Result<()> {
        match self.is_cancelled() {
            true => Err(Error::Cancelled(format!("attempt stopped {at}"))),
            false => Ok(()),
        }
    }
}

/// What to materialize.
#[derive(Debug, Clone)]
pub struct MaterializeOptions {
    pub set: String,
    /// Latest when `None`.
    pub generation: Option<u64>,
    /// Wait up to this long for another worker's attempt or for a retry
    /// delay instead of returning a conflict (`None`: do not wait). Capped
    /// at [`MAX_WAIT`]; running out is [`Error::WaitTimeout`].
    pub wait: Option<Duration>,
    /// Only plan (create the PLANNED task record).
    pub plan_only: bool,
    /// Checked by the attempt this call runs.
    pub cancel: Cancel,
}

/// How a materialization request ended.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Outcome {
    pub set: String,
    pub generation: u64,
    /// `None` when the generation already reads from a base.
    pub task: Option<String>,
    pub state: Option<TaskState>,
    pub attempt: u32,
    /// Manifest of the new base.
    pub manifest: Option<String>,
    pub rows: u64,
}

/// Plan (or find) the materialization of a generation and drive it to a
/// final state.
pub fn materialize(store: &Store, opts: &MaterializeOptions) -> Result<Outcome> {
    let index = GenIndex::new(store, &opts.set);
    let record = match opts.generation {
        Some(g) => index.load(g)?,
        None => index.latest()?.ok_or_else(|| Error::NotFound {
            what: "committed generation",
            name: opts.set.clone(),
        })?,
    };
    if record.state != State::Committed {
        return Err(Error::Invalid(format!(
            "only a committed generation is materialized: set=`{}` gen={} state={}",
            opts.set,
            record.generation,
            record.state.label()
        )));
    }
    if let Some(pending) = pending_task(store, &opts.set, record.generation)? {
        return drive(store, &pending, opts);
    }
    let Some(task) = plan(store, &record)? else {
        return Ok(Outcome {
            set: opts.set.clone(),
            generation: record.generation,
            task: None,
            state: None,
            attempt: 0,
            manifest: record.read_rep().map(|r| r.manifest.clone()),
            rows: 0,
        });
    };
    if opts.plan_only {
        return Ok(outcome(&task));
    }
    drive(store, &task.id, opts)
}

fn outcome(t: &TaskRecord) -> Outcome {
    Outcome {
        set: t.set.clone(),
        generation: t.target.generation,
        task: Some(t.id.clone()),
        state: Some(t.state),
        attempt: t.attempt,
        manifest: t.output.clone(),
        rows: t.progress_rows,
    }
}

/// Drive task `id` until it is final (or until it is someone else's to
/// move and the wait, if any, ran out).
fn drive(store: &Store, id: &str, opts: &MaterializeOptions) -> Result<Outcome> {
    let tasks = Tasks::new(store);
    let start = Instant::now();
    let bound = opts.wait.map(|w| w.min(MAX_WAIT));
    loop {
        let t = tasks.newest(id)?.ok_or_else(|| Error::NotFound {
            what: "task",
            name: id.to_string(),
        })?;
        if t.state.is_final() {
            return Ok(outcome(&t));
        }
        if let Some(busy) = busy(&tasks, &t)? {
            match bound {
                None => return Err(Error::Conflict(busy)),
                Some(b) if start.elapsed() >= b => {
                    return Err(Error::WaitTimeout {
                        what: busy,
                        waited_ms: start.elapsed().as_millis() as u64,
                    })
                }
                Some(_) => {}
            }
            opts.cancel.check("while waiting")?;
            std::thread::sleep(POLL);
            continue;
        }
        match attempt(store, &t, &opts.cancel) {
            Ok(_) | Err(Error::Conflict(_)) => continue,
            Err(e) => match tasks.newest(id)? {
                Some(now) if now.state.is_final() => return Ok(outcome(&now)),
                _ => return Err(e),
            },
        }
    }
}

/// Why nobody may start an attempt on `t` now, if so.
fn busy(tasks: &Tasks, t: &TaskRecord) -> Result<Option<String>> {
    if t.state.is_claimed() && tasks.owner_alive(t)? {
        return Ok(Some(format!(
            "task is being worked on: task=`{}` attempt={} state={}",
            t.id,
            t.attempt,
            t.state.label()
        )));
    }
    let now = crate::token::now_ns();
    match t.retry_at_ns {
        Some(at) if t.state == TaskState::RetryWait && at > now => Ok(Some(format!(
            "task waits to retry: task=`{}` attempt={} in_ms={} last_error={}",
            t.id,
            t.attempt,
            (at - now) / 1_000_000,
            t.last_error.as_deref().unwrap_or("-")
        ))),
        _ => Ok(None),
    }
}

/// One attempt: claim `t` (taking over a dead attempt), run it, and record
/// how it ended. Returns the last record written.
fn attempt(store: &Store, t: &TaskRecord, cancel: &Cancel) -> Result<TaskRecord> {
    let tasks = Tasks::new(store);
    if t.attempt >= MAX_ATTEMPTS && !publication_started(store, t)? {
        remove_dead_staging(store, t)?;
        return tasks.end_unpublished(t, TaskState::Failed, None);
    }
    let token = crate::token::new_token();
    let holder = format!("materialize pid={} task={}", std::process::id(), t.id);
    let staging = Staging::create(store, &token, &holder)?;
    let admitted =
        output_estimate(store, t).and_then(|need| staging.admission.admit("materialization", need));
    if let Err(e) = admitted {
        return Err(record_refusal(&tasks, t, e));
    }
    remove_dead_staging(store, t)?;
    let mut claimed = t.next(TaskState::Claimed);
    claimed.attempt = t.attempt + 1;
    claimed.owner = Some(token);
    claimed.progress_rows = 0;
    tasks.put(&claimed)?;
    store.failpoints().hit(Step::TaskClaimed)?;
    match run(store, &claimed, &staging, cancel) {
        Ok(done) => Ok(done),
        Err(e) => Err(record_failure(&tasks, &claimed, e)),
    }
}

/// At most what a fold of `t` writes: the size of its source segments (the
/// output holds the same rows, fewer where the delta replaced some) plus
/// half its packs (only packs under half live are rewritten, and only their
/// live part).
fn output_estimate(store: &Store, t: &TaskRecord) -> Result<u64> {
    let size = |key: String| -> Result<u64> { Ok(store.storage().size(&key)?.unwrap_or(0)) };
    let mut total = 0u64;
    for source in &t.sources {
        for s in &source.segments {
            total = total.saturating_add(size(keys::segment(s))?);
        }
        for p in &source.packs {
            total = total.saturating_add(size(keys::pack(p))? / 2);
        }
    }
    Ok(total)
}

/// Whether `t`'s output already is in the index (PREPARED or COMMITTED):
/// then the task is finished rather than failed.
fn publication_started(store: &Store, t: &TaskRecord) -> Result<bool> {
    let Some(output) = &t.output else {
        return Ok(false);
    };
    let now = GenIndex::new(store, &t.set).load(t.target.generation)?;
    Ok(now.representations.iter().any(|r| &r.manifest == output))
}

/// Record a refusal before the claim (the disk budget): RETRY_WAIT with
/// the error and a backoff, the attempt count unchanged, so callers back
/// off instead of re-queueing at once. Returns the error for the caller.
fn record_refusal(tasks: &Tasks, t: &TaskRecord, e: Error) -> Error {
    let mut next = t.next(TaskState::RetryWait);
    next.last_error = Some(crate::cli_chain(&e));
    let delay = TaskRecord::backoff(t.attempt.max(1));
    next.retry_at_ns = Some(next.written_ns + delay.as_nanos() as i64);
    recorded(tasks.put(&next), e)
}

/// Record why an attempt failed; returns the error for the caller. A
/// cancelled attempt waits to retry at once; a task that ends here without
/// publishing withdraws its PREPARED representation first.
fn record_failure(tasks: &Tasks, claimed: &TaskRecord, e: Error) -> Error {
    let Ok(Some(newest)) = tasks.newest(&claimed.id) else {
        return e;
    };
    if newest.owner != claimed.owner || newest.state.is_final() {
        return e;
    }
    let gone = matches!(&e, Error::NotFound { what, .. } if *what == SOURCE_GONE);
    let state = match (gone, claimed.attempt >= MAX_ATTEMPTS) {
        _ if matches!(e, Error::Cancelled(_)) => TaskState::RetryWait,
        (true, _) => TaskState::SourceRetired,
        (_, true) => TaskState::Failed,
        _ => TaskState::RetryWait,
    };
    let error = Some(crate::cli_chain(&e));
    if state.is_final() {
        let ended = tasks.end_unpublished(&newest, state, error).map(|_| ());
        return recorded(ended, e);
    }
    let mut next = newest.next(state);
    next.owner = None;
    next.last_error = error;
    let delay = match e {
        Error::Cancelled(_) => Duration::ZERO,
        _ => TaskRecord::backoff(claimed.attempt),
    };
    next.retry_at_ns = Some(next.written_ns + delay.as_nanos() as i64);
    recorded(tasks.put(&next), e)
}

/// `e`, or `e` and why recording it failed. Losing the record's race is
/// not a failure to record: another worker advanced the task.
fn recorded(put: Result<()>, e: Error) -> Error {
    match put {
        Ok(()) => e,
        Err(Error::Conflict(_)) => e,
        Err(put) => Error::internal(format!(
            "{}; and recording the failure failed: {}",
            crate::cli_chain(&e),
            crate::cli_chain(&put)
        )),
    }
}

/// Remove the staging of the attempt that owned `t`, if that owner is dead.
fn remove_dead_staging(store: &Store, t: &TaskRecord) -> Result<()> {
    let Some(token) = &t.owner else {
        return Ok(());
    };
    if Tasks::new(store).owner_alive(t)? {
        return Err(Error::Conflict(format!(
            "task is being worked on: task=`{}`",
            t.id
        )));
    }
    crate::staging::remove(store, token)
}

/// The claimed attempt from protection to PUBLISHED.
fn run(
    store: &Store,
    claimed: &TaskRecord,
    staging: &Staging,
    cancel: &Cancel,
) -> Result<TaskRecord> {
    let tasks = Tasks::new(store);
    let fp = store.failpoints();
    let index = GenIndex::new(store, &claimed.set);
    let generation = claimed.target.generation;
    let source = &claimed.sources[claimed.sources.len() - 1].manifest;
    if let Some(done) = already_published(store, &tasks, &index, claimed, staging)? {
        return Ok(done);
    }
    let holder = format!("materialize task={}", claimed.id);
    let view =
        GenView::open(store, &claimed.set, Some(generation), &holder).map_err(|e| {
            match e.is_not_found() {
                true => source_gone(claimed),
                false => e,
            }
        })?;
    check_sources(store, claimed, &view)?;
    // A recorded output that no longer verifies is folded again.
    let recorded = claimed
        .output
        .as_ref()
        .and_then(|m| verify_output(store, m, &view).ok().map(|n| (m.clone(), n)));
    let (output, rows) = match recorded {
        Some(done) => done,
        None => fold(store, claimed, &view, staging, cancel)?,
    };
    let mut ready = claimed.next(TaskState::OutputReady);
    ready.output = Some(output.clone());
    ready.progress_rows = rows;
    tasks.put(&ready)?;
    fp.hit(Step::OutputReady)?;
    let publishing = ready.next(TaskState::Publishing);
    tasks.put(&publishing)?;
    let rep = RepRecord {
        kind: RepKind::Base,
        manifest: output.clone(),
        base: None,
        state: State::Prepared,
    };
    cancel.check("before its representation was prepared")?;
    let prepared = {
        let _fence = fence::enter(&[staging.owner()])?;
        index.prepare_rep(generation, source, rep, &claimed.id)?
    };
    fp.hit(Step::RepPrepared)?;
    {
        let _fence = fence::enter(&[staging.owner()])?;
        index.commit_rep(&prepared, &output)?;
    }
    fp.hit(Step::RepCommitted)?;
    drop(view);
    fp.hit(Step::ProtectionTransferred)?;
    finish(&tasks, &index, &publishing)
}

/// After the committed record is re-read: PUBLISHED.
fn finish(tasks: &Tasks, index: &GenIndex, last: &TaskRecord) -> Result<TaskRecord> {
    let output = last.output.as_deref().unwrap_or_default();
    let now = index.load(last.target.generation)?;
    if now.read_rep().map(|r| r.manifest.as_str()) != Some(output) {
        return Err(Error::Conflict(format!(
            "the committed record does not select the output: task=`{}`",
            last.id
        )));
    }
    let mut done = last.next(TaskState::Published);
    done.owner = None;
    tasks.put(&done)?;
    Ok(done)
}

/// A takeover of an attempt that died after PREPARED or COMMITTED finishes
/// its publication instead of folding again.
fn already_published(
    store: &Store,
    tasks: &Tasks,
    index: &GenIndex,
    claimed: &TaskRecord,
    staging: &Staging,
) -> Result<Option<TaskRecord>> {
    let Some(output) = &claimed.output else {
        return Ok(None);
    };
    let now = index.load(claimed.target.generation)?;
    let rep = now.representations.iter().find(|r| &r.manifest == output);
    match rep.map(|r| r.state) {
        Some(State::Committed) => finish(tasks, index, claimed).map(Some),
        Some(State::Prepared) if now.owner == claimed.id => {
            // The step a takeover re-enters: the PREPARED representation is in the index.
            store.failpoints().hit(Step::RepPrepared)?;
            let _fence = fence::enter(&[staging.owner()])?;
            index.commit_rep(&now, output)?;
            finish(tasks, index, claimed).map(Some)
        }
        _ => Ok(None),
    }
}

fn source_gone(t: &TaskRecord) -> Error {
    Error::NotFound {
        what: SOURCE_GONE,
        name: format!("{}@{}", t.set, t.target.generation),
    }
}

/// The pinned view must read exactly the planned sources, and every
/// segment and pack of them must still exist: from here on the pin
/// protects them.
fn check_sources(store: &Store, t: &TaskRecord, view: &GenView) -> Result<()> {
    let reps: Vec<&Representation> = std::iter::once(&view.base).chain(&view.delta).collect();
    let same = reps.len() == t.sources.len()
        && reps.iter().zip(&t.sources).all(|(r, s)| {
            r.manifest_name == s.manifest
                && r.manifest.identity == s.identity
                && r.manifest
                    .segments
                    .iter()
                    .map(|x| &x.name)
                    .eq(s.segments.iter())
                && r.manifest.packs.iter().map(|x| &x.name).eq(s.packs.iter())
        });
    if !same {
        return Err(source_gone(t));
    }
    for s in &t.sources {
        let keys = s
            .segments
            .iter()
            .map(|n| keys::segment(n))
            .chain(s.packs.iter().map(|n| keys::pack(n)));
        for key in keys {
            if store.storage().size(&key)?.is_none() {
                return Err(source_gone(t));
            }
        }
    }
    Ok(())
}
