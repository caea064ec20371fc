//! Resumable journals: the sealed journals dead commits left, which the
//! next commit of their set may resume from (`commit::resume`).
//!
//! A commit seals its journal only after every pack, blob and chunk it
//! names is durable under its final name (`Step::BlobsDurable`, then
//! `Step::JournalSealed`). If the commit then dies, its sealed journal stays
//! in `journals/<set>/` for [`RESUME_KEEP`] while it was observed on the
//! set's latest generation; sweeps mark what it names for as long
//! ([`protected_refs`]), and the next commit of the set removes the ones no
//! commit can resume ([`clean`]): unsealed, expired, or observed on a parent
//! that is no longer the latest. Local stores only: on an object store the
//! journal lives in the host's scratch directory, which does not outlive
//! the attempt.

use crate::error::Result;
use crate::format::journal::{JournalHeader, JournalReader};
use crate::row::{Kind, Row};
use crate::store::{keys, Store};
use std::path::PathBuf;
use std::time::Duration;

/// How long a dead commit's sealed journal stays resumable (and its
/// objects protected from sweeps).
pub const RESUME_KEEP: Duration = Duration::from_secs(24 * 3600);

/// A sealed journal left by a dead commit.
#[derive(Debug, Clone, serde::Serialize)]
pub struct Resumable {
    pub key: String,
    pub token: String,
    pub set: String,
    pub generation: u64,
    pub parent: Option<u64>,
    pub created_ns: i64,
    /// Seconds it stays resumable.
    pub expires_in_s: u64,
    #[serde(skip)]
    pub(crate) header: JournalHeader,
    #[serde(skip)]
    pub(crate) path: PathBuf,
}

/// Why a journal is not resumable.
enum Unusable {
    Held,
    Unsealed,
    /// Past [`RESUME_KEEP`], or observed on a parent that is no longer the
    /// set's latest generation.
    Expired,
}

/// Sealed journals of dead commits in `set` (every set when `None`),
/// observed on their set's latest generation and not yet expired.
pub fn list(store: &Store, set: Option<&str>) -> Result<Vec<Resumable>> {
    let sets = match set {
        Some(s) => vec![s.to_string()],
        None => store.storage().list(keys::JOURNALS)?,
    };
    let mut out = Vec::new();
    for s in sets {
        for name in store.storage().list(&keys::journal_dir(&s))? {
            let Some(token) = name.strip_suffix(".journal") else {
                continue;
            };
            if let Ok(r) = examine(store, &s, token) {
                out.push(r);
            }
        }
    }
    Ok(out)
}

fn examine(store: &Store, set: &str, token: &str) -> std::result::Result<Resumable, Unusable> {
    let key = keys::journal(set, token);
    let Some(path) = store.storage().local_path(&key) else {
        return Err(Unusable::Unsealed);
    };
    if crate::staging::is_held(store, token).unwrap_or(true) {
        return Err(Unusable::Held);
    }
    let reader = JournalReader::open(&path).map_err(|_| Unusable::Unsealed)?;
    let header = reader.header().clone();
    let age_ns = crate::token::now_ns()
        .saturating_sub(header.created_ns)
        .max(0) as u64;
    let left = RESUME_KEEP.saturating_sub(Duration::from_nanos(age_ns));
    let latest = crate::index::GenIndex::new(store, set)
        .latest()
        .map_err(|_| Unusable::Expired)?
        .map(|r| r.generation);
    if left.is_zero() || header.set != set || header.parent != latest {
        return Err(Unusable::Expired);
    }
    Ok(Resumable {
        key,
        token: token.to_string(),
        set: set.to_string(),
        generation: header.generation,
        parent: header.parent,
        created_ns: header.created_ns,
        expires_in_s: left.as_secs(),
        header,
        path,
    })
}

/// Remove the journals of `set` no commit can resume: unsealed, expired or
/// stale ones of dead owners. Returns how many went.
pub fn clean(store: &Store, set: &str) -> Result<u64> {
    let mut cleaned = 0;
    for name in store.storage().list(&keys::journal_dir(set))? {
        let Some(token) = name.strip_suffix(".journal") else {
            continue;
        };
        if let Err(Unusable::Unsealed | Unusable::Expired) = examine(store, set, token) {
            store.storage().delete(&keys::journal(set, token))?;
            cleaned += 1;
        }
    }
    Ok(cleaned)
}

/// Whether the journal at `key` (`journals/<set>/<token>.journal`) is one a
/// commit may resume: sweeps leave it and what it names alone.
pub fn is_resumable(store: &Store, key: &str) -> bool {
    let mut parts = key.rsplitn(2, '/');
    let (Some(name), Some(dir)) = (parts.next(), parts.next()) else {
        return false;
    };
    let (Some(token), Some(set)) = (
        name.strip_suffix(".journal"),
        dir.strip_prefix(keys::JOURNALS)
            .and_then(|d| d.strip_prefix('/')),
    ) else {
        return false;
    };
    examine(store, set, token).is_ok()
}

/// Every content location named by a resumable journal (sweeps mark them).
pub fn protected_refs(store: &Store, mut f: impl FnMut(&Row)) -> Result<()> {
    for r in list(store, None)? {
        let mut reader = JournalReader::open(&r.path)?;
        while let Some(row) = reader.next_row()? {
            if row.kind == Kind::File {
                f(&row);
            }
        }
    }
    Ok(())
}
