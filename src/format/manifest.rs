//! Manifest: the JSON description of one representation of a generation,
//! stored under its SHA-256 (`manifests/<sha256>.json`). Written once by the
//! publisher before the PREPARED index record; never modified.

use super::{parse_versioned, sha256_hex};
use crate::error::{Error, Result};
use serde::{Deserialize, Serialize};

/// 1: initial layout. 2: `chunklists` (a version 1 manifest has none).
/// 3: `coverage` (a version 1 or 2 manifest has none: unknown).
pub const MANIFEST_VERSION: u32 = 4;
pub const MANIFEST_TAG: &str = "strata-manifest";
/// Largest manifest a reader accepts.
pub const MAX_MANIFEST_BYTES: u64 = 64 << 20;
/// Covered prefixes a manifest lists at most; a larger scope is recorded
/// by the digest of its paths, like a `--paths-from` list.
pub const MAX_COVERAGE_PREFIXES: usize = 1024;

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

/// How the commit that produced a generation chose what to observe.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum ScopeKind {
    /// The whole tree.
    Whole,
    /// Listed prefixes (`--prefix`), each with its whole subtree.
    Prefixes,
    /// A list of paths (`--paths-from`, or more prefixes than a manifest
    /// lists), recorded by its digest.
    Paths,
}

/// The observed scope of the commit that produced a generation: what was
/// looked at (the rest was inherited from the parent unchanged) and whether
/// the walk saw all of it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Coverage {
    pub scope: ScopeKind,
    /// For `prefixes`: hex of each covered path, sorted, none under another.
    #[serde(default)]
    pub prefixes: Vec<String>,
    /// For `paths`: BLAKE3 over each covered path followed by a NUL byte,
    /// in sorted order, none under another.
    #[serde(default)]
    pub paths_digest: Option<String>,
    /// Covered paths (1 for the whole tree).
    pub covered: u64,
    /// False when the walk skipped something (`--skip-unreadable`).
    pub complete: bool,
    /// Paths the walk skipped.
    pub skipped: u64,
}

impl Coverage {
    /// The whole tree, with `skipped` paths not observed.
    pub fn whole(skipped: u64) -> Coverage {
        Coverage {
            scope: ScopeKind::Whole,
            prefixes: Vec::new(),
            paths_digest: None,
            covered: 1,
            complete: skipped == 0,
            skipped,
        }
    }

    /// Covered `paths` (normalized, sorted, none under another): listed as
    /// prefixes unless they came from a list or are too many to list.
    pub fn of_paths(paths: &[Vec<u8>], listed: bool, skipped: u64) -> Coverage {
        let as_prefixes = !listed && paths.len() <= MAX_COVERAGE_PREFIXES;
        let (scope, prefixes, paths_digest) = match as_prefixes {
            true => (
                ScopeKind::Prefixes,
                paths.iter().map(hex::encode).collect(),
                None,
            ),
            false => (ScopeKind::Paths, Vec::new(), Some(paths_digest(paths))),
        };
        Coverage {
            scope,
            prefixes,
            paths_digest,
            covered: paths.len() as u64,
            complete: skipped == 0,
            skipped,
        }
    }

    /// True for the whole tree, walked without skipping anything.
    pub fn is_whole_and_complete(&self) -> bool {
        self.scope == ScopeKind::Whole && self.complete
    }

    fn consistent(&self) -> bool {
        let shape = match self.scope {
            ScopeKind::Whole => {
                self.prefixes.is_empty() && self.paths_digest.is_none() && self.covered == 1
            }
            ScopeKind::Prefixes => {
                self.paths_digest.is_none()
                    && self.prefixes.len() as u64 == self.covered
                    && self.prefixes.len() <= MAX_COVERAGE_PREFIXES
                    && self.prefixes.iter().all(|p| hex::decode(p).is_ok())
            }
            ScopeKind::Paths => {
                self.prefixes.is_empty() && self.paths_digest.as_deref().is_some_and(is_digest_name)
            }
        };
        shape && self.complete == (self.skipped == 0)
    }
}

/// BLAKE3 over each path followed by a NUL byte (the `paths` digest).
pub fn paths_digest(paths: &[Vec<u8>]) -> String {
    let mut h = blake3::Hasher::new();
    for p in paths {
        h.update(p);
        h.update(&[0]);
    }
    h.finalize().to_hex().to_string()
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
    /// FIFOs, sockets and device nodes (absent from older manifests: 0).
    #[serde(default, skip_serializing_if = "is_zero")]
    pub special: u64,
    /// Sum of file sizes of the generation.
    pub bytes: u64,
}

fn is_zero(n: &u64) -> bool {
    *n == 0
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
    /// The observed scope of the commit that produced the generation
    /// (version 3; `None`: unknown, a manifest written before it).
    #[serde(default)]
    pub coverage: Option<Coverage>,
    /// Every live row of the generation was observed by a walk that records
    /// metadata (link groups, device numbers, extended attributes). False
    /// for manifests before version 4: the next whole-tree commit then
    /// reads the metadata of entries its stat finds unchanged too.
    #[serde(default)]
    pub metadata: bool,
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
        if self.coverage.as_ref().is_some_and(|c| !c.consistent()) {
            return Err(Error::corrupt(
                "manifest",
                name,
                "coverage inconsistent (scope, prefixes, digest, counts)",
            ));
        }
        Ok(())
    }
}
