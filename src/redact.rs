//! The boundary-safe render of a manifest (`strata manifest --redacted`):
//! what may leave the store's trust boundary. It keeps digests, counts,
//! sizes, instants, lineage (generations and manifest digests) and a
//! coverage summary, and drops everything that names a path or the store:
//! segment key ranges (hex of paths), covered prefixes, the digest of a
//! paths list, the set name, the commit message and every store key.
//! Content digests remain, so whoever holds a file can confirm that a
//! generation holds it; docs/FORMAT.md has the field table.

use crate::format::manifest::{
    BaseBinding, Counts, Coverage, FileRef, Manifest, ParentBinding, RepKind, ScopeKind,
};
use serde::Serialize;

pub const REDACTED_TAG: &str = "strata-manifest-redacted";
/// 1: initial render.
pub const REDACTED_VERSION: u32 = 1;

/// A segment without its key range.
#[derive(Debug, Clone, Serialize)]
pub struct RedactedSegment {
    pub name: String,
    pub size: u64,
    pub rows: u64,
}

/// Parent and base bindings: generations and digests only.
#[derive(Debug, Clone, Serialize)]
pub struct RedactedLineage {
    pub parent: Option<ParentBinding>,
    pub base: Option<BaseBinding>,
}

/// The observed scope without what it covered.
#[derive(Debug, Clone, Serialize)]
pub struct CoverageSummary {
    /// `whole`, `prefixes`, `paths`, or `unknown` (a manifest older than
    /// coverage records).
    pub scope: &'static str,
    pub covered: Option<u64>,
    pub complete: Option<bool>,
    pub skipped: Option<u64>,
}

/// Stored bytes by kind of object.
#[derive(Debug, Clone, Default, Serialize)]
pub struct Sizes {
    pub segments: u64,
    pub packs: u64,
    pub blobs: u64,
    pub chunklists: u64,
}

#[derive(Debug, Clone, Serialize)]
pub struct RedactedManifest {
    #[serde(rename = "type")]
    pub tag: &'static str,
    pub version: u32,
    /// The manifest's own name (SHA-256 of its bytes) and format version.
    pub manifest: String,
    pub manifest_version: u32,
    pub generation: u64,
    pub representation: RepKind,
    pub identity: String,
    pub counts: Counts,
    pub sizes: Sizes,
    pub segments: Vec<RedactedSegment>,
    pub packs: Vec<FileRef>,
    pub blobs: Vec<FileRef>,
    pub chunklists: Vec<FileRef>,
    pub lineage: RedactedLineage,
    pub coverage: CoverageSummary,
    pub created_ns: i64,
    pub observed_ns: i64,
    pub journal: Option<String>,
}

/// Render manifest `name` for a reader outside the trust boundary.
pub fn redacted(name: &str, m: &Manifest) -> RedactedManifest {
    RedactedManifest {
        tag: REDACTED_TAG,
        version: REDACTED_VERSION,
        manifest: name.to_string(),
        manifest_version: m.version,
        generation: m.generation,
        representation: m.representation,
        identity: m.identity.clone(),
        counts: m.counts.clone(),
        sizes: sizes(m),
        segments: m
            .segments
            .iter()
            .map(|s| RedactedSegment {
                name: s.name.clone(),
                size: s.size,
                rows: s.rows,
            })
            .collect(),
        packs: m.packs.clone(),
        blobs: m.blobs.clone(),
        chunklists: m.chunklists.clone(),
        lineage: RedactedLineage {
            parent: m.parent.clone(),
            base: m.base.clone(),
        },
        coverage: summary(m.coverage.as_ref()),
        created_ns: m.created_ns,
        observed_ns: m.observed_ns,
        journal: m.journal.clone(),
    }
}

fn sizes(m: &Manifest) -> Sizes {
    let sum = |refs: &[FileRef]| refs.iter().map(|r| r.size).sum();
    Sizes {
        segments: m.segments.iter().map(|s| s.size).sum(),
        packs: sum(&m.packs),
        blobs: sum(&m.blobs),
        chunklists: sum(&m.chunklists),
    }
}

fn summary(c: Option<&Coverage>) -> CoverageSummary {
    let Some(c) = c else {
        return CoverageSummary {
            scope: "unknown",
            covered: None,
            complete: None,
            skipped: None,
        };
    };
    CoverageSummary {
        scope: match c.scope {
            ScopeKind::Whole => "whole",
            ScopeKind::Prefixes => "prefixes",
            ScopeKind::Paths => "paths",
        },
        covered: Some(c.covered),
        complete: Some(c.complete),
        skipped: Some(c.skipped),
    }
}
