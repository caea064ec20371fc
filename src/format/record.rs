//! Generation index records: `sets/<set>/index/<gen:020>.<record:06>.json`.
//!
//! Each record is the whole state of one generation at one record version;
//! a state change is a new record with the next version, created
//! exclusively (whoever creates a version first wins). The newest record of a
//! generation is authoritative.

use super::manifest::RepKind;
use super::parse_versioned;
use crate::error::{Error, Result};
use serde::{Deserialize, Serialize};

/// 1: initial layout.
pub const RECORD_VERSION: u32 = 1;
pub const RECORD_TAG: &str = "strata-index-record";
pub const MAX_RECORD_BYTES: u64 = 1 << 20;

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "UPPERCASE")]
pub enum State {
    Prepared,
    Committed,
    Retired,
}

impl State {
    pub fn label(self) -> &'static str {
        match self {
            State::Prepared => "PREPARED",
            State::Committed => "COMMITTED",
            State::Retired => "RETIRED",
        }
    }
}

/// One representation of the generation.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct RepRecord {
    pub kind: RepKind,
    pub manifest: String,
    /// Base generation a delta composes with.
    pub base: Option<u64>,
    pub state: State,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct IndexRecord {
    #[serde(rename = "type")]
    pub tag: String,
    pub version: u32,
    pub set: String,
    pub generation: u64,
    /// Version of this record within the generation (1, 2, ...).
    pub record: u32,
    pub state: State,
    pub parent: Option<u64>,
    pub identity: String,
    pub representations: Vec<RepRecord>,
    pub files: u64,
    pub bytes: u64,
    #[serde(default)]
    pub message: Option<String>,
    /// When this record was written.
    pub written_ns: i64,
    /// When the generation became COMMITTED (copied forward by later records).
    #[serde(default)]
    pub committed_ns: Option<i64>,
    /// Token of the writer that created this record.
    pub owner: String,
}

impl IndexRecord {
    /// Parse `<gen:020>.<record:06>.json`.
    pub fn parse_name(name: &str) -> Option<(u64, u32)> {
        let stem = name.strip_suffix(".json")?;
        let (g, r) = stem.split_once('.')?;
        if g.len() != 20 || r.len() != 6 {
            return None;
        }
        Some((g.parse().ok()?, r.parse().ok()?))
    }

    pub fn encode(&self) -> Result<Vec<u8>> {
        serde_json::to_vec_pretty(self)
            .map_err(|e| Error::internal_from("encode an index record", e))
    }

    pub fn decode(file: &str, bytes: &[u8]) -> Result<IndexRecord> {
        let r: IndexRecord =
            parse_versioned("index record", file, RECORD_TAG, RECORD_VERSION, bytes)?;
        if r.representations.is_empty() || r.generation == 0 || r.record == 0 {
            return Err(Error::corrupt(
                "index record",
                file,
                "record without representation, generation or version",
            ));
        }
        Ok(r)
    }

    /// The representation readers select: a committed base if there is one,
    /// else the committed delta.
    pub fn read_rep(&self) -> Option<&RepRecord> {
        let committed = || {
            self.representations
                .iter()
                .filter(|r| r.state == State::Committed)
        };
        committed()
            .find(|r| r.kind == RepKind::Base)
            .or_else(|| committed().next())
    }
}
