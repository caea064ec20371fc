//! The rolling pack writer of every writer of packed blobs (commit's ingest,
//! a fold's repack).
//!
//! Frames are appended to an open pack in a staging directory; once it
//! reaches [`PACK_TARGET_BYTES`] it is sealed (fsynced), moved to its
//! content-addressed name, and only then are its frames' locations handed
//! back, so nothing names a pack before it is durable in its final name. A
//! pack already stored under that name is adopted only after it is checked
//! against the sealed one (`Store::put_object_file`).

use crate::error::Result;
use crate::format::pack::{PackWriter, PACK_TARGET_BYTES};
use crate::row::{BlobLoc, Codec};
use crate::store::{keys, Store};
use std::path::{Path, PathBuf};

/// A frame's final location, with what the caller attached to it.
pub type Placed<T> = Vec<(T, BlobLoc)>;

/// A frame in the open pack, waiting for the pack's name.
struct Pending<T> {
    item: T,
    offset: u64,
    len: u64,
    codec: Codec,
}

/// Fills packs in `dir` and moves each sealed one into the store.
pub struct RollingPacks<T> {
    store: Store,
    dir: PathBuf,
    pack: Option<PackWriter>,
    pending: Vec<Pending<T>>,
}

impl<T> RollingPacks<T> {
    pub fn new(store: &Store, dir: &Path) -> Result<RollingPacks<T>> {
        crate::storage::ensure_local_dir(dir)?;
        Ok(RollingPacks {
            store: store.clone(),
            dir: dir.to_path_buf(),
            pack: None,
            pending: Vec::new(),
        })
    }

    /// Append one frame (`raw_len` bytes once decoded) tagged with `item`.
    /// Returns the frames placed when this append sealed the pack.
    pub fn append(
        &mut self,
        item: T,
        digest: [u8; 32],
        codec: Codec,
        raw_len: u64,
        frame: &[u8],
    ) -> Result<Placed<T>> {
        if self.pack.is_none() {
            self.pack = Some(PackWriter::create(&self.dir)?);
        }
        let pack = self.pack.as_mut().expect("created above");
        let offset = pack.append(digest, codec, raw_len, frame)?;
        self.pending.push(Pending {
            item,
            offset,
            len: frame.len() as u64,
            codec,
        });
        match pack.len() >= PACK_TARGET_BYTES {
            true => self.seal(),
            false => Ok(Vec::new()),
        }
    }

    /// Whether a frame tagged like `item` waits in the open pack.
    pub fn pending(&self, mut matches: impl FnMut(&T) -> bool) -> bool {
        self.pending.iter().any(|p| matches(&p.item))
    }

    /// Frames waiting in the open pack.
    pub fn pending_count(&self) -> usize {
        self.pending.len()
    }

    /// Seal the open pack (if any) into its final name; returns its frames.
    pub fn seal(&mut self) -> Result<Placed<T>> {
        let Some(pack) = self.pack.take() else {
            return Ok(Vec::new());
        };
        let sealed = pack.seal()?;
        self.store
            .put_object_file(&keys::pack(&sealed.name), &sealed.path)?;
        let placed = self.pending.drain(..).map(|p| {
            let loc = BlobLoc::Packed {
                pack: sealed.digest,
                offset: p.offset,
                len: p.len,
                codec: p.codec,
            };
            (p.item, loc)
        });
        Ok(placed.collect())
    }
}
