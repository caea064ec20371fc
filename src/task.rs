//! Durable tasks: `tasks/<id>/<record:06>.json`.
//!
//! A task is a chain of immutable records; a state change is the next record
//! version, created exclusively (the version is the CAS: whoever creates it
//! first wins, the loser re-reads). Records keep their evidence: a failed or
//! cancelled task keeps its last error and attempt. The claim of an attempt
//! is its staging owner lease (`staging/<token>.owner`), so a dead worker is
//! recognized by a lock probe, never by a PID, and its attempt is taken over
//! with attempt + 1 and a fresh token.
//!
//! States: PLANNED → CLAIMED → OUTPUT_READY → PUBLISHING → PUBLISHED;
//! RETRY_WAIT (bounded exponential backoff, at most [`MAX_ATTEMPTS`]);
//! FAILED, CANCELLED and SOURCE_RETIRED are final and change nothing readers
//! see.

use crate::cas::versioned;
use crate::error::{Error, Result};
use crate::format::manifest::RepKind;
use crate::format::parse_versioned;
use crate::store::{keys, Store};
use serde::{Deserialize, Serialize};
use std::time::Duration;

/// 1: initial layout.
pub const TASK_VERSION: u32 = 1;
pub const TASK_TAG: &str = "strata-task";
/// Like manifests: a task lists every segment and pack of its sources.
const MAX_TASK_BYTES: u64 = 64 << 20;
/// Attempts before a task is FAILED.
pub const MAX_ATTEMPTS: u32 = 5;
/// First retry delay; doubled per attempt up to [`MAX_BACKOFF`].
const BASE_BACKOFF: Duration = Duration::from_millis(500);
const MAX_BACKOFF: Duration = Duration::from_secs(60);
/// How long a compacted task's final record is kept (for `strata tasks
/// --all` and for planning, which must not reuse a recent id) before a
/// sweep removes it.
pub const DONE_KEEP: Duration = Duration::from_secs(7 * 24 * 3600);

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "SCREAMING_SNAKE_CASE")]
pub enum TaskState {
    Planned,
    Claimed,
    OutputReady,
    Publishing,
    Published,
    RetryWait,
    Failed,
    Cancelled,
    SourceRetired,
}

impl TaskState {
    /// No worker will act on the task again.
    pub fn is_final(self) -> bool {
        matches!(
            self,
            TaskState::Published
                | TaskState::Failed
                | TaskState::Cancelled
                | TaskState::SourceRetired
        )
    }

    /// An attempt owns the task while its lease is held.
    pub fn is_claimed(self) -> bool {
        matches!(
            self,
            TaskState::Claimed | TaskState::OutputReady | TaskState::Publishing
        )
    }

    pub fn label(self) -> &'static str {
        match self {
            TaskState::Planned => "PLANNED",
            TaskState::Claimed => "CLAIMED",
            TaskState::OutputReady => "OUTPUT_READY",
            TaskState::Publishing => "PUBLISHING",
            TaskState::Published => "PUBLISHED",
            TaskState::RetryWait => "RETRY_WAIT",
            TaskState::Failed => "FAILED",
            TaskState::Cancelled => "CANCELLED",
            TaskState::SourceRetired => "SOURCE_RETIRED",
        }
    }
}

/// One representation a task reads, pinned down to its digests.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SourceRep {
    pub kind: RepKind,
    pub manifest: String,
    pub identity: String,
    pub segments: Vec<String>,
    pub packs: Vec<String>,
}

/// What a materialization produces.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Target {
    pub generation: u64,
    pub representation: RepKind,
}

/// Sizes the plan admits.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Bounds {
    /// Rows the fold reads (base + delta).
    pub rows_in: u64,
    /// Memory budget of the fold, bytes.
    pub budget_bytes: u64,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct TaskRecord {
    #[serde(rename = "type")]
    pub tag: String,
    pub version: u32,
    pub id: String,
    /// Version of this record within the task (1, 2, ...).
    pub record: u32,
    pub set: String,
    pub sources: Vec<SourceRep>,
    pub target: Target,
    pub bounds: Bounds,
    pub state: TaskState,
    pub attempt: u32,
    /// Token of the attempt: names its staging and its owner lease.
    pub owner: Option<String>,
    /// Manifest of the verified output, once OUTPUT_READY.
    pub output: Option<String>,
    pub retry_at_ns: Option<i64>,
    pub last_error: Option<String>,
    /// Rows folded by the attempt that wrote this record.
    pub progress_rows: u64,
    pub written_ns: i64,
}

impl TaskRecord {
    pub fn decode(file: &str, bytes: &[u8]) -> Result<TaskRecord> {
        let t: TaskRecord = parse_versioned("task record", file, TASK_TAG, TASK_VERSION, bytes)?;
        if t.record == 0 || t.sources.is_empty() {
            return Err(Error::corrupt(
                "task record",
                file,
                "record without version or sources",
            ));
        }
        Ok(t)
    }

    /// The next record version with `state`, written now.
    pub fn next(&self, state: TaskState) -> TaskRecord {
        let mut n = self.clone();
        n.record += 1;
        n.state = state;
        n.written_ns = crate::token::now_ns();
        n
    }

    /// Delay before attempt `attempt + 1`.
    pub fn backoff(attempt: u32) -> Duration {
        let factor = 1u32 << attempt.saturating_sub(1).min(16);
        (BASE_BACKOFF * factor).min(MAX_BACKOFF)
    }
}

/// Task ids are `[a-z0-9-]`, at most 128 bytes (they name a directory).
pub fn check_task_id(id: &str) -> Result<()> {
    let ok = !id.is_empty()
        && id.len() <= 128
        && id
            .bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-');
    if !ok {
        return Err(Error::Invalid(format!("malformed task id: id=`{id}`")));
    }
    Ok(())
}

/// Reads and advances task records.
pub struct Tasks {
    store: Store,
}

impl Tasks {
    pub fn new(store: &Store) -> Tasks {
        Tasks {
            store: store.clone(),
        }
    }

    fn try_record(&self, id: &str, record: u32) -> Result<Option<TaskRecord>> {
        let key = keys::task_record(id, record);
        let Some(bytes) = versioned::try_get(&self.store, &key, MAX_TASK_BYTES)? else {
            return Ok(None);
        };
        let t = TaskRecord::decode(&key, &bytes)?;
        if t.id != id || t.record != record {
            return Err(Error::corrupt(
                "task record",
                key,
                "id or version differs from its name",
            ));
        }
        Ok(Some(t))
    }

    /// Newest record of task `id`: its live chain (probing versions
    /// upward), else its compacted final record.
    pub fn newest(&self, id: &str) -> Result<Option<TaskRecord>> {
        match self.newest_live(id)? {
            Some(t) => Ok(Some(t)),
            None => self.done(id),
        }
    }

    /// Newest record of task `id`'s live chain under `tasks/` (`None` once
    /// compacted, even where a store still lists its emptied prefix).
    pub fn newest_live(&self, id: &str) -> Result<Option<TaskRecord>> {
        check_task_id(id)?;
        versioned::newest(|v| self.try_record(id, v))
    }

    /// The compacted final record of task `id`, if it was compacted.
    pub fn done(&self, id: &str) -> Result<Option<TaskRecord>> {
        check_task_id(id)?;
        let key = keys::task_done(id);
        let Some(bytes) = versioned::try_get(&self.store, &key, MAX_TASK_BYTES)? else {
            return Ok(None);
        };
        let t = TaskRecord::decode(&key, &bytes)?;
        if t.id != id || !t.state.is_final() {
            return Err(Error::corrupt(
                "compacted task record",
                key,
                "id differs from its name or the task is not final",
            ));
        }
        Ok(Some(t))
    }

    /// Create `record` exclusively: the CAS on the task's version. Losing is
    /// a conflict the caller answers by re-reading.
    pub fn put(&self, record: &TaskRecord) -> Result<()> {
        let bytes = serde_json::to_vec_pretty(record)
            .map_err(|e| Error::internal_from("encode a task record", e))?;
        let key = keys::task_record(&record.id, record.record);
        versioned::create(&self.store, &key, &bytes, || {
            format!(
                "another worker advanced the task first: task=`{}` record={}",
                record.id, record.record
            )
        })?;
        self.invariant_not_compacted(&record.id, &key)
    }

    /// Protects "final means final": a record created while a compaction
    /// deleted the chain (by a writer that read an older record) is taken
    /// back, since the compacted final record is already the task's state.
    fn invariant_not_compacted(&self, id: &str, key: &str) -> Result<()> {
        if self.done(id)?.is_none() {
            return Ok(());
        }
        self.store.storage().delete(key)?;
        Err(Error::Conflict(format!(
            "task already ended and was compacted: task=`{id}`"
        )))
    }

    /// Whether the attempt that owns `t` is alive (its lease is held).
    pub fn owner_alive(&self, t: &TaskRecord) -> Result<bool> {
        let Some(token) = &t.owner else {
            return Ok(false);
        };
        crate::staging::is_held(&self.store, token)
    }

    /// Cancel task `id`: a CANCELLED record, unless the task is final, an
    /// attempt is working on it (its lease is held), or its publication may
    /// have begun (OUTPUT_READY, PUBLISHING). A dead attempt's staging goes,
    /// and a PREPARED representation the task added is withdrawn. Nothing
    /// readers see changes; the record keeps the last error and attempt.
    pub fn cancel(&self, id: &str) -> Result<TaskRecord> {
        let t = self.newest(id)?.ok_or_else(|| Error::NotFound {
            what: "task",
            name: id.to_string(),
        })?;
        if t.state.is_final() {
            return Err(Error::Conflict(format!(
                "task already ended: task=`{id}` state={}",
                t.state.label()
            )));
        }
        if matches!(t.state, TaskState::OutputReady | TaskState::Publishing) {
            return Err(Error::Conflict(format!(
                "publication may have begun; a worker finishes it: task=`{id}` state={}",
                t.state.label()
            )));
        }
        if t.state.is_claimed() && self.owner_alive(&t)? {
            return Err(Error::Conflict(format!(
                "an attempt is working on the task; retry when it ends: task=`{id}` attempt={}",
                t.attempt
            )));
        }
        let cancelled = self.end_unpublished(&t, TaskState::Cancelled, None)?;
        if let Some(token) = &t.owner {
            crate::staging::remove(&self.store, token)?;
        }
        Ok(cancelled)
    }

    /// Newest record of every task not yet compacted, by id (O(live
    /// tasks): compacted tasks left `tasks/`). A record that does not parse
    /// is reported in `corrupt`, never a reason to fail the listing.
    pub fn list(&self) -> Result<TaskListing> {
        let mut out = TaskListing::default();
        for id in self.ids()? {
            match self.newest_live(&id) {
                Ok(Some(t)) => out.tasks.push(t),
                Ok(None) => {}
                Err(e) if e.kind() == crate::error::ErrorKind::Corrupt => {
                    out.corrupt.push(CorruptTask::new(&id, &e))
                }
                Err(e) => return Err(e),
            }
        }
        Ok(out)
    }

    /// Ids under `tasks/`, sorted.
    pub fn ids(&self) -> Result<Vec<String>> {
        let mut ids: Vec<String> = self
            .store
            .storage()
            .list(keys::TASKS)?
            .into_iter()
            .filter(|id| check_task_id(id).is_ok())
            .collect();
        ids.sort();
        Ok(ids)
    }

    /// The final records of compacted tasks (those not yet removed).
    pub fn compacted(&self) -> Result<Vec<TaskRecord>> {
        let mut out = Vec::new();
        for name in self.store.storage().list(keys::TASKS_DONE)? {
            let Some(id) = name.strip_suffix(".json") else {
                continue;
            };
            if check_task_id(id).is_ok() {
                out.extend(self.done(id)?);
            }
        }
        Ok(out)
    }

    /// Every record of task `id` that still parses, oldest first (what a
    /// corrupt newer record could have protected is found in these).
    pub fn readable_records(&self, id: &str) -> Result<Vec<TaskRecord>> {
        check_task_id(id)?;
        let mut out = Vec::new();
        for name in self.store.storage().list(&keys::task_dir(id))? {
            let Some(v) = record_number(&name) else {
                continue;
            };
            match self.try_record(id, v) {
                Ok(Some(t)) => out.push(t),
                Ok(None) => {}
                Err(e) if e.kind() == crate::error::ErrorKind::Corrupt => {}
                Err(e) => return Err(e),
            }
        }
        out.sort_by_key(|t| t.record);
        Ok(out)
    }

    /// Compact final task `t` (the caller re-read it against the index):
    /// its final record is written once under `tasks-done/`, then its
    /// record chain and checkpoints go. Readers find it there by id.
    pub fn compact(&self, t: &TaskRecord) -> Result<()> {
        if !t.state.is_final() {
            return Err(Error::internal(format!(
                "only a final task is compacted: task=`{}` state={}",
                t.id,
                t.state.label()
            )));
        }
        let bytes = serde_json::to_vec_pretty(t)
            .map_err(|e| Error::internal_from("encode a task record", e))?;
        versioned::create_or_existing(&self.store, &keys::task_done(&t.id), &bytes)?;
        self.store.storage().delete_dir(&keys::task_dir(&t.id))
    }

    /// Remove compacted records finished more than `keep` ago; returns how
    /// many went. Reads every compacted record: run it with the sweep, not
    /// on a daemon's idle passes.
    pub fn remove_expired(&self, keep: Duration, now_ns: i64) -> Result<u64> {
        let mut removed = 0;
        for name in self.store.storage().list(keys::TASKS_DONE)? {
            let Some(id) = name.strip_suffix(".json") else {
                continue;
            };
            if check_task_id(id).is_err() {
                continue;
            }
            let expired = match self.done(id) {
                Ok(Some(t)) => now_ns.saturating_sub(t.written_ns).max(0) as u128 > keep.as_nanos(),
                Ok(None) => false,
                Err(e) if e.kind() == crate::error::ErrorKind::Corrupt => {
                    tracing::warn!(
                        "compacted task record unreadable; kept: {}",
                        crate::cli_chain(&e)
                    );
                    false
                }
                Err(e) => return Err(e),
            };
            if expired {
                self.store.storage().delete(&keys::task_done(id))?;
                removed += 1;
            }
        }
        Ok(removed)
    }

    /// Move every file of task `id` to `tasks-quarantine/<id>/`; returns the
    /// keys moved. The caller has confirmed nothing the task protects is at risk.
    pub fn quarantine_files(&self, id: &str) -> Result<Vec<String>> {
        check_task_id(id)?;
        let storage = self.store.storage();
        let mut moved = Vec::new();
        for name in storage.list(&keys::task_dir(id))? {
            let from = format!("{}/{name}", keys::task_dir(id));
            let bytes = storage.get(&from, MAX_TASK_BYTES)?;
            versioned::create_or_existing(&self.store, &keys::task_quarantined(id, &name), &bytes)?;
            moved.push(from);
        }
        storage.delete_dir(&keys::task_dir(id))?;
        Ok(moved)
    }
}

/// How a set is spelled inside a task id (`[a-z0-9-]`): its non-alphanumeric
/// bytes as `-`, letters lowercased.
pub fn id_spelling(set: &str) -> String {
    set.bytes()
        .map(|b| match b.is_ascii_alphanumeric() {
            true => b.to_ascii_lowercase() as char,
            false => '-',
        })
        .collect()
}

/// The (set, generation) a materialization task id names, for a task none
/// of whose records can be read: the id is `materialize-<set>-<gen>-<hex>`
/// with the set's non-alphanumeric bytes as `-`, so every set of the store
/// that spells the same is returned.
pub fn target_of_id(store: &Store, id: &str) -> Result<Vec<(String, u64)>> {
    let Some(rest) = id.strip_prefix("materialize-") else {
        return Ok(Vec::new());
    };
    let mut parts: Vec<&str> = rest.split('-').collect();
    if parts
        .last()
        .is_some_and(|p| p.starts_with('r') && p[1..].parse::<u32>().is_ok())
    {
        parts.pop();
    }
    parts.pop();
    let Some(generation) = parts.pop().and_then(|g| g.parse::<u64>().ok()) else {
        return Ok(Vec::new());
    };
    let spelled = parts.join("-");
    let sets = store.sets()?;
    Ok(sets
        .into_iter()
        .filter(|s| id_spelling(s) == spelled)
        .map(|s| (s, generation))
        .collect())
}

/// `NNNNNN.json`: a record's version.
fn record_number(name: &str) -> Option<u32> {
    let stem = name.strip_suffix(".json")?;
    (stem.len() == 6).then(|| stem.parse().ok()).flatten()
}

/// The live tasks and the records that would not parse.
#[derive(Debug, Clone, Default, Serialize)]
pub struct TaskListing {
    pub tasks: Vec<TaskRecord>,
    pub corrupt: Vec<CorruptTask>,
}

/// A task whose newest record does not parse: reported with its key.
#[derive(Debug, Clone, Serialize)]
pub struct CorruptTask {
    pub id: String,
    /// The record that failed (as the store names it).
    pub key: String,
    pub error: String,
}

impl CorruptTask {
    pub fn new(id: &str, e: &Error) -> CorruptTask {
        CorruptTask {
            id: id.to_string(),
            key: e.object().unwrap_or(id).to_string(),
            error: crate::cli_chain(e),
        }
    }
}

/// An attempt's advisory checkpoint (`tasks/<id>/checkpoint.<attempt>.json`):
/// how far its fold got. A hint for operators and later workers, never an
/// authority: no step is skipped because of it, and every output is
/// verified in full.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Checkpoint {
    #[serde(rename = "type")]
    pub tag: String,
    pub version: u32,
    pub task: String,
    pub attempt: u32,
    /// Rows the fold has written.
    pub rows_folded: u64,
    /// Bytes of segments the fold has written.
    pub bytes_written: u64,
    /// `[hex(parent), hex(name)]` of the last row of the last full row group.
    pub last_key: Option<[String; 2]>,
    pub written_ns: i64,
}

pub const CHECKPOINT_TAG: &str = "strata-task-checkpoint";
/// 1: initial layout.
pub const CHECKPOINT_VERSION: u32 = 1;
const MAX_CHECKPOINT_BYTES: u64 = 64 << 10;
/// How often an attempt replaces its checkpoint.
const CHECKPOINT_EVERY: Duration = Duration::from_secs(1);

/// Writes one attempt's checkpoint, at most every [`CHECKPOINT_EVERY`]. The
/// attempt is the only writer: each write is a CAS on the bytes it wrote last.
pub struct CheckpointWriter {
    store: Store,
    key: String,
    last: Option<Vec<u8>>,
    due: std::time::Instant,
    pub progress: Checkpoint,
}

impl CheckpointWriter {
    pub fn new(store: &Store, t: &TaskRecord) -> CheckpointWriter {
        CheckpointWriter {
            store: store.clone(),
            key: keys::task_checkpoint(&t.id, t.attempt),
            last: None,
            due: std::time::Instant::now() + CHECKPOINT_EVERY,
            progress: Checkpoint {
                tag: CHECKPOINT_TAG.into(),
                version: CHECKPOINT_VERSION,
                task: t.id.clone(),
                attempt: t.attempt,
                rows_folded: 0,
                bytes_written: 0,
                last_key: None,
                written_ns: 0,
            },
        }
    }

    /// Write the checkpoint if one is due.
    pub fn tick(&mut self) {
        if std::time::Instant::now() >= self.due {
            self.write();
        }
    }

    /// Write the checkpoint now. A failure is logged, never fatal: the
    /// checkpoint is advisory.
    pub fn write(&mut self) {
        self.due = std::time::Instant::now() + CHECKPOINT_EVERY;
        self.progress.written_ns = crate::token::now_ns();
        let Ok(bytes) = serde_json::to_vec_pretty(&self.progress) else {
            return;
        };
        let storage = self.store.storage();
        match storage.cas(&self.key, self.last.as_deref(), &bytes) {
            Ok(crate::storage::CasOutcome::Swapped) => self.last = Some(bytes),
            Ok(_) => tracing::warn!(
                "task checkpoint changed under its attempt: key={}",
                self.key
            ),
            Err(e) => tracing::warn!("task checkpoint not written: {}", crate::cli_chain(&e)),
        }
    }
}

impl Tasks {
    /// The checkpoint of attempt `attempt` of task `id`, if one was written.
    pub fn checkpoint(&self, id: &str, attempt: u32) -> Result<Option<Checkpoint>> {
        check_task_id(id)?;
        let key = keys::task_checkpoint(id, attempt);
        let Some(bytes) = versioned::try_get(&self.store, &key, MAX_CHECKPOINT_BYTES)? else {
            return Ok(None);
        };
        parse_versioned(
            "task checkpoint",
            &key,
            CHECKPOINT_TAG,
            CHECKPOINT_VERSION,
            &bytes,
        )
        .map(Some)
    }

    /// End `t` without publishing (`state` is FAILED, CANCELLED or
    /// SOURCE_RETIRED): first withdraw the PREPARED representation the task
    /// added, an index change after which retention and sweeps no longer
    /// count it, then the final record. A crash between the two leaves a
    /// task the recovery scanner ends again (the withdrawal is then a no-op).
    pub fn end_unpublished(
        &self,
        t: &TaskRecord,
        state: TaskState,
        last_error: Option<String>,
    ) -> Result<TaskRecord> {
        if !state.is_final() || state == TaskState::Published {
            return Err(Error::internal(format!(
                "not an unpublished end: state={}",
                state.label()
            )));
        }
        crate::index::GenIndex::new(&self.store, &t.set)
            .withdraw_rep(t.target.generation, &t.id)?;
        let mut next = t.next(state);
        next.owner = None;
        if last_error.is_some() {
            next.last_error = last_error;
        }
        self.put(&next)?;
        Ok(next)
    }
}

/// What `strata tasks --quarantine` did.
#[derive(Debug, Clone, Serialize)]
pub struct Quarantined {
    pub id: String,
    /// Keys moved to `tasks-quarantine/<id>/`.
    pub moved: Vec<String>,
    /// (set, generation) whose PREPARED representation of the task was withdrawn.
    pub withdrawn: Vec<(String, u64)>,
}

impl Tasks {
    /// Move aside the records of task `id`, whose newest record does not
    /// parse, once nothing it could protect is at risk: no attempt of it is
    /// alive (every owner its readable records name is unheld) and a
    /// PREPARED representation it added is withdrawn (no reader selects a
    /// PREPARED representation; its sources stay protected by the index
    /// wherever the generation still reads them).
    pub fn quarantine(&self, id: &str) -> Result<Quarantined> {
        match self.newest_live(id) {
            Err(e) if e.kind() == crate::error::ErrorKind::Corrupt => {}
            Err(e) => return Err(e),
            Ok(None) => {
                return Err(Error::NotFound {
                    what: "task",
                    name: id.to_string(),
                })
            }
            Ok(Some(t)) => {
                return Err(Error::Invalid(format!(
                    "task records parse; quarantine is for a corrupt one (use --cancel): task=`{id}` state={}",
                    t.state.label()
                )))
            }
        }
        let readable = self.readable_records(id)?;
        for token in readable.iter().filter_map(|t| t.owner.as_ref()) {
            if crate::staging::is_held(&self.store, token)? {
                return Err(Error::Conflict(format!(
                    "an attempt of the task is alive; retry when it ends: task=`{id}` owner=`{token}`"
                )));
            }
        }
        let targets = match readable.last() {
            Some(t) => vec![(t.set.clone(), t.target.generation)],
            None => target_of_id(&self.store, id)?,
        };
        let mut withdrawn = Vec::new();
        for (set, generation) in targets {
            let index = crate::index::GenIndex::new(&self.store, &set);
            if index.withdraw_rep(generation, id)?.is_some() {
                withdrawn.push((set, generation));
            }
        }
        let moved = self.quarantine_files(id)?;
        Ok(Quarantined {
            id: id.to_string(),
            moved,
            withdrawn,
        })
    }
}
