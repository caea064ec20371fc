//! Chunked files: verified reads of a large file stored as a chunk list and
//! its chunks (formats: `format::chunk`).
//!
//! The row names its chunk list by digest, the list names each chunk by
//! the digest of its raw bytes, and both are checked as they are read, so
//! any byte range is served verified without reading the rest of the file
//! (invariant 2). Holes are zeros that were never stored. A chunk that
//! fails its check on a remote store's cached copy is dropped and fetched
//! once more ([`Store::read_fresh`]).

use crate::error::{Error, Result};
use crate::format::chunk::{
    decode_chunk, ChunkList, Extent, MAX_CHUNK_LIST_BYTES, MAX_CHUNK_OBJECT,
};
use crate::row::{BlobLoc, Row};
use crate::store::{keys, Store};
use std::io::Write;
use std::sync::{Arc, Mutex, PoisonError};

/// The verified chunk list of a chunked file's row.
pub fn list(store: &Store, row: &Row) -> Result<ChunkList> {
    let BlobLoc::Chunked { list, .. } = row.blob else {
        return Err(Error::Invalid(format!(
            "not a chunked file: path=`{}`",
            crate::row::show(&row.path())
        )));
    };
    list_named(store, &list, row.size)
}

/// The chunk list named `digest` of a file of `size` bytes, verified.
pub fn list_named(store: &Store, digest: &[u8; 32], size: u64) -> Result<ChunkList> {
    let list = list_any(store, digest)?;
    if list.size != size {
        return Err(Error::corrupt(
            "chunk list",
            hex::encode(digest),
            format!("describes {} bytes, the row {size}", list.size),
        ));
    }
    Ok(list)
}

/// The chunk list named `digest`, verified, whatever file it describes.
pub fn list_any(store: &Store, digest: &[u8; 32]) -> Result<ChunkList> {
    let key = keys::chunk_list(&hex::encode(digest));
    store.read_fresh(&key, || {
        let bytes = store.storage().get(&key, MAX_CHUNK_LIST_BYTES)?;
        ChunkList::decode(digest, &bytes)
    })
}

/// The raw bytes of the chunk `digest` (`len` bytes), verified.
pub fn chunk(store: &Store, digest: &[u8; 32], len: u64) -> Result<Vec<u8>> {
    let name = hex::encode(digest);
    let key = keys::chunk(&name);
    store.read_fresh(&key, || {
        let stored = store.storage().get(&key, MAX_CHUNK_OBJECT)?;
        decode_chunk(&name, &stored, digest, len)
    })
}

/// Reads byte ranges of one chunked file, keeping the chunk read last
/// (sequential reads come in pieces smaller than a chunk).
pub struct ChunkedReader {
    list: ChunkList,
    last: Mutex<Option<(usize, Arc<Vec<u8>>)>>,
}

impl ChunkedReader {
    pub fn new(list: ChunkList) -> ChunkedReader {
        ChunkedReader {
            list,
            last: Mutex::new(None),
        }
    }

    pub fn list(&self) -> &ChunkList {
        &self.list
    }

    /// Up to `len` bytes at `offset` (fewer at the end of the file).
    pub fn read(&self, store: &Store, offset: u64, len: u64) -> Result<Vec<u8>> {
        let end = offset.saturating_add(len).min(self.list.size);
        let mut at = offset.min(end);
        let mut out = Vec::with_capacity((end - at) as usize);
        while at < end {
            let Some(i) = self.list.extent_at(at) else {
                break;
            };
            let start = self.list.offsets[i];
            let extent = self.list.extents[i];
            let stop = (start + extent.span()).min(end);
            match extent {
                Extent::Hole { .. } => out.resize(out.len() + (stop - at) as usize, 0),
                Extent::Data { len, digest } => {
                    let bytes = self.extent(store, i, &digest, len)?;
                    out.extend_from_slice(&bytes[(at - start) as usize..(stop - start) as usize]);
                }
            }
            at = stop;
        }
        Ok(out)
    }

    fn extent(&self, store: &Store, i: usize, digest: &[u8; 32], len: u64) -> Result<Arc<Vec<u8>>> {
        if let Some((j, bytes)) = &*self.last.lock().unwrap_or_else(PoisonError::into_inner) {
            if *j == i {
                return Ok(bytes.clone());
            }
        }
        let bytes = Arc::new(chunk(store, digest, len)?);
        *self.last.lock().unwrap_or_else(PoisonError::into_inner) = Some((i, bytes.clone()));
        Ok(bytes)
    }
}

/// Write a chunked file's verified content to `out`, holes as zeros.
pub fn copy_to(store: &Store, row: &Row, out: &mut dyn Write) -> Result<()> {
    let list = list(store, row)?;
    let zeros = vec![0u8; 1 << 20];
    for extent in &list.extents {
        match *extent {
            Extent::Data { len, digest } => {
                let bytes = chunk(store, &digest, len)?;
                out.write_all(&bytes)
                    .map_err(|e| Error::io("write", "output", e))?;
            }
            Extent::Hole { len } => {
                let mut left = len;
                while left > 0 {
                    let n = left.min(zeros.len() as u64) as usize;
                    out.write_all(&zeros[..n])
                        .map_err(|e| Error::io("write", "output", e))?;
                    left -= n as u64;
                }
            }
        }
    }
    Ok(())
}

/// Write a chunked file's verified content into `file` at its offsets,
/// leaving holes unwritten (the file is sized first, so they read as zeros
/// and take no space where the filesystem supports sparse files).
pub fn write_sparse(
    store: &Store,
    list: &ChunkList,
    file: &std::fs::File,
    path: &str,
) -> Result<()> {
    use rayon::prelude::*;
    use std::os::unix::fs::FileExt;
    file.set_len(list.size)
        .map_err(|e| Error::io("truncate", path, e))?;
    list.extents
        .par_iter()
        .zip(&list.offsets)
        .try_for_each(|(extent, &offset)| match *extent {
            Extent::Data { len, digest } => {
                let bytes = chunk(store, &digest, len)?;
                file.write_all_at(&bytes, offset)
                    .map_err(|e| Error::io("write", path, e))
            }
            Extent::Hole { .. } => Ok(()),
        })
}
