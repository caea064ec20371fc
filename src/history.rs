//! History: the distinct versions of one path across a set's committed
//! generations (`strata history`, the mount's `<set>/history/`).
//!
//! A row's `changed_gen` is the generation that last wrote it, so the same
//! row stands in every generation from `changed_gen` up to the one it was
//! read from; the next older version can only be in a generation before
//! `changed_gen`. Listing a path therefore reads about one generation per
//! version (plus one per stretch in which the path did not exist), however
//! many generations the set keeps, and each read is one keyed lookup. Only
//! committed generations are read (through the caller's pinned views); a
//! version written by a generation since retired is listed under the oldest
//! committed generation that still holds it, which is where it can be read.

use crate::compose::GenView;
use crate::error::{Error, Result};
use crate::format::record::State;
use crate::index::GenIndex;
use crate::row::Row;
use crate::Store;

/// One version of a path.
#[derive(Debug, Clone)]
pub struct Version {
    /// The oldest committed generation holding this version.
    pub generation: u64,
    /// The version's row, as that generation holds it.
    pub row: Row,
}

/// Whether two rows are the same version: same kind, mode, content and
/// link target (a rewrite with equal bytes, or a new mtime alone, is not a
/// new version).
fn same_version(a: &Row, b: &Row) -> bool {
    (a.kind, a.mode, a.digest, &a.target, a.size) == (b.kind, b.mode, b.digest, &b.target, b.size)
}

/// The versions of a path, newest first, given the committed generations
/// (ascending) and a lookup of the path in one of them (`Ok(None)` when the
/// path is absent there).
pub fn versions_in(
    committed: &[u64],
    mut lookup: impl FnMut(u64) -> Result<Option<Row>>,
) -> Result<Vec<Version>> {
    let mut out: Vec<Version> = Vec::new();
    let mut upto = committed.len();
    while let Some(&generation) = upto.checked_sub(1).and_then(|i| committed.get(i)) {
        let Some(row) = lookup(generation)? else {
            upto -= 1;
            continue;
        };
        let written = row.changed_gen.min(generation);
        let first = committed[..upto].partition_point(|&g| g < written);
        let oldest = committed[first];
        match out.last_mut() {
            Some(newer) if same_version(&newer.row, &row) => newer.generation = oldest,
            _ => out.push(Version {
                generation: oldest,
                row,
            }),
        }
        upto = first;
    }
    Ok(out)
}

/// The committed generations of `set`, ascending, with their commit times;
/// `NotFound` for a set without any generation.
pub fn committed(store: &Store, set: &str) -> Result<Vec<(u64, Option<i64>)>> {
    crate::store::check_set_name(set)?;
    let all = GenIndex::new(store, set).all()?;
    if all.is_empty() {
        return Err(Error::NotFound {
            what: "set",
            name: set.to_string(),
        });
    }
    Ok(all
        .into_values()
        .filter(|r| r.state == State::Committed)
        .map(|r| (r.generation, r.committed_ns))
        .collect())
}

/// The versions of `path` (normalized) in `set`, newest first, each read
/// through a pinned view; a generation retired while this runs is passed
/// over. `NotFound` when no committed generation has the path.
pub fn versions(store: &Store, set: &str, path: &[u8]) -> Result<Vec<Version>> {
    let gens: Vec<u64> = committed(store, set)?.into_iter().map(|(g, _)| g).collect();
    versions_among(store, set, path, &gens)
}

/// A version with the commit time of the generation that names it.
#[derive(Debug, Clone)]
pub struct DatedVersion {
    pub version: Version,
    /// When `version.generation` was committed.
    pub committed_ns: Option<i64>,
}

/// [`versions`], each with the commit time of its generation (`strata
/// history`).
pub fn dated_versions(store: &Store, set: &str, path: &[u8]) -> Result<Vec<DatedVersion>> {
    let committed = committed(store, set)?;
    let gens: Vec<u64> = committed.iter().map(|&(g, _)| g).collect();
    Ok(versions_among(store, set, path, &gens)?
        .into_iter()
        .map(|version| DatedVersion {
            committed_ns: committed
                .binary_search_by_key(&version.generation, |&(g, _)| g)
                .ok()
                .and_then(|i| committed[i].1),
            version,
        })
        .collect())
}

fn versions_among(store: &Store, set: &str, path: &[u8], gens: &[u64]) -> Result<Vec<Version>> {
    let found = versions_in(gens, |g| {
        match GenView::open(store, set, Some(g), "history") {
            Ok(view) => view.lookup(path),
            Err(Error::NotFound { .. }) => Ok(None),
            Err(e) => Err(e),
        }
    })?;
    if found.is_empty() {
        return Err(Error::NotFound {
            what: "path",
            name: crate::row::show(path),
        });
    }
    Ok(found)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::row::{BlobLoc, Kind};
    use std::collections::BTreeMap;

    fn file(digest: u8, changed_gen: u64) -> Row {
        Row {
            parent: Vec::new(),
            name: b"f".to_vec(),
            kind: Kind::File,
            mode: 0o644,
            size: 1,
            mtime_ns: changed_gen as i64,
            digest: Some([digest; 32]),
            blob: BlobLoc::None,
            target: None,
            first_gen: 1,
            changed_gen,
            ino: 1,
            ctime_ns: 0,
            uid: 0,
            gid: 0,
            meta: None,
        }
    }

    /// Generations 1..=8 hold: v1 (1-2), a same-bytes rewrite (3), v2
    /// (4-5), nothing (6), v3 (7-8); generation 2 and 7 are retired.
    #[test]
    fn versions_jump_by_changed_gen_and_merge_equal_rewrites() {
        let held: BTreeMap<u64, Option<Row>> = [
            (1, Some(file(1, 1))),
            (3, Some(file(1, 3))),
            (4, Some(file(2, 4))),
            (5, Some(file(2, 4))),
            (6, None),
            (8, Some(file(3, 7))),
        ]
        .into();
        let committed: Vec<u64> = held.keys().copied().collect();
        let mut read = Vec::new();
        let v = versions_in(&committed, |g| {
            read.push(g);
            Ok(held[&g].clone())
        })
        .unwrap();
        let named: Vec<(u64, u8)> = v
            .iter()
            .map(|v| (v.generation, v.row.digest.unwrap()[0]))
            .collect();
        assert_eq!(named, vec![(8, 3), (4, 2), (1, 1)]);
        assert_eq!(read, vec![8, 6, 5, 3, 1], "one lookup per version or gap");
    }
}
