//! The generation index: per set, the authoritative record of every
//! generation and its representations, plus the `latest` hint.
//!
//! Invariant 1 lives here: visibility changes only by creating the next
//! record version of a generation exclusively. A generation is visible once
//! its newest record is COMMITTED. `latest` is the highest COMMITTED
//! generation, found by probing forward from the hint pointer; the hint is
//! advanced by pointer CAS after the commit and never decides anything.

use crate::cas::pointer::{self, Counted};
use crate::cas::versioned;
use crate::error::{Error, Result};
use crate::format::pointer::{LatestPointer, MAX_POINTER_BYTES, POINTER_TAG, POINTER_VERSION};
use crate::format::record::{IndexRecord, RepRecord, State, MAX_RECORD_BYTES};
use crate::store::{keys, Store};
use std::collections::BTreeMap;

impl Counted for LatestPointer {
    fn counter(&self) -> u64 {
        self.counter
    }
}

/// Reads and writes the index of one set.
#[derive(Debug, Clone)]
pub struct GenIndex {
    store: Store,
    set: String,
}

impl GenIndex {
    pub fn new(store: &Store, set: &str) -> GenIndex {
        GenIndex {
            store: store.clone(),
            set: set.to_string(),
        }
    }

    pub fn set(&self) -> &str {
        &self.set
    }

    fn try_record(&self, generation: u64, record: u32) -> Result<Option<IndexRecord>> {
        let key = keys::index_record(&self.set, generation, record);
        let Some(bytes) = versioned::try_get(&self.store, &key, MAX_RECORD_BYTES)? else {
            return Ok(None);
        };
        let r = IndexRecord::decode(&key, &bytes)?;
        self.check(r, generation, record, &key).map(Some)
    }

    fn check(
        &self,
        r: IndexRecord,
        generation: u64,
        record: u32,
        key: &str,
    ) -> Result<IndexRecord> {
        if r.set != self.set || r.generation != generation || r.record != record {
            return Err(Error::corrupt(
                "index record",
                key,
                "set, generation or version differs from its name",
            ));
        }
        Ok(r)
    }

    /// Newest record of `generation`, probing versions upward.
    pub fn newest(&self, generation: u64) -> Result<Option<IndexRecord>> {
        versioned::newest(|v| self.try_record(generation, v))
    }

    /// Newest record of a generation that must exist.
    pub fn load(&self, generation: u64) -> Result<IndexRecord> {
        self.newest(generation)?.ok_or_else(|| Error::NotFound {
            what: "generation",
            name: format!("{}@{generation}", self.set),
        })
    }

    fn hint(&self) -> Result<Option<(LatestPointer, Vec<u8>)>> {
        let key = keys::latest(&self.set);
        let Some(bytes) = versioned::try_get(&self.store, &key, MAX_POINTER_BYTES)? else {
            return Ok(None);
        };
        Ok(Some((LatestPointer::decode(&key, &bytes)?, bytes)))
    }

    /// The authoritative latest COMMITTED generation, `None` for an empty set.
    pub fn latest(&self) -> Result<Option<IndexRecord>> {
        let start = self.hint()?.map(|(p, _)| p.generation).unwrap_or(0);
        let mut best = match start {
            0 => None,
            g => Some(self.load(g)?).filter(|r| r.state != State::Prepared),
        };
        let mut g = best.as_ref().map(|r| r.generation).unwrap_or(0);
        while let Some(r) = self.newest(g + 1)? {
            if r.state == State::Prepared {
                break;
            }
            g += 1;
            best = Some(r);
        }
        Ok(best)
    }

    /// Newest record of every generation, by generation.
    pub fn all(&self) -> Result<BTreeMap<u64, IndexRecord>> {
        let mut newest: BTreeMap<u64, u32> = BTreeMap::new();
        for name in self.store.storage().list(&keys::index_dir(&self.set))? {
            if let Some((g, v)) = IndexRecord::parse_name(&name) {
                let e = newest.entry(g).or_insert(v);
                *e = (*e).max(v);
            }
        }
        let mut out = BTreeMap::new();
        for (g, v) in newest {
            let key = keys::index_record(&self.set, g, v);
            let bytes = self.store.storage().get(&key, MAX_RECORD_BYTES)?;
            out.insert(
                g,
                self.check(IndexRecord::decode(&key, &bytes)?, g, v, &key)?,
            );
        }
        Ok(out)
    }

    /// Create `record` exclusively; losing the race is a conflict.
    fn create(&self, record: &IndexRecord) -> Result<()> {
        let key = keys::index_record(&self.set, record.generation, record.record);
        versioned::create(&self.store, &key, &record.encode()?, || {
            format!(
                "another writer created this index record first: set=`{}` generation={} record={}",
                self.set, record.generation, record.record
            )
        })
    }

    /// Write `record` as the PREPARED record of its generation. A dead
    /// writer's PREPARED record is superseded (the caller holds the set's
    /// write lease, so its owner is gone); a COMMITTED one is a conflict.
    pub fn prepare(&self, mut record: IndexRecord) -> Result<IndexRecord> {
        let current = self.newest(record.generation)?;
        invariant_generation_unpublished(current.as_ref())?;
        record.record = current.map(|r| r.record + 1).unwrap_or(1);
        record.state = State::Prepared;
        self.create(&record)?;
        Ok(record)
    }

    /// Record `source`, another store's record of the next generation of
    /// this set, as RETIRED here: a copy keeps generation numbers where it
    /// has no content to copy (the caller holds the set's write lease).
    pub fn record_retired(&self, source: &IndexRecord, owner: &str) -> Result<IndexRecord> {
        let current = self.newest(source.generation)?;
        invariant_generation_unpublished(current.as_ref())?;
        let latest = self.latest()?.map(|r| r.generation);
        let mut next = source.clone();
        next.parent = latest;
        invariant_parent_is_latest(&next, latest)?;
        next.record = current.map(|r| r.record + 1).unwrap_or(1);
        next.state = State::Retired;
        next.owner = owner.to_string();
        next.written_ns = crate::token::now_ns();
        for r in &mut next.representations {
            r.state = State::Retired;
        }
        self.create(&next)?;
        Ok(next)
    }

    /// Move our PREPARED record to COMMITTED: the visibility point.
    pub fn commit(&self, prepared: &IndexRecord) -> Result<IndexRecord> {
        let current = self.newest(prepared.generation)?;
        invariant_prepared_is_newest(prepared, current.as_ref())?;
        let latest = self.latest()?.map(|r| r.generation);
        invariant_parent_is_latest(prepared, latest)?;
        let mut committed = prepared.clone();
        committed.record += 1;
        committed.state = State::Committed;
        committed.written_ns = crate::token::now_ns();
        committed.committed_ns = Some(committed.written_ns);
        for rep in &mut committed.representations {
            rep.state = State::Committed;
        }
        self.create(&committed)?;
        Ok(committed)
    }

    /// Add `rep` as a PREPARED representation of committed `generation`,
    /// provided its newest record still selects `source` for reading. `owner`
    /// names the writer (a task id), so any attempt of that task may commit it.
    pub fn prepare_rep(
        &self,
        generation: u64,
        source: &str,
        rep: RepRecord,
        owner: &str,
    ) -> Result<IndexRecord> {
        let current = self.load(generation)?;
        invariant_source_still_selected(&current, source)?;
        let mut next = current;
        next.record += 1;
        next.representations.retain(|r| r.state != State::Prepared);
        next.representations.push(RepRecord {
            state: State::Prepared,
            ..rep
        });
        next.owner = owner.to_string();
        next.written_ns = crate::token::now_ns();
        self.create(&next)?;
        Ok(next)
    }

    /// Commit representation `manifest` of `prepared` (our newest record):
    /// the only step that changes what readers of the generation select.
    /// The representation it replaces is RETIRED; pins still hold it.
    pub fn commit_rep(&self, prepared: &IndexRecord, manifest: &str) -> Result<IndexRecord> {
        let current = self.load(prepared.generation)?;
        invariant_rep_prepared_by_us(prepared, &current, manifest)?;
        let mut next = current;
        next.record += 1;
        next.written_ns = crate::token::now_ns();
        for r in &mut next.representations {
            r.state = match r.manifest == manifest {
                true => State::Committed,
                false => State::Retired,
            };
        }
        self.create(&next)?;
        Ok(next)
    }

    /// Withdraw the PREPARED representation task `owner` added to
    /// `generation`: the next record without it, so nothing (retention, a
    /// sweep root) counts it again. `None` when there is none of `owner`'s
    /// (already withdrawn, committed, or the generation is gone).
    pub fn withdraw_rep(&self, generation: u64, owner: &str) -> Result<Option<IndexRecord>> {
        let Some(current) = self.newest(generation)? else {
            return Ok(None);
        };
        if !holds_prepared_rep_of(&current, owner) {
            return Ok(None);
        }
        let mut next = current;
        next.record += 1;
        next.written_ns = crate::token::now_ns();
        next.representations.retain(|r| r.state != State::Prepared);
        self.create(&next)?;
        Ok(Some(next))
    }

    /// Retire `current` (the newest record of a COMMITTED generation that is
    /// not latest): the next record, RETIRED with every representation. It
    /// is never selected again; pins taken earlier still hold what they read.
    pub fn retire(&self, current: &IndexRecord, owner: &str) -> Result<IndexRecord> {
        let now = self.load(current.generation)?;
        let latest = self.latest()?.map(|r| r.generation);
        invariant_retire_unchanged_not_latest(current, &now, latest)?;
        let mut next = now;
        next.record += 1;
        next.state = State::Retired;
        next.owner = owner.to_string();
        next.written_ns = crate::token::now_ns();
        for r in &mut next.representations {
            r.state = State::Retired;
        }
        self.create(&next)?;
        Ok(next)
    }

    /// Advance the hint to `generation` unless it already names a later one.
    pub fn advance_hint(&self, generation: u64) -> Result<()> {
        let key = keys::latest(&self.set);
        pointer::update(
            &self.store,
            &key,
            "latest hint",
            || self.hint(),
            |current, stamp| {
                if !invariant_hint_moves_forward(current, generation) {
                    return Ok(None);
                }
                let next = LatestPointer {
                    tag: POINTER_TAG.into(),
                    version: POINTER_VERSION,
                    set: self.set.clone(),
                    generation,
                    counter: stamp.counter,
                    nonce: stamp.nonce,
                };
                next.encode().map(Some)
            },
        )?;
        Ok(())
    }
}

/// Protects readers' starting point: the hint only moves forward (a
/// later generation's commit may have advanced it already).
fn invariant_hint_moves_forward(current: Option<&LatestPointer>, generation: u64) -> bool {
    current.is_none_or(|p| p.generation < generation)
}

/// Protects immutability of published generations: a generation that was
/// ever COMMITTED (or RETIRED) is never prepared again.
fn invariant_generation_unpublished(current: Option<&IndexRecord>) -> Result<()> {
    match current {
        Some(r) if r.state != State::Prepared => Err(Error::Conflict(format!(
            "generation was already published by another writer: set=`{}` generation={}",
            r.set, r.generation
        ))),
        _ => Ok(()),
    }
}

/// Protects against committing a stale preparation: the record we prepared
/// must still be the newest record of its generation.
fn invariant_prepared_is_newest(
    prepared: &IndexRecord,
    current: Option<&IndexRecord>,
) -> Result<()> {
    match current {
        Some(c)
            if c.record == prepared.record
                && c.owner == prepared.owner
                && c.state == State::Prepared =>
        {
            Ok(())
        }
        _ => Err(Error::Conflict(format!(
            "prepared record was superseded before commit: set=`{}` generation={}",
            prepared.set, prepared.generation
        ))),
    }
}

/// Protects linear history: a generation commits only on top of the
/// latest generation it was prepared against (never overwriting a newer one).
fn invariant_parent_is_latest(prepared: &IndexRecord, latest: Option<u64>) -> Result<()> {
    if latest == prepared.parent && prepared.generation == latest.unwrap_or(0) + 1 {
        return Ok(());
    }
    Err(Error::Conflict(format!(
        "latest moved while committing: set=`{}` expected_parent={:?} latest={:?}",
        prepared.set, prepared.parent, latest
    )))
}

/// Protects a materialization from publishing over a changed generation:
/// the generation is still COMMITTED and still read through `source`.
fn invariant_source_still_selected(current: &IndexRecord, source: &str) -> Result<()> {
    let selected = current.read_rep().map(|r| r.manifest.as_str());
    if current.state == State::Committed && selected == Some(source) {
        return Ok(());
    }
    Err(Error::Conflict(format!(
        "generation changed since the task was planned: set=`{}` generation={} state={} reads={:?}",
        current.set,
        current.generation,
        current.state.label(),
        selected
    )))
}

/// Protects against committing someone else's (or a stale) preparation:
/// the newest record is the one we prepared, with `manifest` PREPARED.
fn invariant_rep_prepared_by_us(
    prepared: &IndexRecord,
    current: &IndexRecord,
    manifest: &str,
) -> Result<()> {
    let ours = current.record == prepared.record
        && current.owner == prepared.owner
        && current.state == State::Committed
        && current
            .representations
            .iter()
            .any(|r| r.manifest == manifest && r.state == State::Prepared);
    if ours {
        return Ok(());
    }
    Err(Error::Conflict(format!(
        "prepared representation was superseded before commit: set=`{}` generation={}",
        prepared.set, prepared.generation
    )))
}

/// Which record a withdrawal may follow: one whose PREPARED representation
/// was added by `owner` (a task id) and is still there.
pub fn holds_prepared_rep_of(current: &IndexRecord, owner: &str) -> bool {
    current.owner == owner
        && current
            .representations
            .iter()
            .any(|r| r.state == State::Prepared)
}

/// Protects `latest` and concurrent record changes from retention: only the
/// record retention decided on, still newest and COMMITTED, and not the
/// latest generation (latest only moves forward, so it stays safe).
fn invariant_retire_unchanged_not_latest(
    decided: &IndexRecord,
    current: &IndexRecord,
    latest: Option<u64>,
) -> Result<()> {
    if current.record == decided.record
        && current.state == State::Committed
        && latest.is_some_and(|l| l > current.generation)
    {
        return Ok(());
    }
    Err(Error::Conflict(format!(
        "generation changed or is latest; not retired: set=`{}` generation={} state={} latest={:?}",
        current.set,
        current.generation,
        current.state.label(),
        latest
    )))
}
