//! The `latest` hint: `sets/<set>/LATEST`. Updated in place by pointer CAS,
//! so its body carries a monotonically increasing counter and a nonce (a
//! content match can never be an ABA). Readers treat it as a hint and probe
//! the index forward from it.

use super::parse_versioned;
use crate::error::{Error, Result};
use serde::{Deserialize, Serialize};

/// 1: initial layout.
pub const POINTER_VERSION: u32 = 1;
pub const POINTER_TAG: &str = "strata-latest";
pub const MAX_POINTER_BYTES: u64 = 1 << 20;

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct LatestPointer {
    #[serde(rename = "type")]
    pub tag: String,
    pub version: u32,
    pub set: String,
    pub generation: u64,
    pub counter: u64,
    pub nonce: String,
}

impl LatestPointer {
    pub fn encode(&self) -> Result<Vec<u8>> {
        serde_json::to_vec(self).map_err(|e| Error::internal_from("encode the latest pointer", e))
    }

    pub fn decode(file: &str, bytes: &[u8]) -> Result<LatestPointer> {
        parse_versioned("latest pointer", file, POINTER_TAG, POINTER_VERSION, bytes)
    }
}
