//! Verified ranged reads of a blob read remotely piece by piece (too large
//! for the local cache of a remote store).
//!
//! A blob's digest is the root of a BLAKE3 tree over 1 KiB chunks. Cut into
//! pieces of [`PIECE`] bytes (a power of two of chunks), every piece but the
//! last is a complete subtree, so its chaining value can be computed on its
//! own. [`Pieces::verify`] reads the blob once, computes every piece's
//! chaining value, and checks that together they hash to the digest; from
//! then on each piece read later is checked against its own value, so no
//! byte is served that the digest does not vouch for (invariant 2) without
//! hashing the whole blob again. Chaining values take 32 bytes per MiB.

use super::Storage;
use crate::error::{Error, Result};
use blake3::hazmat::{
    left_subtree_len, merge_subtrees_non_root, merge_subtrees_root, ChainingValue, HasherExt, Mode,
};
use std::sync::{Arc, Mutex, PoisonError};

/// Bytes per piece: 1024 BLAKE3 chunks.
pub const PIECE: u64 = 1 << 20;
/// Bytes fetched per request while verifying.
const FETCH: u64 = 8 << 20;

/// The verified pieces of one blob, and the piece read last.
#[derive(Debug)]
pub struct Pieces {
    key: String,
    size: u64,
    /// Chaining value of each piece; for a blob of one piece, its digest.
    values: Vec<[u8; 32]>,
    last: Mutex<Option<(u64, Arc<Vec<u8>>)>>,
}

impl Pieces {
    /// Read the blob at `key` (`size` bytes) in ranged reads and check that
    /// its pieces hash to `digest`.
    pub fn verify(
        storage: &dyn Storage,
        key: &str,
        size: u64,
        digest: &[u8; 32],
    ) -> Result<Pieces> {
        let mut values = Vec::with_capacity(size.div_ceil(PIECE) as usize);
        let mut off = 0;
        while off < size {
            let bytes = storage.get_range_uncached(key, off, FETCH.min(size - off))?;
            values.extend(values_at(off, &bytes, size));
            off += bytes.len() as u64;
        }
        if root(&values, size) != *digest {
            return Err(Error::corrupt(
                "blob",
                key,
                "content fails its BLAKE3 check",
            ));
        }
        Ok(Pieces {
            key: key.to_string(),
            size,
            values,
            last: Mutex::new(None),
        })
    }

    /// Up to `len` bytes at `offset` (fewer at the end), every piece they
    /// come from checked.
    pub fn read(&self, storage: &dyn Storage, offset: u64, len: u64) -> Result<Vec<u8>> {
        let end = offset.saturating_add(len).min(self.size);
        let mut at = offset.min(end);
        let mut out = Vec::with_capacity((end - at) as usize);
        while at < end {
            let index = at / PIECE;
            let piece = self.piece(storage, index)?;
            let start = index * PIECE;
            let stop = (end - start).min(piece.len() as u64);
            out.extend_from_slice(&piece[(at - start) as usize..stop as usize]);
            at = start + stop;
        }
        Ok(out)
    }

    fn piece(&self, storage: &dyn Storage, index: u64) -> Result<Arc<Vec<u8>>> {
        if let Some((i, p)) = &*self.last.lock().unwrap_or_else(PoisonError::into_inner) {
            if *i == index {
                return Ok(p.clone());
            }
        }
        let off = index * PIECE;
        let bytes = storage.get_range_uncached(&self.key, off, PIECE.min(self.size - off))?;
        let want = self.values.get(index as usize);
        if want != Some(&piece_value(off, &bytes, self.size)) {
            return Err(Error::corrupt(
                "blob",
                &self.key,
                format!("piece at offset={off} fails its BLAKE3 check"),
            ));
        }
        let piece = Arc::new(bytes);
        *self.last.lock().unwrap_or_else(PoisonError::into_inner) = Some((index, piece.clone()));
        Ok(piece)
    }
}

/// The values of the pieces in `bytes`, which start at `offset` (a multiple
/// of [`PIECE`]) of a blob of `size` bytes; hashed on all cores.
pub(crate) fn values_at(offset: u64, bytes: &[u8], size: u64) -> Vec<[u8; 32]> {
    use rayon::prelude::*;
    bytes
        .par_chunks(PIECE as usize)
        .enumerate()
        .map(|(i, piece)| piece_value(offset + i as u64 * PIECE, piece, size))
        .collect()
}

/// The value a piece is checked by: its chaining value, or for a blob of
/// one piece, its (root) hash.
fn piece_value(offset: u64, piece: &[u8], size: u64) -> [u8; 32] {
    if size <= PIECE {
        return *blake3::hash(piece).as_bytes();
    }
    let mut hasher = blake3::Hasher::new();
    hasher.set_input_offset(offset);
    hasher.update(piece);
    hasher.finalize_non_root()
}

/// The root hash of a blob of `size` bytes from its piece values.
pub(crate) fn root(values: &[[u8; 32]], size: u64) -> [u8; 32] {
    if size <= PIECE {
        return values
            .first()
            .copied()
            .unwrap_or(*blake3::hash(&[]).as_bytes());
    }
    let (left, right, left_len) = split(values, size);
    let hash = merge_subtrees_root(
        &subtree(left, left_len),
        &subtree(right, size - left_len),
        Mode::Hash,
    );
    *hash.as_bytes()
}

/// The chaining value of a subtree of `len` bytes made of these pieces.
fn subtree(values: &[[u8; 32]], len: u64) -> ChainingValue {
    if len <= PIECE {
        return values.first().copied().unwrap_or_default();
    }
    let (left, right, left_len) = split(values, len);
    merge_subtrees_non_root(
        &subtree(left, left_len),
        &subtree(right, len - left_len),
        Mode::Hash,
    )
}

/// The pieces of the left and right subtrees of `len` bytes (over one
/// piece, the left subtree is a power of two of pieces).
fn split(values: &[[u8; 32]], len: u64) -> (&[[u8; 32]], &[[u8; 32]], u64) {
    let left_len = left_subtree_len(len);
    let k = ((left_len / PIECE) as usize).min(values.len());
    (&values[..k], &values[k..], left_len)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn values_of(data: &[u8]) -> Vec<[u8; 32]> {
        values_at(0, data, data.len() as u64)
    }

    #[test]
    fn piece_values_combine_to_the_blake3_hash() {
        let p = PIECE as usize;
        for len in [
            1,
            1024,
            p - 1,
            p,
            p + 1,
            2 * p,
            3 * p + 5,
            5 * p,
            8 * p + 1024,
        ] {
            let data: Vec<u8> = (0..len).map(|i| (i * 31 % 251) as u8).collect();
            let values = values_of(&data);
            assert_eq!(
                root(&values, len as u64),
                *blake3::hash(&data).as_bytes(),
                "len={len}"
            );
        }
    }

    #[test]
    fn a_changed_piece_no_longer_matches_its_value() {
        let data: Vec<u8> = (0..3 * PIECE as usize + 7)
            .map(|i| (i % 13) as u8)
            .collect();
        let values = values_of(&data);
        let mut bad = data[PIECE as usize..2 * PIECE as usize].to_vec();
        bad[100] ^= 1;
        assert_ne!(piece_value(PIECE, &bad, data.len() as u64), values[1]);
        // The same bytes at another offset are another subtree.
        let moved = &data[..PIECE as usize];
        assert_ne!(piece_value(PIECE, moved, data.len() as u64), values[0]);
    }
}
