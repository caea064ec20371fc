//! On-disk formats. Every one is versioned; the field tables, the version
//! history and who may write what when live in docs/FORMAT.md.

pub mod chunk;
pub mod journal;
pub mod manifest;
pub mod pack;
pub mod pointer;
pub mod record;
pub mod rowcodec;
pub mod segment;
pub mod xattrs;

use crate::error::{Error, Result};
use serde::de::DeserializeOwned;

/// Parse a versioned JSON document: check the `type` tag, refuse a newer
/// `version` with a clear error, then decode the body.
pub(crate) fn parse_versioned<T: DeserializeOwned>(
    what: &'static str,
    file: &str,
    tag: &str,
    supported: u32,
    bytes: &[u8],
) -> Result<T> {
    let value: serde_json::Value = serde_json::from_slice(bytes)
        .map_err(|e| Error::corrupt(what, file, format!("json: {e}")))?;
    if value.get("type").and_then(|t| t.as_str()) != Some(tag) {
        return Err(Error::corrupt(
            what,
            file,
            format!("type tag is not `{tag}`"),
        ));
    }
    let version = value
        .get("version")
        .and_then(|v| v.as_u64())
        .ok_or_else(|| Error::corrupt(what, file, "missing version"))?;
    match version {
        0 => return Err(Error::corrupt(what, file, "version 0")),
        v if v > supported as u64 => {
            return Err(Error::NewerFormat {
                what,
                found: v.min(u32::MAX as u64) as u32,
                supported,
            });
        }
        _ => {}
    }
    serde_json::from_value(value).map_err(|e| Error::corrupt(what, file, format!("fields: {e}")))
}

/// Lower-case hex SHA-256 of `bytes`.
pub(crate) fn sha256_hex(bytes: &[u8]) -> String {
    use sha2::Digest;
    hex::encode(sha2::Sha256::digest(bytes))
}
