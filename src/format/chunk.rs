//! Chunks and chunk lists: how a large file is stored (docs/FORMAT.md,
//! "Chunk" and "Chunk list").
//!
//! A chunk object, `chunks/<b3[0..2]>/<blake3>`, holds one content-defined
//! piece of a file, named by the BLAKE3 of its raw bytes: a 10-byte header
//! (magic, version, codec, raw length) and the raw bytes or one zstd frame.
//! Decoding checks the length and the name, so a chunk is verified on its
//! own.
//!
//! A chunk list, `chunklists/<b3[0..2]>/<blake3>`, named by the BLAKE3 of its
//! own bytes and bound to the file by the row (`BlobLoc::Chunked`), maps the
//! file's logical bytes in order to data extents (a chunk: length and
//! digest) and holes (a length of zeros, never stored).

use crate::error::{Error, Result};
use crate::row::Codec;

/// 1: initial layout.
pub const CHUNK_VERSION: u8 = 1;
pub const CHUNK_LIST_VERSION: u32 = 1;
const CHUNK_MAGIC: &[u8; 4] = b"SCHK";
const CHUNK_HEADER: usize = 10;
const LIST_MAGIC: &[u8; 8] = b"STRATACL";
const LIST_HEADER: usize = 8 + 4 + 4 + 8 + 4;
/// Largest chunk a writer cuts and a reader accepts (raw bytes).
pub const MAX_CHUNK: u64 = 4 << 20;
/// Largest stored chunk object a reader fetches.
pub const MAX_CHUNK_OBJECT: u64 = MAX_CHUNK + (MAX_CHUNK >> 4) + 1024;
/// Largest chunk list a reader accepts (about 1.5 TiB of 1 MiB chunks).
pub const MAX_CHUNK_LIST_BYTES: u64 = 64 << 20;

/// Encode a chunk object: header and payload (`payload` already encoded by
/// `codec`).
pub fn encode_chunk(codec: Codec, raw_len: u32, payload: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(CHUNK_HEADER + payload.len());
    out.extend_from_slice(CHUNK_MAGIC);
    out.push(CHUNK_VERSION);
    out.push(codec.code());
    out.extend_from_slice(&raw_len.to_le_bytes());
    out.extend_from_slice(payload);
    out
}

/// The BLAKE3 of a chunk object's decoded content (what it must be named).
pub fn content_digest(name: &str, stored: &[u8]) -> Result<[u8; 32]> {
    let len = stored
        .get(6..10)
        .map(|b| u64::from(u32::from_le_bytes(b.try_into().unwrap_or_default())))
        .unwrap_or(0);
    let raw = decode(name, stored, len)?;
    Ok(*blake3::hash(&raw).as_bytes())
}

/// Decode a chunk object into its raw bytes, checked against `digest` (its
/// name) and the length the list gives.
pub fn decode_chunk(name: &str, stored: &[u8], digest: &[u8; 32], len: u64) -> Result<Vec<u8>> {
    let raw = decode(name, stored, len)?;
    if blake3::hash(&raw).as_bytes() != digest {
        return Err(Error::corrupt(
            "chunk",
            name,
            "content fails its BLAKE3 check",
        ));
    }
    Ok(raw)
}

/// The raw bytes of a chunk object of `len` raw bytes (unverified).
fn decode(name: &str, stored: &[u8], len: u64) -> Result<Vec<u8>> {
    let bad = |why: String| Error::corrupt("chunk", name, why);
    if stored.len() < CHUNK_HEADER || &stored[..4] != CHUNK_MAGIC {
        return Err(bad("bad magic".into()));
    }
    if stored[4] > CHUNK_VERSION {
        return Err(Error::NewerFormat {
            what: "chunk",
            found: u32::from(stored[4]),
            supported: u32::from(CHUNK_VERSION),
        });
    }
    let codec = Codec::from_code(stored[5]).ok_or_else(|| bad("unknown codec".into()))?;
    let raw_len = u64::from(u32::from_le_bytes(
        stored[6..10].try_into().unwrap_or_default(),
    ));
    if raw_len != len || raw_len > MAX_CHUNK {
        return Err(bad(format!(
            "length {raw_len} differs from the list's {len}"
        )));
    }
    let payload = &stored[CHUNK_HEADER..];
    let raw = match codec {
        Codec::Raw => payload.to_vec(),
        Codec::Zstd => super::zstd_decode(payload, raw_len).map_err(bad)?,
    };
    if raw.len() as u64 != raw_len {
        return Err(bad(format!(
            "decodes to {} bytes, not {raw_len}",
            raw.len()
        )));
    }
    Ok(raw)
}

/// One extent of a chunked file, in file order.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Extent {
    /// `len` bytes stored as the chunk named `digest`.
    Data { len: u64, digest: [u8; 32] },
    /// `len` zero bytes, not stored.
    Hole { len: u64 },
}

impl Extent {
    /// The bytes of the file this extent covers.
    pub fn span(&self) -> u64 {
        match self {
            Extent::Data { len, .. } | Extent::Hole { len } => *len,
        }
    }
}

/// The extents of one file, with each extent's offset.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ChunkList {
    pub size: u64,
    pub extents: Vec<Extent>,
    /// Offset of each extent (same length as `extents`).
    pub offsets: Vec<u64>,
}

impl ChunkList {
    pub fn new(extents: Vec<Extent>) -> ChunkList {
        let mut offsets = Vec::with_capacity(extents.len());
        let mut at: u64 = 0;
        for e in &extents {
            offsets.push(at);
            at = at.saturating_add(e.span());
        }
        ChunkList {
            size: at,
            extents,
            offsets,
        }
    }

    /// Serialize; returns the bytes and their BLAKE3 (the list's name).
    pub fn encode(&self) -> (Vec<u8>, [u8; 32]) {
        let mut out = Vec::with_capacity(LIST_HEADER + self.extents.len() * 41);
        out.extend_from_slice(LIST_MAGIC);
        out.extend_from_slice(&CHUNK_LIST_VERSION.to_le_bytes());
        out.extend_from_slice(&0u32.to_le_bytes());
        out.extend_from_slice(&self.size.to_le_bytes());
        out.extend_from_slice(&(self.extents.len() as u32).to_le_bytes());
        for e in &self.extents {
            match e {
                Extent::Data { len, digest } => {
                    out.push(b'd');
                    out.extend_from_slice(&len.to_le_bytes());
                    out.extend_from_slice(digest);
                }
                Extent::Hole { len } => {
                    out.push(b'h');
                    out.extend_from_slice(&len.to_le_bytes());
                }
            }
        }
        let name = *blake3::hash(&out).as_bytes();
        (out, name)
    }

    /// Verify `bytes` against `digest` (the list's name) and decode; the
    /// extents must add up to the file size the list gives (the caller
    /// compares that with the row's).
    pub fn decode(digest: &[u8; 32], bytes: &[u8]) -> Result<ChunkList> {
        let name = hex::encode(digest);
        let bad = |why: &str| Error::corrupt("chunk list", &name, why);
        if blake3::hash(bytes).as_bytes() != digest {
            return Err(bad("content fails its BLAKE3 check"));
        }
        if bytes.len() < LIST_HEADER || &bytes[..8] != LIST_MAGIC {
            return Err(bad("bad magic"));
        }
        let u32_at =
            |at: usize| u32::from_le_bytes(bytes[at..at + 4].try_into().unwrap_or_default());
        let u64_at =
            |at: usize| u64::from_le_bytes(bytes[at..at + 8].try_into().unwrap_or_default());
        if u32_at(8) > CHUNK_LIST_VERSION {
            return Err(Error::NewerFormat {
                what: "chunk list",
                found: u32_at(8),
                supported: CHUNK_LIST_VERSION,
            });
        }
        let count = u32_at(24) as usize;
        let size = u64_at(16);
        if count > bytes.len() {
            return Err(bad("extent count exceeds the list"));
        }
        let mut extents = Vec::with_capacity(count);
        let mut at = LIST_HEADER;
        for _ in 0..count {
            let tag = bytes.get(at).copied();
            let Some(len) = bytes.get(at + 1..at + 9) else {
                return Err(bad("truncated extent"));
            };
            let len = u64::from_le_bytes(len.try_into().unwrap_or_default());
            match (tag, bytes.get(at + 9..at + 41)) {
                (Some(b'd'), Some(d)) if len > 0 && len <= MAX_CHUNK => {
                    let mut digest = [0u8; 32];
                    digest.copy_from_slice(d);
                    extents.push(Extent::Data { len, digest });
                    at += 41;
                }
                (Some(b'h'), _) if len > 0 => {
                    extents.push(Extent::Hole { len });
                    at += 9;
                }
                _ => return Err(bad("invalid extent")),
            }
        }
        let list = ChunkList::new(extents);
        if at != bytes.len() || list.size != size {
            return Err(bad("extents do not add up to the file size"));
        }
        Ok(list)
    }

    /// Index of the extent holding byte `offset` (`None` past the end).
    pub fn extent_at(&self, offset: u64) -> Option<usize> {
        if offset >= self.size {
            return None;
        }
        Some(self.offsets.partition_point(|&o| o <= offset) - 1)
    }

    /// `lseek` with `SEEK_DATA` (`data`) or `SEEK_HOLE`: the first offset at
    /// or after `offset` in data (a hole; the end of the file counts as
    /// one); `None` past the end, or for data, when none follows (ENXIO).
    pub fn seek(&self, offset: u64, data: bool) -> Option<u64> {
        let first = self.extent_at(offset)?;
        for i in first..self.extents.len() {
            if matches!(self.extents[i], Extent::Data { .. }) == data {
                return Some(self.offsets[i].max(offset));
            }
        }
        (!data).then_some(self.size)
    }

    /// Bytes stored as data (not holes).
    pub fn data_bytes(&self) -> u64 {
        self.extents
            .iter()
            .filter(|e| matches!(e, Extent::Data { .. }))
            .map(Extent::span)
            .sum()
    }

    /// Distinct chunk digests, in first-use order.
    pub fn chunk_digests(&self) -> impl Iterator<Item = &[u8; 32]> {
        self.extents.iter().filter_map(|e| match e {
            Extent::Data { digest, .. } => Some(digest),
            Extent::Hole { .. } => None,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample() -> ChunkList {
        ChunkList::new(vec![
            Extent::Data {
                len: 10,
                digest: [1; 32],
            },
            Extent::Hole { len: 100 },
            Extent::Data {
                len: 5,
                digest: [2; 32],
            },
        ])
    }

    #[test]
    fn a_list_round_trips_and_finds_extents() {
        let list = sample();
        let (bytes, name) = list.encode();
        let back = ChunkList::decode(&name, &bytes).unwrap();
        assert_eq!(back, list);
        assert_eq!(back.extent_at(0), Some(0));
        assert_eq!(back.extent_at(9), Some(0));
        assert_eq!(back.extent_at(10), Some(1));
        assert_eq!(back.extent_at(114), Some(2));
        assert_eq!(back.extent_at(115), None);
        assert_eq!(back.data_bytes(), 15);
        assert_eq!(back.seek(3, true), Some(3));
        assert_eq!(back.seek(3, false), Some(10));
        assert_eq!(back.seek(10, true), Some(110));
        assert_eq!(back.seek(111, false), Some(115));
        assert_eq!(back.seek(115, true), None);
    }

    #[test]
    fn a_changed_or_truncated_list_is_refused() {
        let (mut bytes, name) = sample().encode();
        bytes[30] ^= 1;
        assert!(ChunkList::decode(&name, &bytes).is_err());
        for cut in 0..bytes.len() {
            let short = &bytes[..cut];
            let named = *blake3::hash(short).as_bytes();
            assert!(ChunkList::decode(&named, short).is_err(), "cut={cut}");
        }
    }

    #[test]
    fn a_chunk_decodes_only_to_its_name() {
        let raw = b"hello chunk".repeat(100);
        let digest = *blake3::hash(&raw).as_bytes();
        let z = zstd::bulk::compress(&raw, 3).unwrap();
        let stored = encode_chunk(Codec::Zstd, raw.len() as u32, &z);
        let len = raw.len() as u64;
        assert_eq!(decode_chunk("c", &stored, &digest, len).unwrap(), raw);
        assert!(decode_chunk("c", &stored, &[0; 32], len).is_err());
        assert!(decode_chunk("c", &stored, &digest, len + 1).is_err());
        let mut flipped = stored.clone();
        *flipped.last_mut().unwrap() ^= 0x55;
        assert!(decode_chunk("c", &flipped, &digest, len).is_err());
        let stored = encode_chunk(Codec::Raw, raw.len() as u32, &raw);
        assert_eq!(decode_chunk("c", &stored, &digest, len).unwrap(), raw);
    }
}
