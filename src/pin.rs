//! Pins (read markers): `pins/<set>/<gen:020>-<token>.pin`, a file held with
//! an exclusive OS lock for as long as a reader uses one representation of a
//! generation. A sweep may reclaim a pin file only when a lock probe finds it
//! unheld (invariant 4), never by reading the holder text.
//!
//! Protocol: take the pin first, then re-read the index and verify the pinned
//! representation is still COMMITTED; retry a bounded number of times.

use crate::error::{Error, Result};
use crate::format::record::{IndexRecord, RepRecord, State};
use crate::index::GenIndex;
use crate::storage::{Lease, Storage, TryLease};
use crate::store::{keys, Store};
use serde::Serialize;
use std::sync::{Arc, Mutex, PoisonError};

/// How often pin-then-verify is retried when the index changes underneath.
const PIN_RETRIES: usize = 5;

#[derive(Serialize)]
struct PinBody<'a> {
    #[serde(rename = "type")]
    tag: &'static str,
    version: u32,
    set: &'a str,
    generation: u64,
    representation: &'a str,
    manifest: &'a str,
    holder: String,
    since_ns: i64,
}

/// A held pin; dropping it removes the marker and releases the lock.
#[derive(Debug)]
pub struct Pin {
    storage: Arc<dyn Storage>,
    holder: String,
    marker: Mutex<Marker>,
    pub record: IndexRecord,
    pub rep: RepRecord,
}

/// The marker a pin holds now (a lost one is replaced by [`Pin::keep`]).
#[derive(Debug)]
struct Marker {
    key: String,
    lease: Option<Box<dyn Lease>>,
}

impl Marker {
    fn remove(&mut self, storage: &dyn Storage) {
        if let Err(e) = storage.delete(&self.key) {
            tracing::warn!(
                "pin marker not removed; a sweep reclaims it once unheld: key=`{}` error=`{}`",
                self.key,
                crate::cli_chain(&e)
            );
        }
        self.lease.take();
    }
}

impl Drop for Pin {
    fn drop(&mut self) {
        let marker = self
            .marker
            .get_mut()
            .unwrap_or_else(PoisonError::into_inner);
        marker.remove(&*self.storage);
    }
}

impl Pin {
    /// Keep the pin held. A remote pin's lease is lost when its holder
    /// stalled past the ttl and a sweep reclaimed the marker; then a fresh
    /// marker is taken for the same representation, provided the index
    /// still has it COMMITTED (pin first, then verify, as when pinning).
    /// Ok(true) when the marker was replaced.
    pub fn keep(&self, store: &Store) -> Result<bool> {
        let mut marker = self.marker.lock().unwrap_or_else(PoisonError::into_inner);
        match marker.lease.as_ref().map(|l| l.check()) {
            Some(Ok(_)) => return Ok(false),
            Some(Err(e)) if e.kind() != crate::error::ErrorKind::Conflict => return Err(e),
            _ => {}
        }
        let mut fresh = take_marker(store, &self.record, &self.rep, &self.holder)?;
        let index = GenIndex::new(store, &self.record.set);
        if !still_committed(&index, &self.record, &self.rep)? {
            fresh.remove(&*self.storage);
            return Err(Error::NotFound {
                what: "representation",
                name: format!(
                    "{}@{} {} (no longer committed; its pin was lost)",
                    self.record.set, self.record.generation, self.rep.manifest
                ),
            });
        }
        std::mem::replace(&mut *marker, fresh).remove(&*self.storage);
        Ok(true)
    }
}

/// Pin the readable representation of `generation` (or of latest).
pub fn pin(store: &Store, set: &str, generation: Option<u64>, holder: &str) -> Result<Pin> {
    let index = GenIndex::new(store, set);
    for _ in 0..PIN_RETRIES {
        let record = resolve(&index, generation)?;
        let rep = record
            .read_rep()
            .cloned()
            .ok_or_else(|| Error::corrupt("index record", set, "no committed representation"))?;
        let pin = take(
            store,
            &record,
            &rep,
            &format!("{holder} pid={}", std::process::id()),
        )?;
        if still_committed(&index, &record, &rep)? {
            return Ok(pin);
        }
    }
    Err(Error::Conflict(format!(
        "index kept changing while pinning: set=`{set}`"
    )))
}

/// Whether the index still has `rep` of `record`'s generation COMMITTED.
fn still_committed(index: &GenIndex, record: &IndexRecord, rep: &RepRecord) -> Result<bool> {
    let now = index.load(record.generation)?;
    Ok(now.state == State::Committed
        && now
            .representations
            .iter()
            .any(|r| r.manifest == rep.manifest && r.state == State::Committed))
}

fn resolve(index: &GenIndex, generation: Option<u64>) -> Result<IndexRecord> {
    let record = match generation {
        Some(g) => index.load(g)?,
        None => index.latest()?.ok_or_else(|| Error::NotFound {
            what: "set",
            name: index.set().to_string(),
        })?,
    };
    match record.state {
        State::Committed => Ok(record),
        State::Prepared => Err(Error::NotFound {
            what: "generation",
            name: format!("{}@{} (not committed)", index.set(), record.generation),
        }),
        State::Retired => Err(Error::NotFound {
            what: "generation",
            name: format!("{}@{} (retired)", index.set(), record.generation),
        }),
    }
}

fn take(store: &Store, record: &IndexRecord, rep: &RepRecord, holder: &str) -> Result<Pin> {
    Ok(Pin {
        storage: store.storage().clone(),
        holder: holder.to_string(),
        marker: Mutex::new(take_marker(store, record, rep, holder)?),
        record: record.clone(),
        rep: rep.clone(),
    })
}

/// Create and lock a fresh marker for `rep` of `record`'s generation.
fn take_marker(
    store: &Store,
    record: &IndexRecord,
    rep: &RepRecord,
    holder: &str,
) -> Result<Marker> {
    let token = crate::token::new_token();
    let key = format!(
        "{}/{:020}-{token}.pin",
        keys::pin_dir(&record.set),
        record.generation
    );
    let body = PinBody {
        tag: "strata-pin",
        version: 1,
        set: &record.set,
        generation: record.generation,
        representation: rep.kind.label(),
        manifest: &rep.manifest,
        holder: holder.to_string(),
        since_ns: crate::token::now_ns(),
    };
    let text =
        serde_json::to_string(&body).map_err(|e| Error::internal_from("encode a pin marker", e))?;
    match store.storage().lease(&key, &text, false)? {
        TryLease::Acquired(lease) => Ok(Marker {
            key,
            lease: Some(lease),
        }),
        TryLease::Busy { .. } => Err(Error::internal(format!(
            "fresh pin name already locked: key=`{key}`"
        ))),
    }
}

/// Liveness of a pin as decided by a lock probe.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum PinState {
    Held,
    Unheld,
    /// The marker's body does not parse; reported, never removed blindly.
    Invalid,
}

/// One pin marker as `strata pins` reports it.
#[derive(Debug, Clone, Serialize)]
pub struct PinInfo {
    pub key: String,
    pub state: PinState,
    /// Whether the marker's lock is held (also known for an invalid body).
    pub held: bool,
    pub set: String,
    pub generation: u64,
    pub representation: String,
    pub manifest: String,
    pub holder: String,
    pub since_ns: i64,
}

#[derive(serde::Deserialize)]
struct PinRecord {
    #[serde(rename = "type")]
    tag: String,
    version: u32,
    set: String,
    generation: u64,
    representation: String,
    manifest: String,
    holder: String,
    since_ns: i64,
}

/// Every pin marker of the store with its probed state.
pub fn list(store: &Store) -> Result<Vec<PinInfo>> {
    let mut out = Vec::new();
    for set in store.storage().list(keys::PINS)? {
        for name in store.storage().list(&keys::pin_dir(&set))? {
            if !name.ends_with(".pin") {
                continue;
            }
            let key = keys::pin(&set, &name);
            if let Some(info) = inspect(store, &key)? {
                out.push(info);
            }
        }
    }
    Ok(out)
}

/// Probe one marker; `None` if it vanished meanwhile (released).
fn inspect(store: &Store, key: &str) -> Result<Option<PinInfo>> {
    // A lease object that does not parse (remote stores) is an invalid
    // marker for an operator, not a reason to stop looking at the others.
    let state = match store.storage().probe_lease(key) {
        Ok(crate::storage::LeaseState::Missing) => return Ok(None),
        Ok(crate::storage::LeaseState::Held { .. }) => PinState::Held,
        Ok(crate::storage::LeaseState::Unheld) => PinState::Unheld,
        Err(e) if e.kind() == crate::error::ErrorKind::Corrupt => PinState::Invalid,
        Err(e) => return Err(e),
    };
    let body = match store.storage().lease_holder(key) {
        Ok(Some(b)) => b,
        Ok(None) => return Ok(None),
        Err(e) if e.kind() == crate::error::ErrorKind::Corrupt => String::new(),
        Err(e) => return Err(e),
    };
    let held = state == PinState::Held;
    let parsed = serde_json::from_str::<PinRecord>(&body)
        .ok()
        .filter(|p| p.tag == "strata-pin" && p.version == 1);
    Ok(Some(match parsed {
        Some(p) => PinInfo {
            key: key.to_string(),
            state,
            held,
            set: p.set,
            generation: p.generation,
            representation: p.representation,
            manifest: p.manifest,
            holder: p.holder,
            since_ns: p.since_ns,
        },
        None => PinInfo {
            key: key.to_string(),
            state: PinState::Invalid,
            held,
            set: String::new(),
            generation: 0,
            representation: String::new(),
            manifest: String::new(),
            holder: String::new(),
            since_ns: 0,
        },
    }))
}
