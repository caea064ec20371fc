//! Planning: the task for a generation's representation. A task's id names
//! its target and the exact source it reads, so planning the same work twice
//! finds the existing task; one that ended without publishing is followed by
//! a numbered successor.

use crate::compose::Representation;
use crate::error::{Error, Result};
use crate::format::manifest::RepKind;
use crate::format::record::IndexRecord;
use crate::store::Store;
use crate::task::{
    Bounds, SourceRep, Target, TaskRecord, TaskState, Tasks, TASK_TAG, TASK_VERSION,
};

/// Memory the fold may use (recorded in the plan; the fold itself holds one
/// decoded row group per input and one output group).
const FOLD_BUDGET: u64 = 64 << 20;
/// Tasks planned per generation representation at most (a task that ended
/// FAILED, CANCELLED or SOURCE_RETIRED is followed by a new one).
const MAX_PLANS: u32 = 100;

/// An unfinished task for (`set`, `generation`): one that died after the
/// new representation became readable still needs its final records.
pub(super) fn pending_task(store: &Store, set: &str, generation: u64) -> Result<Option<String>> {
    let tasks = Tasks::new(store).list()?;
    Ok(tasks
        .tasks
        .into_iter()
        .find(|t| t.set == set && t.target.generation == generation && !t.state.is_final())
        .map(|t| t.id))
}

/// The task id: the target and the exact source it reads, so planning the
/// same work twice finds the existing task.
fn task_id(set: &str, generation: u64, source_manifest: &str) -> String {
    let set = crate::task::id_spelling(set);
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
pub(super) fn plan(store: &Store, record: &IndexRecord) -> Result<Option<TaskRecord>> {
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
