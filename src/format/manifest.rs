//! Manifest: the JSON description of one representation of a generation,
//! stored under its SHA-256 (`manifests/<sha256>.json`). Written once by the
//! publisher before the PREPARED index record; never modified.

use super::{parse_versioned, sha256_hex};
use crate::error::{Error, Result};
use serde::{Deserialize, Serialize};

/// 1: initial layout. 2: `chunklists` (a version 1 manifest has none).
pub const MANIFEST_VERSION: u32 = 2;
pub const MANIFEST_TAG: &str = "strata-manifest";
/// Largest manifest a reader accepts.
pub const MAX_MANIFEST_BYTES: u64 = 64 << 20;

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum RepKind {
    Base,
    Delta,
}

impl RepKind {
    pub fn label(self) -> &'static str {
        match self {
            RepKind::Base => "base",
            RepKind::Delta => "delta",
        }
    }
}

/// The base a delta is relative to.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct BaseBinding {
    pub generation: u64,
    pub identity: String,
    pub manifest: String,
}

/// The generation this one was committed on top of.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ParentBinding {
    pub generation: u64,
    pub manifest: String,
}

#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Counts {
    /// Rows stored in this representation's segments (tombstones included).
    pub rows: u64,
    pub tombstones: u64,
    /// Live entries of the generation (not just of this representation).
    pub files: u64,
    pub dirs: u64,
    pub symlinks: u64,
    /// Sum of file sizes of the generation.
    pub bytes: u64,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SegmentRef {
    pub name: String,
    pub size: u64,
    pub rows: u64,
    /// `[hex(parent), hex(name)]` of the first and last row.
    pub first: [String; 2],
    pub last: [String; 2],
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct FileRef {
    pub name: String,
    pub size: u64,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Manifest {
    #[serde(rename = "type")]
    pub tag: String,
    pub version: u32,
    pub set: String,
    pub generation: u64,
    pub representation: RepKind,
    /// For a delta: the base it composes with. `None` for a base.
    pub base: Option<BaseBinding>,
    pub parent: Option<ParentBinding>,
    pub identity: String,
    pub counts: Counts,
    pub segments: Vec<SegmentRef>,
    /// Packs referenced by this representation's rows.
    pub packs: Vec<FileRef>,
    /// Standalone blobs referenced by this representation's rows (BLAKE3 names).
    pub blobs: Vec<FileRef>,
    /// Chunk lists referenced by this representation's rows (BLAKE3 names;
    /// each names its chunks).
    #[serde(default)]
    pub chunklists: Vec<FileRef>,
    pub created_ns: i64,
    /// When the walk that produced this generation started. Files whose
    /// mtime or ctime is not clearly before it are re-hashed next time.
    pub observed_ns: i64,
    #[serde(default)]
    pub message: Option<String>,
    /// BLAKE3 seal of the journal this was published from.
    #[serde(default)]
    pub journal: Option<String>,
}

/// True for a 64-character lowercase hex digest (every stored object name).
pub fn is_digest_name(s: &str) -> bool {
    s.len() == 64
        && s.bytes()
            .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b))
}

impl Manifest {
    /// Serialize; returns the bytes and their SHA-256 name.
    pub fn encode(&self) -> Result<(Vec<u8>, String)> {
        let bytes = serde_json::to_vec_pretty(self)
            .map_err(|e| Error::internal_from("encode a manifest", e))?;
        let name = sha256_hex(&bytes);
        Ok((bytes, name))
    }

    /// Verify `bytes` against `name` and decode.
    pub fn decode(name: &str, bytes: &[u8]) -> Result<Manifest> {
        let actual = sha256_hex(bytes);
        if actual != name {
            return Err(Error::corrupt(
                "manifest",
                name,
                format!("sha256 mismatch: actual={actual}"),
            ));
        }
        let m: Manifest = parse_versioned("manifest", name, MANIFEST_TAG, MANIFEST_VERSION, bytes)?;
        m.check(name)?;
        Ok(m)
    }

    fn check(&self, name: &str) -> Result<()> {
        let names = self
            .segments
            .iter()
            .map(|s| &s.name)
            .chain(self.packs.iter().map(|p| &p.name))
            .chain(self.blobs.iter().map(|b| &b.name))
            .chain(self.chunklists.iter().map(|c| &c.name));
        let bindings = self
            .base
            .iter()
            .map(|b| &b.manifest)
            .chain(self.parent.iter().map(|p| &p.manifest));
        if !names.chain(bindings).all(|n| is_digest_name(n)) {
            return Err(Error::corrupt(
                "manifest",
                name,
                "a referenced name is not 64 lowercase hex digits",
            ));
        }
        let ok = match self.representation {
            RepKind::Base => self.base.is_none(),
            RepKind::Delta => self
                .base
                .as_ref()
                .is_some_and(|b| b.generation < self.generation),
        };
        if !ok || self.generation == 0 {
            return Err(Error::corrupt(
                "manifest",
                name,
                "base binding inconsistent with representation",
            ));
        }
        Ok(())
    }
}
