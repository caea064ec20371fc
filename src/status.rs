//! The figures of `strata status`: per set its latest generation, the
//! committed generations, the rows and segment bytes of latest's base and
//! delta and their ratio, held pins and open materialization tasks; and the
//! store's pins, held and in all; the dedup ratio against the space the
//! last sweep measured. Plain values for a caller to render.

use crate::compose::load_manifest;
use crate::error::Result;
use crate::format::manifest::Manifest;
use crate::format::record::State;
use crate::index::GenIndex;
use crate::pin::{PinInfo, PinState};
use crate::sweep::Space;
use crate::task::{TaskRecord, Tasks};
use crate::Store;
use serde::Serialize;

/// One set's figures.
#[derive(Debug, Clone, Serialize)]
pub struct SetStatus {
    pub set: String,
    pub latest: Option<u64>,
    /// Committed (retained) generations.
    pub generations: u64,
    /// Rows and segment bytes of latest's base, and of its delta if any.
    pub base_rows: u64,
    pub base_bytes: u64,
    pub delta_rows: u64,
    pub delta_bytes: u64,
    /// Delta rows per base row: what materialization policy looks at.
    pub delta_ratio: f64,
    pub held_pins: usize,
    /// Sum of file sizes over every committed generation: what restoring
    /// them all would write.
    pub logical_bytes: u64,
    /// Materialization tasks not yet ended (planned, claimed, waiting...).
    pub open_tasks: usize,
}

/// The store's figures: every set, and its read pins.
#[derive(Debug, Clone)]
pub struct StoreStatus {
    pub sets: Vec<SetStatus>,
    /// Pins whose marker is held.
    pub held_pins: usize,
    /// Every pin marker, held or not.
    pub pins: usize,
    /// Task records that do not parse (`strata tasks --quarantine`).
    pub corrupt_tasks: Vec<crate::task::CorruptTask>,
    /// Sealed journals of interrupted commits the next commit may resume.
    pub resumable_journals: Vec<crate::resumable::Resumable>,
}

/// The figures of every set of the store.
pub fn status(store: &Store) -> Result<StoreStatus> {
    let pins = crate::pin::list(store)?;
    let tasks = Tasks::new(store).list()?;
    let sets = store
        .sets()?
        .iter()
        .map(|s| set_status(store, s, &pins, &tasks.tasks))
        .collect::<Result<Vec<_>>>()?;
    Ok(StoreStatus {
        sets,
        held_pins: pins.iter().filter(|p| p.state == PinState::Held).count(),
        pins: pins.len(),
        corrupt_tasks: tasks.corrupt,
        resumable_journals: crate::resumable::list(store, None)?,
    })
}

/// Stored content bytes (packs, standalone blobs and chunks reachable at
/// the sweep that measured `space`).
pub fn content_bytes(space: &Space) -> u64 {
    ["packs", "blobs", "chunks"]
        .iter()
        .filter_map(|c| space.reachable.get(*c))
        .map(|t| t.bytes)
        .sum()
}

/// Logical bytes of every committed generation of every set per stored
/// content byte: what deduplication across files, generations and sets,
/// holes and compression save together. `None` before anything is stored.
pub fn dedup_ratio(sets: &[SetStatus], space: &Space) -> Option<f64> {
    let logical: u64 = sets.iter().map(|s| s.logical_bytes).sum();
    match content_bytes(space) {
        0 => None,
        stored => Some(logical as f64 / stored as f64),
    }
}

fn segment_bytes(m: &Manifest) -> u64 {
    m.segments.iter().map(|s| s.size).sum()
}

/// One set's figures, given the store's pins and tasks.
fn set_status(
    store: &Store,
    set: &str,
    pins: &[PinInfo],
    tasks: &[TaskRecord],
) -> Result<SetStatus> {
    let all = GenIndex::new(store, set).all()?;
    let committed: Vec<_> = all
        .values()
        .filter(|r| r.state == State::Committed)
        .collect();
    let latest = committed.last().map(|r| r.generation);
    let mut s = SetStatus {
        set: set.to_string(),
        latest,
        generations: committed.len() as u64,
        logical_bytes: committed.iter().map(|r| r.bytes).sum(),
        base_rows: 0,
        base_bytes: 0,
        delta_rows: 0,
        delta_bytes: 0,
        delta_ratio: 0.0,
        held_pins: pins
            .iter()
            .filter(|p| p.set == set && p.state == PinState::Held)
            .count(),
        open_tasks: tasks
            .iter()
            .filter(|t| t.set == set && !t.state.is_final())
            .count(),
    };
    if let Some(rep) = committed.last().and_then(|r| r.read_rep()) {
        let top = load_manifest(store, &rep.manifest)?;
        let base = match &top.base {
            Some(b) => {
                (s.delta_rows, s.delta_bytes) = (top.counts.rows, segment_bytes(&top));
                load_manifest(store, &b.manifest)?
            }
            None => top,
        };
        (s.base_rows, s.base_bytes) = (base.counts.rows, segment_bytes(&base));
        s.delta_ratio = s.delta_rows as f64 / s.base_rows.max(1) as f64;
    }
    Ok(s)
}
