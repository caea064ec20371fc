//! Writing content-named objects without trusting what the store already
//! holds (docs/FORMAT.md, "Adopting an existing object").
//!
//! Owns the one rule every writer of packs, chunks, chunk lists, segments
//! and manifests follows: when the name of its bytes already exists, the
//! stored object is checked against those bytes before it stands in for
//! them, and an object that fails (rotted, or left short by a crash) is
//! replaced by them atomically and counted; it is never adopted as it is.
//! The store is not trusted for integrity (docs/SECURITY.md). Also owns the
//! re-read of a published segment or manifest against its digest before
//! anything refers to it ([`Store::confirm_sha256`]).

use super::Store;
use crate::error::{Error, ErrorKind, Result};
use crate::storage::PutOutcome;
use sha2::{Digest, Sha256};
use std::fs::File;
use std::os::unix::fs::FileExt;
use std::path::Path;
use std::sync::atomic::Ordering;

/// Objects up to this size are compared with the writer's bytes in full.
const FULL_CHECK_MAX: u64 = 64 << 20;
/// Above [`FULL_CHECK_MAX`]: bytes compared at the start and at the end
/// (where pack trailers and Parquet footers are).
const EDGE_BYTES: u64 = 4 << 20;
/// Above [`FULL_CHECK_MAX`]: pieces compared between the two edges, evenly
/// spread, and the size of each.
const SAMPLES: u64 = 16;
const SAMPLE_BYTES: u64 = 1 << 20;
/// Most bytes read from the store at once.
const READ_BYTES: u64 = 8 << 20;

/// What a content-named write did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Written {
    Created,
    /// The name existed and its object passed the check.
    Adopted,
    /// The name existed and its object failed the check: it now holds the
    /// writer's bytes.
    Replaced,
}

/// The bytes a writer was about to store.
enum Mine<'a> {
    Bytes(&'a [u8]),
    File(File, &'a Path),
}

impl Mine<'_> {
    fn len(&self) -> Result<u64> {
        match self {
            Mine::Bytes(b) => Ok(b.len() as u64),
            Mine::File(f, path) => Ok(f.metadata().map_err(|e| Error::io("stat", path, e))?.len()),
        }
    }

    fn read(&self, offset: u64, len: u64) -> Result<Vec<u8>> {
        match self {
            Mine::Bytes(b) => b
                .get(offset as usize..(offset + len) as usize)
                .map(<[u8]>::to_vec)
                .ok_or_else(|| Error::internal("a compared range past the writer's bytes")),
            Mine::File(f, path) => {
                let mut buf = vec![0u8; len as usize];
                f.read_exact_at(&mut buf, offset)
                    .map_err(|e| Error::io("read-staged", path, e))?;
                Ok(buf)
            }
        }
    }
}

impl Store {
    /// Create `key` with `bytes`, or adopt its existing object after the
    /// check (replacing it when it fails).
    pub(crate) fn put_object(&self, key: &str, bytes: &[u8]) -> Result<Written> {
        match self.storage().put_if_absent(key, bytes)? {
            PutOutcome::Created => Ok(Written::Created),
            PutOutcome::AlreadyExists => self.adopt_object(key, bytes),
        }
    }

    /// [`Store::put_object`] from a fully written, fsynced staged file,
    /// which is consumed.
    pub(crate) fn put_object_file(&self, key: &str, staged: &Path) -> Result<Written> {
        if self.storage().put_file_if_absent(key, staged)? == PutOutcome::Created {
            return Ok(Written::Created);
        }
        let mine = File::open(staged).map_err(|e| Error::io("open-staged", staged, e))?;
        match self.difference(key, &Mine::File(mine, staged)) {
            Ok(None) => {
                std::fs::remove_file(staged).map_err(|e| Error::io("unlink-staged", staged, e))?;
                Ok(Written::Adopted)
            }
            Ok(Some(why)) => {
                self.replace_with(key, &why, || self.storage().replace_file(key, staged))
            }
            Err(e) => {
                crate::storage::remove_or_warn(staged, "staged object");
                Err(e)
            }
        }
    }

    /// [`Store::put_object`] for many objects, made durable together.
    pub(crate) fn put_objects(&self, items: &[(String, Vec<u8>)]) -> Result<Vec<Written>> {
        let outcomes = self.storage().put_many_if_absent(items)?;
        items
            .iter()
            .zip(outcomes)
            .map(|((key, bytes), outcome)| match outcome {
                PutOutcome::Created => Ok(Written::Created),
                PutOutcome::AlreadyExists => self.adopt_object(key, bytes),
            })
            .collect()
    }

    /// Adopt the object stored at `key` if it holds exactly `bytes`;
    /// otherwise replace it with them.
    pub(crate) fn adopt_object(&self, key: &str, bytes: &[u8]) -> Result<Written> {
        match self.difference(key, &Mine::Bytes(bytes))? {
            None => Ok(Written::Adopted),
            Some(why) => self.replace_with(key, &why, || self.storage().replace(key, bytes)),
        }
    }

    /// Adopt the object stored at `key` (at most `limit` bytes) if `valid`
    /// accepts it whole; otherwise replace it with `bytes()`. For objects
    /// whose valid encodings differ (a chunk is named by its raw content:
    /// another writer may have compressed it differently).
    pub(crate) fn adopt_valid(
        &self,
        key: &str,
        limit: u64,
        valid: impl FnOnce(&[u8]) -> bool,
        bytes: impl FnOnce() -> Vec<u8>,
    ) -> Result<Written> {
        let why = match self.storage().size_stored(key)? {
            None => "missing".to_string(),
            Some(size) if size > limit => format!("size={size} limit={limit}"),
            Some(size) => match self.read_stored(key, 0, size)? {
                Some(stored) if valid(&stored) => return Ok(Written::Adopted),
                Some(_) => "content does not match its name".to_string(),
                None => format!("short read: size={size}"),
            },
        };
        self.replace_with(key, &why, || self.storage().replace(key, &bytes()))
    }

    /// Re-read the object at `key` from the store and check that it is
    /// `size` bytes whose SHA-256 is `name` (a published segment or
    /// manifest, before anything refers to it).
    pub(crate) fn confirm_sha256(&self, key: &str, size: u64, name: &str) -> Result<()> {
        let mismatch = |check: String| Error::StoredMismatch {
            key: key.to_string(),
            check,
        };
        let stored = self.storage().size_stored(key)?;
        if stored != Some(size) {
            return Err(mismatch(format!("size={stored:?} expected={size}")));
        }
        let mut sha = Sha256::new();
        for (offset, len) in pieces(0, size) {
            let bytes = self
                .read_stored(key, offset, len)?
                .ok_or_else(|| mismatch(format!("short read: offset={offset}")))?;
            sha.update(&bytes);
        }
        let actual = hex::encode(sha.finalize());
        match actual == name {
            true => Ok(()),
            false => Err(mismatch(format!("sha256={actual}"))),
        }
    }

    /// Objects this store handle replaced after they failed the check.
    pub fn repaired_objects(&self) -> u64 {
        self.repaired.load(Ordering::Relaxed)
    }

    /// Why the object stored at `key` is not `mine`; `None` when it is.
    fn difference(&self, key: &str, mine: &Mine<'_>) -> Result<Option<String>> {
        let want = mine.len()?;
        let Some(size) = self.storage().size_stored(key)? else {
            return Ok(Some("missing".into()));
        };
        if size != want {
            return Ok(Some(format!("size={size} expected={want}")));
        }
        for (offset, len) in regions(size) {
            let Some(stored) = self.read_stored(key, offset, len)? else {
                return Ok(Some(format!("short read: offset={offset}")));
            };
            if stored != mine.read(offset, len)? {
                return Ok(Some(format!("bytes differ: offset={offset} len={len}")));
            }
        }
        Ok(None)
    }

    /// Bytes of the stored object; `None` when it turns out shorter or
    /// gone (changed under the check).
    fn read_stored(&self, key: &str, offset: u64, len: u64) -> Result<Option<Vec<u8>>> {
        match self.storage().get_range_stored(key, offset, len) {
            Ok(b) => Ok(Some(b)),
            Err(e) if e.kind() == ErrorKind::Corrupt || e.is_not_found() => Ok(None),
            Err(e) => Err(e),
        }
    }

    /// Replace the object at `key`, which failed the check for `why`;
    /// logged and counted once done.
    fn replace_with(
        &self,
        key: &str,
        why: &str,
        replace: impl FnOnce() -> Result<()>,
    ) -> Result<Written> {
        replace().map_err(|e| Error::NotAdopted {
            key: key.to_string(),
            check: why.to_string(),
            source: Box::new(e),
        })?;
        tracing::warn!(
            "stored object failed its check and was replaced: key=`{key}` check=`{why}`"
        );
        self.repaired.fetch_add(1, Ordering::Relaxed);
        Ok(Written::Replaced)
    }
}

/// The `(offset, len)` reads that compare an object of `size` bytes: all
/// of it up to [`FULL_CHECK_MAX`]; above, both edges and the samples.
fn regions(size: u64) -> Vec<(u64, u64)> {
    if size <= FULL_CHECK_MAX {
        return pieces(0, size);
    }
    let span = size - 2 * EDGE_BYTES - SAMPLE_BYTES;
    let step = span / (SAMPLES - 1);
    let samples = (0..SAMPLES).map(|i| (EDGE_BYTES + i * step, SAMPLE_BYTES));
    std::iter::once((0, EDGE_BYTES))
        .chain(samples)
        .chain(std::iter::once((size - EDGE_BYTES, EDGE_BYTES)))
        .flat_map(|(offset, len)| pieces(offset, len))
        .collect()
}

/// `[offset, offset + len)` in reads of at most [`READ_BYTES`].
fn pieces(offset: u64, len: u64) -> Vec<(u64, u64)> {
    (0..len.div_ceil(READ_BYTES))
        .map(|i| {
            let at = i * READ_BYTES;
            (offset + at, READ_BYTES.min(len - at))
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::storage::LocalStorage;
    use crate::store::keys;
    use std::sync::Arc;

    fn local_store(dir: &Path) -> Store {
        Store::init(Arc::new(LocalStorage::new(dir))).unwrap().0
    }

    /// Flip one byte of the local object at `key`, `back` bytes before its end.
    fn flip(dir: &Path, key: &str, back: usize) {
        let path = dir.join(key);
        let mut b = std::fs::read(&path).unwrap();
        let at = b.len() - back;
        b[at] ^= 0x40;
        std::fs::write(&path, b).unwrap();
    }

    #[test]
    fn a_published_object_that_reads_back_different_is_a_typed_error_naming_it() {
        let t = tempfile::tempdir().unwrap();
        let store = local_store(t.path());
        let bytes = b"the bytes of a segment".to_vec();
        let name = hex::encode(Sha256::digest(&bytes));
        let key = keys::segment(&name);
        assert_eq!(store.put_object(&key, &bytes).unwrap(), Written::Created);
        store.confirm_sha256(&key, 22, &name).unwrap();
        flip(t.path(), &key, 1);
        match store.confirm_sha256(&key, 22, &name) {
            Err(Error::StoredMismatch { key: named, .. }) => assert_eq!(named, key),
            other => panic!("a rotted segment must not be confirmed: {other:?}"),
        }
        assert_eq!(store.put_object(&key, &bytes).unwrap(), Written::Replaced);
        store.confirm_sha256(&key, 22, &name).unwrap();
        assert_eq!(store.repaired_objects(), 1);
    }

    #[test]
    fn a_large_object_damaged_in_its_trailer_is_replaced() {
        let t = tempfile::tempdir().unwrap();
        let store = local_store(t.path());
        let bytes: Vec<u8> = (0..FULL_CHECK_MAX + (3 << 20))
            .map(|i| (i % 251) as u8)
            .collect();
        let key = keys::pack(&"ab".repeat(32));
        assert_eq!(store.put_object(&key, &bytes).unwrap(), Written::Created);
        assert_eq!(store.put_object(&key, &bytes).unwrap(), Written::Adopted);
        flip(t.path(), &key, 10);
        assert_eq!(store.put_object(&key, &bytes).unwrap(), Written::Replaced);
        assert_eq!(std::fs::read(t.path().join(&key)).unwrap(), bytes);
    }

    #[test]
    fn small_objects_are_read_whole_and_large_ones_at_edges_and_samples() {
        assert_eq!(regions(0), vec![]);
        assert_eq!(regions(5), vec![(0, 5)]);
        let full = regions(FULL_CHECK_MAX);
        assert_eq!(full.iter().map(|r| r.1).sum::<u64>(), FULL_CHECK_MAX);
        assert!(full.windows(2).all(|w| w[0].0 + w[0].1 == w[1].0));
        let size = 10 * FULL_CHECK_MAX + 3;
        let large = regions(size);
        let read: u64 = large.iter().map(|r| r.1).sum();
        assert_eq!(read, 2 * EDGE_BYTES + SAMPLES * SAMPLE_BYTES);
        assert_eq!(large.first(), Some(&(0, EDGE_BYTES)));
        assert_eq!(large.last(), Some(&(size - EDGE_BYTES, EDGE_BYTES)));
        assert!(large.windows(2).all(|w| w[0].0 + w[0].1 <= w[1].0));
    }
}
