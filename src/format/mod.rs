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
use std::cell::RefCell;

thread_local! {
    /// One zstd decompression context per thread, reused: making one costs
    /// more than decoding a small frame (7% of a cold `grep -r` through
    /// the mount went to creating them).
    static DECOMPRESSOR: RefCell<Option<zstd::bulk::Decompressor<'static>>> =
        const { RefCell::new(None) };
}

/// Decode the zstd frame `payload`, whose content is `len` bytes long, into
/// exactly that many bytes. A frame that decodes to more is refused before
/// anything past `len` is written; the message says why it failed.
pub(crate) fn zstd_decode(payload: &[u8], len: u64) -> std::result::Result<Vec<u8>, String> {
    let cap = usize::try_from(len).map_err(|_| format!("length {len} does not fit in memory"))?;
    let mut out = Vec::with_capacity(cap);
    DECOMPRESSOR.with(|cell| {
        let mut slot = cell.borrow_mut();
        let dec = match slot.as_mut() {
            Some(dec) => dec,
            None => slot.insert(zstd::bulk::Decompressor::new().map_err(|e| format!("zstd: {e}"))?),
        };
        dec.decompress_to_buffer(payload, &mut out)
            .map_err(|e| format!("zstd: {e} (content of {len} bytes expected)"))
    })?;
    if out.len() != cap {
        return Err(format!("decodes to {} bytes, not {len}", out.len()));
    }
    Ok(out)
}

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

#[cfg(test)]
mod tests {
    use super::zstd_decode;

    #[test]
    fn a_frame_decodes_to_exactly_its_length_on_a_reused_context() {
        for text in [&b"strata generation"[..], &[7u8; 100_000][..], b""] {
            let frame = zstd::bulk::compress(text, 3).unwrap();
            for _ in 0..2 {
                assert_eq!(zstd_decode(&frame, text.len() as u64).unwrap(), text);
            }
        }
    }

    #[test]
    fn a_frame_longer_or_shorter_than_its_length_is_refused() {
        let frame = zstd::bulk::compress(&[1u8; 4096], 3).unwrap();
        let longer = zstd_decode(&frame, 4095).unwrap_err();
        assert!(longer.contains("4095 bytes expected"), "{longer}");
        let shorter = zstd_decode(&frame, 4097).unwrap_err();
        assert_eq!(shorter, "decodes to 4096 bytes, not 4097");
        assert!(zstd_decode(b"not a zstd frame", 16)
            .unwrap_err()
            .starts_with("zstd: "));
        assert_eq!(zstd_decode(&frame, 4096).unwrap(), vec![1u8; 4096]);
    }
}
