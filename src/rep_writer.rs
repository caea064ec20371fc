//! The representation writer: rows in key order → segments in staging →
//! segments in their content-addressed names → manifest. Used by publish
//! (a new generation's base or delta) and by a fold (a new base of a
//! committed generation), so both write the same manifest from the same
//! tallies. Each segment and the manifest is re-read from the store and
//! checked against its size and digest before anything refers to it.
//!
//! A representation's rows are *written* (stored in its segments: counts of
//! rows and tombstones, the packs and standalone blobs they name) and the
//! generation's composed rows are *live* (the identity hash and the counts
//! of files, directories, symlinks and bytes). In a base both are the same
//! rows; in a delta only changed rows and tombstones are written.

use crate::error::{Error, Result};
use crate::format::manifest::{
    BaseBinding, Counts, Coverage, FileRef, Manifest, ParentBinding, RepKind, SegmentRef,
    MANIFEST_TAG, MANIFEST_VERSION, MAX_MANIFEST_BYTES,
};
use crate::format::segment::{SegmentFile, SegmentWriter};
use crate::identity::IdentityHasher;
use crate::row::{BlobLoc, Kind, Row};
use crate::store::{keys, Store};
use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;

/// Writes one representation's segments in staging and tallies its rows.
pub struct RepWriter {
    segments: SegmentWriter,
    hasher: IdentityHasher,
    counts: Counts,
    packs: BTreeSet<String>,
    blobs: BTreeMap<String, u64>,
    chunk_lists: BTreeSet<String>,
}

impl RepWriter {
    /// A writer whose segment files go to `dir` (created if missing).
    pub fn new(dir: &Path) -> Result<RepWriter> {
        crate::storage::ensure_local_dir(dir)?;
        Ok(RepWriter {
            segments: SegmentWriter::new(dir)?,
            hasher: IdentityHasher::new(),
            counts: Counts::default(),
            packs: BTreeSet::new(),
            blobs: BTreeMap::new(),
            chunk_lists: BTreeSet::new(),
        })
    }

    /// Store `row` in the representation (in key order).
    pub fn write(&mut self, row: Row) -> Result<()> {
        self.counts.rows += 1;
        match (row.blob, row.digest) {
            (BlobLoc::Packed { pack, .. }, _) => {
                self.packs.insert(hex::encode(pack));
            }
            (BlobLoc::Standalone, Some(d)) => {
                self.blobs.insert(hex::encode(d), row.size);
            }
            (BlobLoc::Chunked { list, .. }, _) => {
                self.chunk_lists.insert(hex::encode(list));
            }
            _ => {}
        }
        if row.kind == Kind::Tombstone {
            self.counts.tombstones += 1;
        }
        self.segments.push(row)
    }

    /// Count `row` as a live row of the generation (in key order).
    pub fn live(&mut self, row: &Row) {
        self.hasher.push(row);
        match row.kind {
            Kind::File => {
                self.counts.files += 1;
                self.counts.bytes += row.size;
            }
            Kind::Dir => self.counts.dirs += 1,
            Kind::Symlink => self.counts.symlinks += 1,
            Kind::Fifo | Kind::Socket | Kind::CharDev | Kind::BlockDev => self.counts.special += 1,
            Kind::Tombstone => {}
        }
    }

    /// Close the segments; the representation is complete in staging.
    pub fn finish(self) -> Result<StagedRep> {
        Ok(StagedRep {
            files: self.segments.finish()?,
            identity: self.hasher.finish(),
            counts: self.counts,
            packs: self.packs,
            blobs: self.blobs,
            chunk_lists: self.chunk_lists,
        })
    }
}

/// A representation written to staging, not yet referenced by anything.
pub struct StagedRep {
    files: Vec<SegmentFile>,
    /// Identity of the live rows.
    pub identity: String,
    pub counts: Counts,
    packs: BTreeSet<String>,
    blobs: BTreeMap<String, u64>,
    chunk_lists: BTreeSet<String>,
}

/// What a manifest says besides what its rows tally to.
pub struct RepHead {
    pub set: String,
    pub generation: u64,
    pub representation: RepKind,
    pub base: Option<BaseBinding>,
    pub parent: Option<ParentBinding>,
    pub observed_ns: i64,
    pub message: Option<String>,
    /// Digest of the sealed journal it was published from.
    pub journal: Option<String>,
    /// The observed scope of the generation's commit (a fold carries the
    /// generation's over from the representation it folds).
    pub coverage: Option<Coverage>,
    /// Whether every row carries observed metadata (`Manifest::metadata`).
    pub metadata: bool,
}

impl StagedRep {
    /// Move the segments into their content-addressed names (each fsynced
    /// there by the storage, an existing one adopted only after its check),
    /// then re-read each from the store against its size and SHA-256;
    /// returns their manifest entries.
    pub fn store_segments(&self, store: &Store) -> Result<Vec<SegmentRef>> {
        let mut refs = Vec::with_capacity(self.files.len());
        for f in &self.files {
            let key = keys::segment(&f.name);
            store.put_object_file(&key, &f.path)?;
            store.confirm_sha256(&key, f.size, &f.name)?;
            refs.push(SegmentRef {
                name: f.name.clone(),
                size: f.size,
                rows: f.rows,
                first: [hex::encode(&f.first.0), hex::encode(&f.first.1)],
                last: [hex::encode(&f.last.0), hex::encode(&f.last.1)],
            });
        }
        Ok(refs)
    }

    /// The manifest of this representation over stored `segments`.
    pub fn manifest(
        &self,
        store: &Store,
        head: RepHead,
        segments: Vec<SegmentRef>,
    ) -> Result<Manifest> {
        let blobs = self
            .blobs
            .iter()
            .map(|(name, &size)| FileRef {
                name: name.clone(),
                size,
            })
            .collect();
        Ok(Manifest {
            tag: MANIFEST_TAG.into(),
            version: MANIFEST_VERSION,
            set: head.set,
            generation: head.generation,
            representation: head.representation,
            base: head.base,
            parent: head.parent,
            identity: self.identity.clone(),
            counts: self.counts.clone(),
            segments,
            packs: stored_refs(store, &self.packs, keys::pack)?,
            blobs,
            chunklists: stored_refs(store, &self.chunk_lists, keys::chunk_list)?,
            created_ns: crate::token::now_ns(),
            observed_ns: head.observed_ns,
            message: head.message,
            journal: head.journal,
            coverage: head.coverage,
            metadata: head.metadata,
        })
    }
}

/// Manifest entries for packs or chunk lists by name, with their stored
/// sizes.
fn stored_refs(
    store: &Store,
    names: &BTreeSet<String>,
    key_of: fn(&str) -> String,
) -> Result<Vec<FileRef>> {
    let mut packs = Vec::with_capacity(names.len());
    for name in names {
        let key = key_of(name);
        let size = store
            .storage()
            .size(&key)?
            .ok_or_else(|| Error::missing_object(key))?;
        packs.push(FileRef {
            name: name.clone(),
            size,
        });
    }
    Ok(packs)
}

/// Write `manifest` under its digest (an existing one adopted only after
/// its check) and re-read it from the store against its size and SHA-256;
/// returns the name.
pub fn store_manifest(store: &Store, manifest: &Manifest) -> Result<String> {
    let (bytes, name) = manifest.encode()?;
    if bytes.len() as u64 > MAX_MANIFEST_BYTES {
        return Err(Error::TooLarge {
            what: "manifest of the new representation (too many standalone blobs for one manifest)",
            size: bytes.len() as u64,
            limit: MAX_MANIFEST_BYTES,
        });
    }
    let key = keys::manifest(&name);
    store.put_object(&key, &bytes)?;
    store.confirm_sha256(&key, bytes.len() as u64, &name)?;
    Ok(name)
}
