//! Resuming an interrupted commit from the sealed journal it left
//! (`crate::resumable`).
//!
//! The commit resumes from the newest resumable journal of its set whose
//! header names the same scope and the set's latest generation as parent
//! (so the generation it would publish is still next); otherwise it starts
//! fresh and says why. Resuming is a stat walk: a file whose stat (size,
//! mtime, inode, ctime, mode, owner) still equals its journal row, and was
//! settled when that walk started, takes the row's content without being
//! read; any other file is read as usual. The objects a row names are
//! checked before they are adopted (a pack or blob by its size, a chunk
//! list by its chunks' presence); a row whose objects are not sound is
//! dropped, and its file read again.

use crate::error::Result;
use crate::format::chunk::ChunkList;
use crate::format::journal::{JournalHeader, JournalReader};
use crate::resumable::{list, Resumable};
use crate::row::{BlobLoc, Kind, Row};
use crate::store::{keys, Store};
use std::collections::{HashMap, HashSet};

/// Journal rows a resume holds in memory at most; past it, the other files
/// are read again.
const MAX_HINTS: usize = 2_000_000;

/// The content of files an earlier attempt hashed, by path.
pub(crate) struct Hints {
    pub token: String,
    pub key: String,
    rows: HashMap<Vec<u8>, Row>,
    /// Rows whose mtime or ctime is not before this were not settled when
    /// the journal's walk started: their stat cannot prove them unchanged.
    pub racy_from_ns: i64,
}

impl Hints {
    /// The row to reuse for a file the walk sees with stat `now`.
    pub(crate) fn reuse(&self, now: &Row) -> Option<&Row> {
        let hint = self.rows.get(&now.path())?;
        super::walk::stat_proves_unchanged(hint, now, self.racy_from_ns).then_some(hint)
    }
}

/// What the commit should resume from, or why it starts fresh (`Err`).
pub(crate) fn choose(
    store: &Store,
    set: &str,
    header: &JournalHeader,
) -> std::result::Result<Hints, String> {
    let mut found = list(store, Some(set)).map_err(|e| format!("cannot list journals: {e}"))?;
    if found.is_empty() {
        return Err(String::new());
    }
    found.sort_by_key(|r| std::cmp::Reverse(r.created_ns));
    let mut why = Vec::new();
    for r in found {
        match mismatch(&r.header, header) {
            Some(m) => why.push(format!("journal {}: {m}", r.token)),
            None => return load(store, &r).map_err(|e| format!("journal {}: {e}", r.token)),
        }
    }
    Err(why.join("; "))
}

fn mismatch(old: &JournalHeader, now: &JournalHeader) -> Option<String> {
    if old.parent != now.parent {
        return Some(format!(
            "observed on generation {:?}, the latest is now {:?}",
            old.parent, now.parent
        ));
    }
    if (&old.scope, old.scope_count) != (&now.scope, now.scope_count) {
        return Some("a different scope of paths".into());
    }
    None
}

/// Read the journal's file rows whose objects are still sound.
fn load(store: &Store, r: &Resumable) -> Result<Hints> {
    let mut reader = JournalReader::open(&r.path)?;
    let mut rows = HashMap::new();
    let mut sound = Soundness::default();
    while let Some(row) = reader.next_row()? {
        if rows.len() >= MAX_HINTS {
            break;
        }
        if row.kind == Kind::File && row.digest.is_some() && sound.check(store, &row)? {
            rows.insert(row.path(), row);
        }
    }
    Ok(Hints {
        token: r.token.clone(),
        key: r.key.clone(),
        rows,
        racy_from_ns: r
            .header
            .created_ns
            .saturating_sub(super::walk::RACY_MARGIN_NS),
    })
}

/// Checks of the objects journal rows name, each object once.
#[derive(Default)]
struct Soundness {
    good: HashSet<String>,
    bad: HashSet<String>,
}

impl Soundness {
    fn check(&mut self, store: &Store, row: &Row) -> Result<bool> {
        let Some(digest) = row.digest else {
            return Ok(false);
        };
        let (key, need) = match row.blob {
            BlobLoc::None => return Ok(row.size == 0),
            BlobLoc::Standalone => (keys::blob(&hex::encode(digest)), row.size),
            BlobLoc::Packed {
                pack, offset, len, ..
            } => (keys::pack(&hex::encode(pack)), offset + len),
            BlobLoc::Chunked { list, .. } => (keys::chunk_list(&hex::encode(list)), 0),
        };
        if self.good.contains(&key) {
            return Ok(true);
        }
        if self.bad.contains(&key) {
            return Ok(false);
        }
        let ok = match row.blob {
            BlobLoc::Chunked { list, .. } => chunks_present(store, &list)?,
            _ => store.storage().size(&key)?.is_some_and(|s| s >= need),
        };
        if ok {
            self.good.insert(key);
        } else {
            tracing::warn!("resume: {key} is missing or short; its files are read again");
            self.bad.insert(key);
        }
        Ok(ok)
    }
}

/// Whether a chunk list and every chunk it names are stored.
fn chunks_present(store: &Store, digest: &[u8; 32]) -> Result<bool> {
    // Missing or unreadable: its files are read again.
    let Ok(list): Result<ChunkList> = crate::chunks::list_any(store, digest) else {
        return Ok(false);
    };
    for c in list.chunk_digests() {
        if store
            .storage()
            .size(&keys::chunk(&hex::encode(c)))?
            .is_none()
        {
            return Ok(false);
        }
    }
    Ok(true)
}
