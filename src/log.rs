//! The log of a set (`strata log`) and the sets of a store with their
//! latest generation (`strata sets`): read from the generation index, as
//! plain values for a caller to render.

use crate::error::{Error, Result};
use crate::format::record::State;
use crate::index::GenIndex;
use crate::Store;
use serde::Serialize;

/// One generation of a set as the log shows it.
#[derive(Debug, Clone, Serialize)]
pub struct LogEntry {
    pub generation: u64,
    /// `COMMITTED`, `PREPARED` or `RETIRED`.
    pub state: &'static str,
    /// The kind of the representation readers select (`-` for none).
    pub representation: &'static str,
    /// The generation whose base that representation reads (its own for a
    /// base).
    pub base: Option<u64>,
    pub identity: String,
    pub files: u64,
    pub bytes: u64,
    pub committed_ns: Option<i64>,
    pub message: Option<String>,
}

/// The generations of `set`, newest first: the committed ones, or with
/// `all` also those PREPARED (never committed) and RETIRED. `NotFound` for
/// a set without any generation record.
pub fn entries(store: &Store, set: &str, all: bool) -> Result<Vec<LogEntry>> {
    crate::store::check_set_name(set)?;
    let records = GenIndex::new(store, set).all()?;
    if records.is_empty() {
        return Err(Error::NotFound {
            what: "set",
            name: set.to_string(),
        });
    }
    Ok(records
        .into_values()
        .rev()
        .filter(|r| all || r.state == State::Committed)
        .map(|r| {
            let rep = r.read_rep().or(r.representations.first()).cloned();
            LogEntry {
                generation: r.generation,
                state: r.state.label(),
                representation: rep.as_ref().map_or("-", |p| p.kind.label()),
                base: rep.as_ref().and_then(|p| p.base).or(Some(r.generation)),
                identity: r.identity,
                files: r.files,
                bytes: r.bytes,
                committed_ns: r.committed_ns,
                message: r.message,
            }
        })
        .collect())
}

/// The latest generation of a set: its number, files and bytes.
#[derive(Debug, Clone, Copy)]
pub struct Latest {
    pub generation: u64,
    pub files: u64,
    pub bytes: u64,
}

/// Every set of the store, by name, with its latest generation (`None`
/// for a set without a committed one).
pub fn sets(store: &Store) -> Result<Vec<(String, Option<Latest>)>> {
    let mut out = Vec::new();
    for set in store.sets()? {
        let latest = GenIndex::new(store, &set).latest()?.map(|r| Latest {
            generation: r.generation,
            files: r.files,
            bytes: r.bytes,
        });
        out.push((set, latest));
    }
    Ok(out)
}
