//! Large files: read once, cut into content-defined chunks, hashed whole
//! and per chunk, with holes skipped.
//!
//! The data extents (`SEEK_DATA`/`SEEK_HOLE`) are read in blocks; each
//! block feeds the whole-content BLAKE3 (over the logical bytes: a hole is
//! hashed as zeros without being read) and the chunker
//! ([`crate::chunking`]). Complete chunks are hashed on all cores; those
//! the store already has are not encoded again (the previous version of
//! the file's are trusted as its generation's; any other's is read and
//! adopted once it decodes to the same bytes); the rest are compressed
//! when a sample says it pays, admitted against the disk budget and stored
//! in batches.
//! The chunk list is stored after its chunks are durable, and the row that
//! names it is journaled after that (docs/FORMAT.md, "Chunk list").

use super::ingest::StageDir;
use crate::chunking;
use crate::error::{IoContext, Result};
use crate::format::chunk::{decode_chunk, encode_chunk, ChunkList, Extent, MAX_CHUNK_OBJECT};
use crate::row::{BlobLoc, Codec, Row};
use crate::store::{keys, Written};
use rayon::prelude::*;
use std::collections::HashSet;
use std::fs::File;
use std::os::unix::fs::FileExt;
use std::path::Path;

/// Holes shorter than this are read as data (not worth an extent).
const MIN_HOLE: u64 = 64 << 10;
/// Bytes read per request.
const READ_BLOCK: usize = 8 << 20;
/// Encoded new chunks held before they are stored together.
const BATCH_BYTES: usize = 64 << 20;
/// zstd level of compressed chunks.
const ZSTD_LEVEL: i32 = 3;
/// Bytes of a chunk compressed to decide whether the whole is worth it.
const SAMPLE: usize = 64 << 10;
/// A chunk is stored compressed when that saves at least 1/16 of it.
const WORTH: usize = 16;

/// What storing one large file did.
pub(crate) struct Stored {
    pub digest: [u8; 32],
    pub list: [u8; 32],
    /// Bytes of the file that are data, not holes.
    pub data: u64,
    /// Bytes of new chunks and list written.
    pub new_bytes: u64,
}

/// Chunks of this file already known to be stored, and new ones waiting.
struct Chunks<'a> {
    stage: StageDir<'a>,
    known: HashSet<[u8; 32]>,
    batch: Vec<(String, Vec<u8>)>,
    batch_bytes: usize,
    new_bytes: u64,
}

/// Read, hash, chunk and store the large file `file` (`size` bytes).
/// `Ok(None)` when it turned out shorter than its size (it is changing).
pub(crate) fn store_file(
    file: &File,
    abs: &Path,
    size: u64,
    prev: Option<&Row>,
    stage: StageDir<'_>,
) -> Result<Option<Stored>> {
    let mut chunks = Chunks {
        stage,
        known: prev_chunks(stage, prev),
        batch: Vec::new(),
        batch_bytes: 0,
        new_bytes: 0,
    };
    let mut whole = blake3::Hasher::new();
    let mut extents = Vec::new();
    let mut at = 0;
    for (start, end) in crate::os::data_extents(file, size, MIN_HOLE) {
        hole(&mut whole, &mut extents, start - at);
        if !read_extent(file, abs, start, end, &mut whole, &mut chunks, &mut extents)? {
            return Ok(None);
        }
        at = end;
    }
    hole(&mut whole, &mut extents, size - at);
    chunks.flush()?;
    let list = ChunkList::new(extents);
    let (bytes, name) = list.encode();
    let key = keys::chunk_list(&hex::encode(name));
    if stage.store.storage().size(&key)?.is_some() {
        stage.store.adopt_object(&key, &bytes)?;
    } else {
        stage.admission.admit("commit", bytes.len() as u64)?;
        stage.store.put_object(&key, &bytes)?;
        chunks.new_bytes += bytes.len() as u64;
    }
    Ok(Some(Stored {
        digest: *whole.finalize().as_bytes(),
        list: name,
        data: list.data_bytes(),
        new_bytes: chunks.new_bytes,
    }))
}

/// The chunks of the previous version of this file (stored, as its
/// generation is reachable while this commit runs); empty if it has none
/// or its list cannot be read (then each chunk is looked up instead).
fn prev_chunks(stage: StageDir<'_>, prev: Option<&Row>) -> HashSet<[u8; 32]> {
    let Some(row) = prev.filter(|p| matches!(p.blob, BlobLoc::Chunked { .. })) else {
        return HashSet::new();
    };
    match crate::chunks::list(stage.store, row) {
        Ok(list) => list.chunk_digests().copied().collect(),
        Err(e) => {
            tracing::warn!(
                "the previous chunk list of {} is unreadable; looking chunks up one by one: {}",
                crate::row::show(&row.path()),
                crate::cli_chain(&e)
            );
            HashSet::new()
        }
    }
}

/// Append a hole of `len` bytes (hashed as zeros, never read).
fn hole(whole: &mut blake3::Hasher, extents: &mut Vec<Extent>, len: u64) {
    if len == 0 {
        return;
    }
    static ZEROS: [u8; 1 << 20] = [0; 1 << 20];
    let mut left = len;
    while left > 0 {
        let n = left.min(ZEROS.len() as u64) as usize;
        whole.update_rayon(&ZEROS[..n]);
        left -= n as u64;
    }
    extents.push(Extent::Hole { len });
}

/// Read `[start, end)` of the file, cutting it into chunks. `false` when
/// the file ended early.
fn read_extent(
    file: &File,
    abs: &Path,
    start: u64,
    end: u64,
    whole: &mut blake3::Hasher,
    chunks: &mut Chunks<'_>,
    extents: &mut Vec<Extent>,
) -> Result<bool> {
    let mut pending: Vec<u8> = Vec::with_capacity(READ_BLOCK + chunking::MAX);
    let mut at = start;
    while at < end {
        let want = (end - at).min(READ_BLOCK as u64) as usize;
        let old = pending.len();
        pending.resize(old + want, 0);
        let n = read_full(file, &mut pending[old..], at).ctx("read", abs)?;
        if n < want {
            return Ok(false);
        }
        at += want as u64;
        // The whole digest and the chunks (cut, hashed, stored) at once.
        let block = &pending[old..];
        let (_, cut) = rayon::join(
            || whole.update_rayon(block),
            || chunks.take(&pending, at == end, extents),
        );
        pending.drain(..cut?);
    }
    Ok(true)
}

/// `pread` until `buf` is full or the file ends; returns the bytes read.
fn read_full(file: &File, buf: &mut [u8], offset: u64) -> std::io::Result<usize> {
    let mut got = 0;
    while got < buf.len() {
        match file.read_at(&mut buf[got..], offset + got as u64) {
            Ok(0) => break,
            Ok(n) => got += n,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    Ok(got)
}

impl Chunks<'_> {
    /// Cut the complete chunks at the front of `data` (all of it at the
    /// end of an extent), store the new ones, and return the bytes cut.
    fn take(&mut self, data: &[u8], last: bool, extents: &mut Vec<Extent>) -> Result<usize> {
        let mut spans = Vec::new();
        let mut off = 0;
        for n in chunking::cut_all(data, last) {
            spans.push(&data[off..off + n]);
            off += n;
        }
        let digests: Vec<[u8; 32]> = spans
            .par_iter()
            .map(|c| *blake3::hash(c).as_bytes())
            .collect();
        let mut fresh = Vec::new();
        for (span, digest) in spans.iter().zip(&digests) {
            extents.push(Extent::Data {
                len: span.len() as u64,
                digest: *digest,
            });
            if self.known.insert(*digest) {
                fresh.push((*span, *digest));
            }
        }
        self.store_new(fresh)?;
        Ok(off)
    }

    /// Encode and queue the chunks the store does not have yet; adopt
    /// those it has once each decodes to its raw bytes (replacing one that
    /// does not).
    fn store_new(&mut self, fresh: Vec<(&[u8], [u8; 32])>) -> Result<()> {
        let store = self.stage.store;
        let encoded: Vec<Option<(String, Vec<u8>)>> = fresh
            .par_iter()
            .map(|(raw, digest)| {
                let name = hex::encode(digest);
                let key = keys::chunk(&name);
                if store.storage().size(&key)?.is_some() {
                    let valid = |stored: &[u8]| {
                        decode_chunk(&name, stored, digest, raw.len() as u64)
                            .is_ok_and(|decoded| decoded == *raw)
                    };
                    store.adopt_valid(&key, MAX_CHUNK_OBJECT, valid, || encode(raw))?;
                    return Ok(None);
                }
                Ok(Some((key, encode(raw))))
            })
            .collect::<Result<_>>()?;
        for (key, bytes) in encoded.into_iter().flatten() {
            self.batch_bytes += bytes.len();
            self.batch.push((key, bytes));
            if self.batch_bytes >= BATCH_BYTES {
                self.flush()?;
            }
        }
        Ok(())
    }

    /// Store the queued chunks, durably. The batch is admitted whole just
    /// before it is written: admission reads free space again for a request
    /// this large, and every earlier batch is on disk by then.
    fn flush(&mut self) -> Result<()> {
        if self.batch.is_empty() {
            return Ok(());
        }
        self.stage
            .admission
            .admit("commit", self.batch_bytes as u64)?;
        let outcomes = self.stage.store.put_objects(&self.batch)?;
        for ((_, bytes), outcome) in self.batch.iter().zip(outcomes) {
            if outcome == Written::Created {
                self.new_bytes += bytes.len() as u64;
            }
        }
        self.batch.clear();
        self.batch_bytes = 0;
        Ok(())
    }
}

/// A chunk object for `raw`: zstd when a sample of it compresses well and
/// the whole then saves space, else raw.
fn encode(raw: &[u8]) -> Vec<u8> {
    let len = raw.len() as u32;
    let sample = &raw[..raw.len().min(SAMPLE)];
    let promising = zstd::bulk::compress(sample, 1)
        .is_ok_and(|z| z.len() < sample.len() - sample.len() / WORTH);
    if promising {
        if let Ok(z) = zstd::bulk::compress(raw, ZSTD_LEVEL) {
            if z.len() < raw.len() - raw.len() / WORTH {
                return encode_chunk(Codec::Zstd, len, &z);
            }
        }
    }
    encode_chunk(Codec::Raw, len, raw)
}
