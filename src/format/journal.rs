//! Journals: the sealed record of what one commit observed.
//!
//! `journals/<set>/<token>.journal`, append-only while the commit walks;
//! sealed with a footer holding the record count and the BLAKE3 of every
//! preceding byte. A reader verifies the seal before it yields a record, so a
//! torn or altered journal is never published. Layout: docs/FORMAT.md.

use super::rowcodec;
use crate::error::{Error, IoContext, Result};
use crate::row::Row;
use serde::{Deserialize, Serialize};
use std::fs::File;
use std::io::{BufReader, BufWriter, Read, Write};
use std::path::{Path, PathBuf};

/// 1: initial layout. 2: uid and gid in row records. 3: chunked blob
/// locations. 4: special kinds and an optional metadata tail (link group,
/// link count, device number, extended attributes) in row records.
pub const JOURNAL_VERSION: u32 = 4;
const MAGIC: &[u8; 8] = b"STRATAJL";
const SEAL_MAGIC: &[u8; 8] = b"STRJSEAL";
const SEAL_LEN: u64 = 8 + 8 + 32;
/// Largest single record (a row with two maximal paths fits easily).
pub const MAX_RECORD_BYTES: u32 = 64 << 10;
const MAX_HEADER_BYTES: u32 = 16 << 20;
/// Covered prefixes recorded in the header (the rest are only counted).
pub const SCOPE_IN_HEADER: usize = 1024;

/// What the journal covers and on top of what it was observed.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct JournalHeader {
    pub set: String,
    pub generation: u64,
    pub parent: Option<u64>,
    /// Hex-encoded covered prefixes, at most [`SCOPE_IN_HEADER`] of them;
    /// `[""]` is the whole tree.
    pub scope: Vec<String>,
    /// How many covered prefixes the commit had in all.
    pub scope_count: u64,
    pub owner: String,
    pub created_ns: i64,
}

pub struct JournalWriter {
    path: PathBuf,
    out: BufWriter<File>,
    hasher: blake3::Hasher,
    count: u64,
    buf: Vec<u8>,
}

impl JournalWriter {
    pub fn create(path: &Path, header: &JournalHeader) -> Result<JournalWriter> {
        let file = crate::token::create_private(path)?;
        let mut w = JournalWriter {
            path: path.to_path_buf(),
            out: BufWriter::with_capacity(1 << 20, file),
            hasher: blake3::Hasher::new(),
            count: 0,
            buf: Vec::new(),
        };
        let h = serde_json::to_vec(header)
            .map_err(|e| Error::internal_from("encode the journal header", e))?;
        let mut head = MAGIC.to_vec();
        head.extend_from_slice(&JOURNAL_VERSION.to_le_bytes());
        head.extend_from_slice(&(h.len() as u32).to_le_bytes());
        head.extend_from_slice(&h);
        w.write(&head)?;
        Ok(w)
    }

    fn write(&mut self, bytes: &[u8]) -> Result<()> {
        self.out.write_all(bytes).ctx("write", &self.path)?;
        self.hasher.update(bytes);
        Ok(())
    }

    pub fn append(&mut self, row: &Row) -> Result<()> {
        let mut buf = std::mem::take(&mut self.buf);
        buf.clear();
        buf.extend_from_slice(&[0; 4]);
        rowcodec::encode(row, &mut buf);
        let len = (buf.len() - 4) as u32;
        buf[..4].copy_from_slice(&len.to_le_bytes());
        self.write(&buf)?;
        self.buf = buf;
        self.count += 1;
        Ok(())
    }

    pub fn count(&self) -> u64 {
        self.count
    }

    /// Write the seal, fsync the journal and then its directory (a sealed
    /// journal outlives a power cut: the next commit may resume from it);
    /// returns the seal digest.
    pub fn seal(mut self) -> Result<String> {
        let mut tail = SEAL_MAGIC.to_vec();
        tail.extend_from_slice(&self.count.to_le_bytes());
        self.hasher.update(&tail);
        let digest = self.hasher.finalize();
        tail.extend_from_slice(digest.as_bytes());
        self.out.write_all(&tail).ctx("write", &self.path)?;
        let file = self
            .out
            .into_inner()
            .map_err(|e| Error::io("flush", &self.path, e.into_error()))?;
        file.sync_all().ctx("fsync", &self.path)?;
        let dir = match self.path.parent() {
            Some(d) if !d.as_os_str().is_empty() => d,
            _ => Path::new("."),
        };
        File::open(dir)
            .and_then(|d| d.sync_all())
            .ctx("fsync-dir", dir)?;
        Ok(digest.to_hex().to_string())
    }
}

/// A journal whose seal has been verified.
pub struct JournalReader {
    path: PathBuf,
    input: BufReader<File>,
    header: JournalHeader,
    remaining: u64,
    seal: String,
}

impl JournalReader {
    /// Verify the seal (one streaming pass), then position at the first record.
    pub fn open(path: &Path) -> Result<JournalReader> {
        let (count, seal) = verify_seal(path)?;
        let mut input = BufReader::with_capacity(1 << 20, File::open(path).ctx("open", path)?);
        let header = read_header(path, &mut input)?;
        Ok(JournalReader {
            path: path.to_path_buf(),
            input,
            header,
            remaining: count,
            seal,
        })
    }

    pub fn header(&self) -> &JournalHeader {
        &self.header
    }

    pub fn seal(&self) -> &str {
        &self.seal
    }

    pub fn next_row(&mut self) -> Result<Option<Row>> {
        if self.remaining == 0 {
            return Ok(None);
        }
        self.remaining -= 1;
        let name = self.path.display().to_string();
        let len = read_u32(&mut self.input, &self.path)?;
        if len > MAX_RECORD_BYTES {
            return Err(Error::corrupt("journal", name, "record over size limit"));
        }
        let mut buf = vec![0u8; len as usize];
        self.input.read_exact(&mut buf).ctx("read", &self.path)?;
        rowcodec::decode(&buf, &name).map(Some)
    }
}

fn read_u32(input: &mut impl Read, path: &Path) -> Result<u32> {
    let mut b = [0u8; 4];
    input.read_exact(&mut b).ctx("read", path)?;
    Ok(u32::from_le_bytes(b))
}

fn read_header(path: &Path, input: &mut impl Read) -> Result<JournalHeader> {
    let name = path.display().to_string();
    let mut magic = [0u8; 8];
    input.read_exact(&mut magic).ctx("read", path)?;
    if &magic != MAGIC {
        return Err(Error::corrupt("journal", name, "header magic"));
    }
    let version = read_u32(input, path)?;
    if version > JOURNAL_VERSION {
        return Err(Error::NewerFormat {
            what: "journal",
            found: version,
            supported: JOURNAL_VERSION,
        });
    }
    let len = read_u32(input, path)?;
    if len > MAX_HEADER_BYTES {
        return Err(Error::corrupt("journal", name, "header over size limit"));
    }
    let mut h = vec![0u8; len as usize];
    input.read_exact(&mut h).ctx("read", path)?;
    serde_json::from_slice(&h)
        .map_err(|e| Error::corrupt("journal", name, format!("header json: {e}")))
}

/// Hash everything before the seal and compare; returns (count, digest).
fn verify_seal(path: &Path) -> Result<(u64, String)> {
    let name = path.display().to_string();
    let mut f = File::open(path).ctx("open", path)?;
    let size = f.metadata().ctx("stat", path)?.len();
    if size < SEAL_LEN {
        return Err(Error::corrupt("journal", name, "not sealed (too short)"));
    }
    let body = size - SEAL_LEN;
    let mut hasher = blake3::Hasher::new();
    std::io::copy(&mut (&mut f).take(body), &mut hasher).ctx("read", path)?;
    let mut seal = [0u8; SEAL_LEN as usize];
    f.read_exact(&mut seal).ctx("read", path)?;
    if &seal[..8] != SEAL_MAGIC {
        return Err(Error::corrupt("journal", name, "not sealed (seal magic)"));
    }
    hasher.update(&seal[..16]);
    let digest = hasher.finalize();
    if seal[16..] != digest.as_bytes()[..] {
        return Err(Error::corrupt("journal", name, "seal digest mismatch"));
    }
    let count = u64::from_le_bytes(seal[8..16].try_into().expect("8 bytes"));
    Ok((count, digest.to_hex().to_string()))
}
