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
//! recorded, re-verified output instead of writing a second copy.

use crate::compose::{GenView, Representation};
use crate::error::{Error, Result};
use crate::failpoint::Step;
use crate::format::manifest::RepKind;
use crate::format::record::{IndexRecord, RepRecord, State};
use crate::identity::IdentityHasher;
use crate::index::GenIndex;
use crate::liveness::FrameUse;
use crate::pack_writer::RollingPacks;
use crate::rep_writer::{store_manifest, RepHead, RepWriter};
use crate::row::{BlobLoc, Row};
use crate::staging::Staging;
use crate::storage::fence;
use crate::store::{keys, Store};
use crate::task::{
    Bounds, SourceRep, Target, TaskRecord, TaskState, Tasks, MAX_ATTEMPTS, TASK_TAG, TASK_VERSION,
};
use serde::{Deserialize, Serialize};
use std::collections::{HashMap, HashSet};
use std::time::Duration;

/// Memory the fold may use (recorded in the plan; the fold itself holds one
/// decoded row group per input and one output group).
const FOLD_BUDGET: u64 = 64 << 20;
/// How often a waiting caller re-reads a task someone else works on.
const POLL: Duration = Duration::from_millis(200);
/// Blobs relocated per task at most (bounds the relocation map).
const REPACK_MAX_BLOBS: usize = 500_000;

/// What a missing or changed source is reported as (SOURCE_RETIRED).
const SOURCE_GONE: &str = "planned source representation";
/// Tasks planned per generation representation at most (a task that ended
/// FAILED, CANCELLED or SOURCE_RETIRED is followed by a new one).
const MAX_PLANS: u32 = 100;

/// Where repacked blobs now live, by digest.
type Relocated = HashMap<[u8; 32], BlobLoc>;

/// What to materialize.
#[derive(Debug, Clone)]
pub struct MaterializeOptions {
    pub set: String,
    /// Latest when `None`.
    pub generation: Option<u64>,
    /// Wait for another worker's attempt or for a retry delay instead of
    /// returning a conflict.
    pub wait: bool,
    /// Only plan (create the PLANNED task record).
    pub plan_only: bool,
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
        return drive(store, &pending, opts.wait);
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
    drive(store, &task.id, opts.wait)
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

/// An unfinished task for (`set`, `generation`): one that died after the
/// new representation became readable still needs its final records.
fn pending_task(store: &Store, set: &str, generation: u64) -> Result<Option<String>> {
    let tasks = Tasks::new(store).list()?;
    Ok(tasks
        .into_iter()
        .find(|t| t.set == set && t.target.generation == generation && !t.state.is_final())
        .map(|t| t.id))
}

/// The task id: the target and the exact source it reads, so planning the
/// same work twice finds the existing task.
fn task_id(set: &str, generation: u64, source_manifest: &str) -> String {
    let set: String = set
        .bytes()
        .map(|b| match b.is_ascii_alphanumeric() {
            true => b as char,
            false => '-',
        })
        .collect();
    format!(
        "materialize-{set}-{generation}-{}",
        source_manifest.get(..16).unwrap_or(source_manifest)
    )
}

fn numbered(first: &str, n: u32) -> String {
    match n {
        1 => first.to_string(),
        n => format!("{first}-r{n}"),
    }
}

/// Ended without publishing: a new task may be planned after it.
fn ended_unpublished(t: &TaskRecord) -> bool {
    t.state.is_final() && t.state != TaskState::Published
}

/// The task for a source: a live or published one, or the id a new one gets.
enum Slot {
    Existing(Box<TaskRecord>),
    Free(String),
}

fn task_slot(tasks: &Tasks, record: &IndexRecord, manifest: &str) -> Result<Slot> {
    let first = task_id(&record.set, record.generation, manifest);
    for n in 1..=MAX_PLANS {
        let id = numbered(&first, n);
        match tasks.newest(&id)? {
            None => return Ok(Slot::Free(id)),
            Some(t) if ended_unpublished(&t) => continue,
            Some(t) => return Ok(Slot::Existing(Box::new(t))),
        }
    }
    Err(Error::Conflict(format!(
        "{MAX_PLANS} tasks for this generation ended without publishing: set=`{}` gen={}",
        record.set, record.generation
    )))
}

/// The PLANNED task for `record` (or the existing task for the same target
/// and source); `None` when the generation already reads from a base.
fn plan(store: &Store, record: &IndexRecord) -> Result<Option<TaskRecord>> {
    let rep = record.read_rep().ok_or_else(|| {
        Error::corrupt("index record", &record.set, "no committed representation")
    })?;
    if rep.kind == RepKind::Base {
        return Ok(None);
    }
    let tasks = Tasks::new(store);
    let id = match task_slot(&tasks, record, &rep.manifest)? {
        Slot::Existing(t) => return Ok(Some(*t)),
        Slot::Free(id) => id,
    };
    let top = Representation::open(store, &rep.manifest)?;
    let base_name = top
        .manifest
        .base
        .as_ref()
        .map(|b| b.manifest.clone())
        .ok_or_else(|| Error::corrupt("manifest", &rep.manifest, "delta without a base"))?;
    let base = Representation::open(store, &base_name)?;
    let source = |r: &Representation| SourceRep {
        kind: r.kind(),
        manifest: r.manifest_name.clone(),
        identity: r.manifest.identity.clone(),
        segments: r.manifest.segments.iter().map(|s| s.name.clone()).collect(),
        packs: r.manifest.packs.iter().map(|p| p.name.clone()).collect(),
    };
    let planned = TaskRecord {
        tag: TASK_TAG.into(),
        version: TASK_VERSION,
        id,
        record: 1,
        set: record.set.clone(),
        sources: vec![source(&base), source(&top)],
        target: Target {
            generation: record.generation,
            representation: RepKind::Base,
        },
        bounds: Bounds {
            rows_in: base.manifest.counts.rows + top.manifest.counts.rows,
            budget_bytes: FOLD_BUDGET,
        },
        state: TaskState::Planned,
        attempt: 0,
        owner: None,
        output: None,
        retry_at_ns: None,
        last_error: None,
        progress_rows: 0,
        written_ns: crate::token::now_ns(),
    };
    match tasks.put(&planned) {
        Ok(()) => Ok(Some(planned)),
        Err(Error::Conflict(_)) => tasks.newest(&planned.id),
        Err(e) => Err(e),
    }
}

/// Drive task `id` until it is final (or, without `wait`, until it is
/// someone else's to move).
fn drive(store: &Store, id: &str, wait: bool) -> Result<Outcome> {
    let tasks = Tasks::new(store);
    loop {
        let t = tasks.newest(id)?.ok_or_else(|| Error::NotFound {
            what: "task",
            name: id.to_string(),
        })?;
        if t.state.is_final() {
            return Ok(outcome(&t));
        }
        if let Some(busy) = busy(&tasks, &t)? {
            if !wait {
                return Err(Error::Conflict(busy));
            }
            std::thread::sleep(POLL);
            continue;
        }
        match attempt(store, &t) {
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
fn attempt(store: &Store, t: &TaskRecord) -> Result<TaskRecord> {
    let tasks = Tasks::new(store);
    if t.attempt >= MAX_ATTEMPTS && !publication_started(store, t)? {
        remove_dead_staging(store, t)?;
        let mut failed = t.next(TaskState::Failed);
        failed.owner = None;
        tasks.put(&failed)?;
        return Ok(failed);
    }
    let token = crate::token::new_token();
    let holder = format!("materialize pid={} task={}", std::process::id(), t.id);
    let staging = Staging::create(store, &token, &holder)?;
    staging
        .admission
        .admit("materialization", output_estimate(store, t)?)?;
    remove_dead_staging(store, t)?;
    let mut claimed = t.next(TaskState::Claimed);
    claimed.attempt = t.attempt + 1;
    claimed.owner = Some(token);
    claimed.progress_rows = 0;
    tasks.put(&claimed)?;
    store.failpoints().hit(Step::TaskClaimed)?;
    match run(store, &claimed, &staging) {
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

/// Record why an attempt failed; returns the error for the caller.
fn record_failure(tasks: &Tasks, claimed: &TaskRecord, e: Error) -> Error {
    let Ok(Some(newest)) = tasks.newest(&claimed.id) else {
        return e;
    };
    if newest.owner != claimed.owner || newest.state.is_final() {
        return e;
    }
    let gone = matches!(&e, Error::NotFound { what, .. } if *what == SOURCE_GONE);
    let state = match (gone, claimed.attempt >= MAX_ATTEMPTS) {
        (true, _) => TaskState::SourceRetired,
        (_, true) => TaskState::Failed,
        _ => TaskState::RetryWait,
    };
    let mut next = newest.next(state);
    next.owner = None;
    next.last_error = Some(crate::cli_chain(&e));
    let delay = TaskRecord::backoff(claimed.attempt);
    next.retry_at_ns = Some(next.written_ns + delay.as_nanos() as i64);
    match tasks.put(&next) {
        Ok(()) => e,
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
fn run(store: &Store, claimed: &TaskRecord, staging: &Staging) -> Result<TaskRecord> {
    let tasks = Tasks::new(store);
    let fp = store.failpoints();
    let index = GenIndex::new(store, &claimed.set);
    let generation = claimed.target.generation;
    let source = &claimed.sources[claimed.sources.len() - 1].manifest;
    if let Some(done) = already_published(&tasks, &index, claimed)? {
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
        None => fold(store, claimed, &view, staging)?,
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
    tasks: &Tasks,
    index: &GenIndex,
    claimed: &TaskRecord,
) -> Result<Option<TaskRecord>> {
    let Some(output) = &claimed.output else {
        return Ok(None);
    };
    let now = index.load(claimed.target.generation)?;
    let rep = now.representations.iter().find(|r| &r.manifest == output);
    match rep.map(|r| r.state) {
        Some(State::Committed) => finish(tasks, index, claimed).map(Some),
        Some(State::Prepared) if now.owner == claimed.id => {
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

/// Fold the view into a base in staging, move it to its final names and
/// verify it; returns the manifest name and the rows written.
fn fold(store: &Store, t: &TaskRecord, view: &GenView, staging: &Staging) -> Result<(String, u64)> {
    let relocated = repack(store, view, staging)?;
    let mut writer = RepWriter::new(&staging.dir.join("segments"))?;
    let mut rows = view.rows()?;
    while let Some(mut r) = rows.next_row()? {
        if let Some(loc) = r.digest.and_then(|d| relocated.get(&d)) {
            r.blob = *loc;
        }
        writer.live(&r);
        writer.write(r)?;
    }
    let staged = writer.finish()?;
    store.failpoints().hit(Step::Folded)?;
    if staged.identity != view.pin.record.identity {
        return Err(Error::corrupt(
            "materialized rows",
            &t.id,
            "identity differs from the generation's",
        ));
    }
    let segments = staged.store_segments(store)?;
    let manifest = staged.manifest(store, base_head(view), segments)?;
    let name = store_manifest(store, &manifest)?;
    let rows = verify_output(store, &name, view)?;
    Ok((name, rows))
}

/// The generation's sparse packs that rows still use: their live frames
/// are rewritten (`crate::liveness`, the rule the sweep reports by).
fn sparse_packs(store: &Store, view: &GenView) -> Result<HashSet<[u8; 32]>> {
    let reps = || std::iter::once(&view.base).chain(&view.delta);
    if reps().all(|rep| rep.manifest.packs.is_empty()) {
        return Ok(HashSet::new());
    }
    let mut used = FrameUse::default();
    let mut rows = view.rows()?;
    while let Some(r) = rows.next_row()? {
        used.add(r.blob);
    }
    let mut sparse = HashSet::new();
    let mut listed = HashSet::new();
    for p in reps().flat_map(|rep| rep.manifest.packs.iter()) {
        let Some(name) = hex::decode(&p.name)
            .ok()
            .and_then(|b| <[u8; 32]>::try_from(b).ok())
        else {
            continue;
        };
        if !listed.insert(name) {
            continue;
        }
        let pack = used.pack_use(store, name, p.size);
        if pack.live > 0 && pack.is_sparse() {
            sparse.insert(name);
        }
    }
    Ok(sparse)
}

/// Copy the live frames of sparse packs into new packs (verified on the
/// way) and say where each relocated blob now lives.
fn repack(store: &Store, view: &GenView, staging: &Staging) -> Result<Relocated> {
    let sparse = sparse_packs(store, view)?;
    let mut relocated = Relocated::new();
    if sparse.is_empty() {
        return Ok(relocated);
    }
    let mut out = RollingPacks::new(store, &staging.dir.join("repack"))?;
    let mut rows = view.rows()?;
    while let Some(r) = rows.next_row()? {
        let (BlobLoc::Packed { pack, codec, .. }, Some(d)) = (r.blob, r.digest) else {
            continue;
        };
        let seen = relocated.contains_key(&d) || out.pending(|p| *p == d);
        if !sparse.contains(&pack)
            || seen
            || relocated.len() + out.pending_count() >= REPACK_MAX_BLOBS
        {
            continue;
        }
        let frame = crate::blob::packed_frame(store, &r)?;
        relocated.extend(out.append(d, d, codec, r.size, &frame)?);
    }
    relocated.extend(out.seal()?);
    Ok(relocated)
}

/// The new base keeps the generation's bindings, instant and message.
fn base_head(view: &GenView) -> RepHead {
    let top = &view.top().manifest;
    RepHead {
        set: top.set.clone(),
        generation: top.generation,
        representation: RepKind::Base,
        base: None,
        parent: top.parent.clone(),
        observed_ns: top.observed_ns,
        message: top.message.clone(),
        journal: None,
    }
}

/// Re-read an output representation: the manifest and every segment parse
/// and match their digests, rows ascend strictly, relocated frames match
/// their digests, and the recomputed identity and counts equal the
/// generation's. Returns the row count.
fn verify_output(store: &Store, manifest: &str, view: &GenView) -> Result<u64> {
    let rep = Representation::open(store, manifest)?;
    let bad = |check: &str| Error::corrupt("materialized base", manifest, check.to_string());
    if rep.kind() != RepKind::Base || rep.manifest.generation != view.generation() {
        return Err(bad("not a base of this generation"));
    }
    // Frames in packs the sources do not list were relocated by this task:
    // each is read back and checked against its row's digest.
    let source_packs: HashSet<[u8; 32]> = std::iter::once(&view.base)
        .chain(&view.delta)
        .flat_map(|r| r.manifest.packs.iter())
        .filter_map(|p| hex::decode(&p.name).ok()?.try_into().ok())
        .collect();
    let check = |seg| check_segment(store, &rep, seg, &source_packs, &bad);
    let mut hasher = IdentityHasher::new();
    let mut last: Option<Row> = None;
    let mut n = 0u64;
    let segments: Vec<usize> = (0..rep.segment_count()).collect();
    for batch in segments.chunks(VERIFY_PARALLEL) {
        for checked in check_parallel(batch, &check) {
            let checked = checked?;
            let joins = match (&last, &checked.first) {
                (Some(l), Some(f)) => l.key_cmp(f).is_lt(),
                _ => true,
            };
            if !joins {
                return Err(bad("rows out of key order"));
            }
            hasher.push_encoded(&checked.encoded);
            n += checked.rows;
            last = checked.last.or(last);
        }
    }
    if hasher.finish() != view.pin.record.identity || n != rep.manifest.counts.rows {
        return Err(bad("identity or row count differs"));
    }
    Ok(n)
}

/// Output segments checked at once (each on its own thread, which decodes
/// and drops its own rows; only the encoded identity bytes cross over).
const VERIFY_PARALLEL: usize = 2;

/// What checking one output segment found.
struct CheckedSegment {
    first: Option<Row>,
    last: Option<Row>,
    /// The identity encoding of its rows, in order.
    encoded: Vec<u8>,
    rows: u64,
}

fn check_parallel(
    segments: &[usize],
    check: &(impl Fn(usize) -> Result<CheckedSegment> + Sync),
) -> Vec<Result<CheckedSegment>> {
    std::thread::scope(|s| {
        let running: Vec<_> = segments
            .iter()
            .map(|&i| s.spawn(move || check(i)))
            .collect();
        running
            .into_iter()
            .map(|h| {
                h.join()
                    .unwrap_or_else(|_| Err(Error::internal("a verify thread panicked")))
            })
            .collect()
    })
}

/// Decode segment `seg` of the output, check its rows ascend and its
/// relocated frames, and encode its rows for the identity.
fn check_segment(
    store: &Store,
    rep: &Representation,
    seg: usize,
    source_packs: &HashSet<[u8; 32]>,
    bad: &(impl Fn(&str) -> Error + Sync),
) -> Result<CheckedSegment> {
    let mut out = CheckedSegment {
        first: None,
        last: None,
        encoded: Vec::new(),
        rows: 0,
    };
    for group in 0..rep.group_count(seg)? {
        for r in rep.read_group(seg, group)? {
            if out.last.as_ref().is_some_and(|p| p.key_cmp(&r).is_ge()) {
                return Err(bad("rows out of key order"));
            }
            if let BlobLoc::Packed { pack, .. } = r.blob {
                if !source_packs.contains(&pack) {
                    crate::blob::packed_frame(store, &r)?;
                }
            }
            crate::identity::encode_row(&r, &mut out.encoded);
            out.rows += 1;
            if out.first.is_none() {
                out.first = Some(r.clone());
            }
            out.last = Some(r);
        }
    }
    Ok(out)
}
