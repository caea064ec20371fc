//! The sweep's report: what it found and did, where the store's space
//! goes, written as the epoch's `report.json` and read back by the next
//! sweep (to skip an unchanged one and reuse pack live ratios), by
//! `strata status` and by the daemon's metrics.

use crate::error::{Error, Result};
use crate::store::{keys, Store};
use crate::sweep::residue::LeaseInfo;
use serde::Serialize;
use std::collections::BTreeMap;

pub(super) const REPORT_TAG: &str = "strata-sweep-report";
/// 1: initial layout.
pub(super) const REPORT_VERSION: u32 = 1;
const MAX_REPORT_BYTES: u64 = 64 << 20;

/// A count of objects and their bytes.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, serde::Deserialize)]
pub struct Tally {
    pub count: u64,
    pub bytes: u64,
}

impl Tally {
    pub(super) fn add(&mut self, bytes: u64) {
        self.count += 1;
        self.bytes += bytes;
    }
}

/// Where the store's space goes.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, serde::Deserialize)]
pub struct Space {
    /// Objects reachable from base representations.
    pub live_base: Tally,
    /// Objects reachable only from delta representations.
    pub live_delta: Tally,
    /// Bytes of live frames inside reachable packs.
    pub packs_live_bytes: u64,
    /// Bytes of frames in reachable packs that no reachable row references
    /// (headers and trailers count as neither).
    pub packs_dead_bytes: u64,
    pub condemned: Tally,
    pub staging: Tally,
    /// Reachable objects by category ("manifests", "segments", "packs",
    /// "blobs", "chunk lists", "chunks") with their stored (listed) sizes.
    #[serde(default)]
    pub reachable: BTreeMap<String, Tally>,
}

/// One reachable pack that is sparse ([`crate::liveness`]): a fold of the
/// rows using it rewrites its live frames.
#[derive(Debug, Clone, Serialize, serde::Deserialize)]
pub struct SparsePack {
    pub name: String,
    pub size: u64,
    pub live_bytes: u64,
}

/// What a sweep found and did.
#[derive(Debug, Clone, Default, Serialize, serde::Deserialize)]
pub struct SweepReport {
    #[serde(rename = "type")]
    pub tag: String,
    pub version: u32,
    pub epoch: u64,
    pub dry_run: bool,
    pub grace_ms: u64,
    pub started_ns: i64,
    pub duration_ms: u64,
    pub mark_ms: u64,
    /// Rows read by the mark for pack live ratios (0: reused, see `liveness_key`).
    #[serde(default)]
    pub mark_rows: u64,
    /// Digest of the reachable manifests the pack live ratios were computed
    /// from; the next sweep reuses them when it reaches the same manifests.
    #[serde(default)]
    pub liveness_key: String,
    /// (set, generation) retired by retention in this sweep.
    pub retired: Vec<(String, u64)>,
    pub roots: Roots,
    /// Objects listed in the store.
    pub objects: u64,
    /// Objects marked reachable.
    pub marked: u64,
    pub space: Space,
    pub sparse_packs: Vec<SparsePack>,
    /// Unreachable now (all, and those first condemned by this sweep).
    pub condemned: Tally,
    pub newly_condemned: Tally,
    /// Condemned earlier and past the grace: what deletion attempts.
    pub deletable: Tally,
    pub deleted: Tally,
    /// Why deletion stopped before the end, if it did.
    pub deferred: Option<String>,
    /// Problems that did not stop the sweep.
    #[serde(default)]
    pub warnings: Vec<String>,
    /// Pins and staging reclaimed (or, dry run, that would be).
    pub reclaimed: Vec<LeaseInfo>,
    /// Markers kept for an operator (invalid bodies).
    pub invalid: Vec<LeaseInfo>,
    /// Keys of the incomplete multipart uploads aborted (or, dry run, that
    /// would be): a remote writer died mid-upload.
    #[serde(default)]
    pub uploads_aborted: Vec<String>,
    /// Nothing changed since the report of `epoch` (same reachable
    /// manifests, condemned objects, space and roots; nothing retired,
    /// reclaimed, condemned anew or deletable), so nothing was written.
    #[serde(default)]
    pub unchanged: bool,
    /// Compacted task records removed after their keep period.
    #[serde(default)]
    pub task_records_removed: u64,
}

/// What the mark started from.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, serde::Deserialize)]
pub struct Roots {
    pub generations: u64,
    pub representations: u64,
    pub pins: u64,
    pub tasks: u64,
    /// What the sweep kept because a root could not be read (a corrupt task
    /// record), one line each naming the record.
    #[serde(default)]
    pub held_back: Vec<String>,
}

/// Bytes in staging directories (live or not yet reclaimed).
pub(super) fn staging_space(store: &Store) -> Result<Tally> {
    let mut t = Tally::default();
    let mut dirs = vec![keys::STAGING.to_string()];
    while let Some(dir) = dirs.pop() {
        // Live attempts create and remove entries meanwhile: a name that
        // turned out to be a file, or vanished, is only not counted.
        let files = match store.storage().list_sizes(&dir) {
            Ok(f) => f,
            Err(_) if dir != keys::STAGING => continue,
            Err(e) => return Err(e),
        };
        for (name, size) in &files {
            if !name.ends_with(".owner") {
                t.add(*size);
            }
        }
        for name in store.storage().list(&dir)? {
            if files.binary_search_by(|(n, _)| n.cmp(&name)).is_err() {
                dirs.push(format!("{dir}/{name}"));
            }
        }
    }
    Ok(t)
}

/// The newest sweep report, if any sweep finished.
pub fn last_report(store: &Store) -> Result<Option<SweepReport>> {
    let mut names: Vec<String> = store
        .storage()
        .list(keys::EPOCH_DIR)?
        .into_iter()
        .filter(|n| n.ends_with(".report.json"))
        .collect();
    names.sort();
    let Some(name) = names.pop() else {
        return Ok(None);
    };
    let key = keys::epoch_file(&name);
    let bytes = store.storage().get(&key, MAX_REPORT_BYTES)?;
    let r: SweepReport = serde_json::from_slice(&bytes)
        .map_err(|e| Error::corrupt("sweep report", &key, e.to_string()))?;
    if r.tag != REPORT_TAG {
        return Err(Error::corrupt("sweep report", &key, "wrong type tag"));
    }
    if r.version > REPORT_VERSION {
        return Err(Error::NewerFormat {
            what: "sweep report",
            found: r.version,
            supported: REPORT_VERSION,
        });
    }
    Ok(Some(r))
}
