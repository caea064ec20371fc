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

    /// Newest record of task `id`, probing versions upward.
    pub fn newest(&self, id: &str) -> Result<Option<TaskRecord>> {
        check_task_id(id)?;
        versioned::newest(|v| self.try_record(id, v))
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
        })
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
    /// have begun (OUTPUT_READY, PUBLISHING). A dead attempt's staging goes. Nothing readers see
    /// changes; the record keeps the last error and attempt.
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
        let mut cancelled = t.next(TaskState::Cancelled);
        cancelled.owner = None;
        self.put(&cancelled)?;
        if let Some(token) = &t.owner {
            crate::staging::remove(&self.store, token)?;
        }
        Ok(cancelled)
    }

    /// Newest record of every task, by id.
    pub fn list(&self) -> Result<Vec<TaskRecord>> {
        let mut out = Vec::new();
        for id in self.store.storage().list(keys::TASKS)? {
            if check_task_id(&id).is_err() {
                continue;
            }
            if let Some(t) = self.newest(&id)? {
                out.push(t);
            }
        }
        Ok(out)
    }
}
