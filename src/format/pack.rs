//! Packs: many small blobs in one file, `packs/<sha[0..2]>/<sha256>.pack`.
//!
//! Each blob is one frame (raw, or one zstd frame when that saves space), so
//! a blob is read with one ranged get and without its neighbours. A trailer
//! lists every frame so verify and repacking can walk a pack without the
//! segments. Layout: docs/FORMAT.md ("Pack").

use crate::error::{Error, IoContext, Result};
use crate::row::Codec;
use sha2::{Digest, Sha256};
use std::fs::File;
use std::io::{BufWriter, Write};
use std::path::{Path, PathBuf};

/// 1: initial layout.
pub const PACK_VERSION: u32 = 1;
const HEAD_MAGIC: &[u8; 8] = b"STRATAPK";
const TAIL_MAGIC: &[u8; 8] = b"STRPKEND";
const HEADER_LEN: u64 = 16;
const ENTRY_LEN: usize = 32 + 8 + 8 + 8 + 1;
/// Files at least this large are stored as chunks (`format::chunk`;
/// stores written before chunking hold them as standalone raw blobs),
/// smaller ones as frames in packs.
pub const STANDALONE_MIN: u64 = 1 << 20;
/// A pack is sealed once it reaches this size.
pub const PACK_TARGET_BYTES: u64 = 32 << 20;
/// Largest pack a verifier reads whole.
pub const MAX_PACK_BYTES: u64 = 1 << 30;

/// One frame as listed in the trailer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PackEntry {
    pub digest: [u8; 32],
    pub offset: u64,
    pub stored_len: u64,
    pub raw_len: u64,
    pub codec: Codec,
}

/// Appends frames to a pack file in a staging directory.
pub struct PackWriter {
    path: PathBuf,
    out: BufWriter<File>,
    sha: Sha256,
    len: u64,
    entries: Vec<PackEntry>,
}

/// A sealed, fsynced pack in staging.
#[derive(Debug, Clone)]
pub struct SealedPack {
    pub name: String,
    pub path: PathBuf,
    pub size: u64,
    pub digest: [u8; 32],
}

impl PackWriter {
    pub fn create(dir: &Path) -> Result<PackWriter> {
        let (path, file) = crate::token::fresh_file(dir, "pack")?;
        let mut w = PackWriter {
            path,
            out: BufWriter::with_capacity(1 << 20, file),
            sha: Sha256::new(),
            len: 0,
            entries: Vec::new(),
        };
        let mut head = HEAD_MAGIC.to_vec();
        head.extend_from_slice(&PACK_VERSION.to_le_bytes());
        head.extend_from_slice(&0u32.to_le_bytes());
        w.write(&head)?;
        Ok(w)
    }

    fn write(&mut self, bytes: &[u8]) -> Result<()> {
        self.out.write_all(bytes).ctx("write", &self.path)?;
        self.sha.update(bytes);
        self.len += bytes.len() as u64;
        Ok(())
    }

    /// Append one frame; returns its offset.
    pub fn append(
        &mut self,
        digest: [u8; 32],
        codec: Codec,
        raw_len: u64,
        frame: &[u8],
    ) -> Result<u64> {
        let offset = self.len;
        self.write(frame)?;
        self.entries.push(PackEntry {
            digest,
            offset,
            stored_len: frame.len() as u64,
            raw_len,
            codec,
        });
        Ok(offset)
    }

    pub fn len(&self) -> u64 {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    /// Write the trailer, fsync, and rename to `<sha256>.pack` in the same dir.
    pub fn seal(mut self) -> Result<SealedPack> {
        let mut tail = Vec::with_capacity(self.entries.len() * ENTRY_LEN + 16);
        for e in &self.entries {
            tail.extend_from_slice(&e.digest);
            tail.extend_from_slice(&e.offset.to_le_bytes());
            tail.extend_from_slice(&e.stored_len.to_le_bytes());
            tail.extend_from_slice(&e.raw_len.to_le_bytes());
            tail.push(e.codec.code());
        }
        tail.extend_from_slice(&(self.entries.len() as u64).to_le_bytes());
        tail.extend_from_slice(TAIL_MAGIC);
        self.write(&tail)?;
        let file = self
            .out
            .into_inner()
            .map_err(|e| Error::io("flush", &self.path, e.into_error()))?;
        file.sync_all().ctx("fsync", &self.path)?;
        let digest: [u8; 32] = self.sha.finalize().into();
        let name = hex::encode(digest);
        let path = self.path.with_file_name(format!("{name}.pack"));
        std::fs::rename(&self.path, &path).ctx("rename", &path)?;
        Ok(SealedPack {
            name,
            path,
            size: self.len,
            digest,
        })
    }
}

/// Length of the last part of a pack that [`overhead`] reads.
pub const TAIL_LEN: u64 = 16;

/// Bytes of a pack that are not frames (header and trailer), from its last
/// [`TAIL_LEN`] bytes; `None` when they are not a pack's tail.
pub fn overhead(tail: &[u8]) -> Option<u64> {
    if tail.len() != TAIL_LEN as usize || &tail[8..] != TAIL_MAGIC {
        return None;
    }
    let count = u64::from_le_bytes(tail[..8].try_into().ok()?);
    count
        .checked_mul(ENTRY_LEN as u64)?
        .checked_add(HEADER_LEN + TAIL_LEN)
}

/// Verify a whole pack against its name and parse its trailer.
pub fn parse(name: &str, bytes: &[u8]) -> Result<Vec<PackEntry>> {
    let actual = hex::encode(Sha256::digest(bytes));
    if actual != name {
        return Err(Error::corrupt(
            "pack",
            name,
            format!("sha256 mismatch: actual={actual}"),
        ));
    }
    let bad = |check: &str| Error::corrupt("pack", name, check.to_string());
    if bytes.len() < (HEADER_LEN + 16) as usize || &bytes[..8] != HEAD_MAGIC {
        return Err(bad("header magic"));
    }
    let version = u32::from_le_bytes(bytes[8..12].try_into().expect("4 bytes"));
    if version > PACK_VERSION {
        return Err(Error::NewerFormat {
            what: "pack",
            found: version,
            supported: PACK_VERSION,
        });
    }
    let n = bytes.len();
    if &bytes[n - 8..] != TAIL_MAGIC {
        return Err(bad("trailer magic"));
    }
    let count = u64::from_le_bytes(bytes[n - 16..n - 8].try_into().expect("8 bytes")) as usize;
    let table_len = count
        .checked_mul(ENTRY_LEN)
        .filter(|&l| l + 16 + HEADER_LEN as usize <= n)
        .ok_or_else(|| bad("trailer count"))?;
    let table = &bytes[n - 16 - table_len..n - 16];
    let data_end = (n - 16 - table_len) as u64;
    table
        .chunks_exact(ENTRY_LEN)
        .map(|c| parse_entry(c, data_end).ok_or_else(|| bad("trailer entry")))
        .collect()
}

fn parse_entry(c: &[u8], data_end: u64) -> Option<PackEntry> {
    let u = |r: std::ops::Range<usize>| u64::from_le_bytes(c[r].try_into().expect("8 bytes"));
    let e = PackEntry {
        digest: c[..32].try_into().ok()?,
        offset: u(32..40),
        stored_len: u(40..48),
        raw_len: u(48..56),
        codec: Codec::from_code(c[56])?,
    };
    (e.offset >= HEADER_LEN && e.offset.checked_add(e.stored_len)? <= data_end).then_some(e)
}
