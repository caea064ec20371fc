//! Pack liveness: how many of a pack's frame bytes rows still use, and the
//! one threshold under which a pack is sparse.
//!
//! The sweep's report (store-wide, over every reachable row) and a fold's
//! repack (one generation's composed rows) both count here, by frame
//! (offset, length) against the pack's frame bytes (its size less header and
//! trailer), so the sparse packs a sweep reports are the packs a fold of the
//! same rows rewrites.

use crate::format::pack::{overhead, TAIL_LEN};
use crate::row::BlobLoc;
use crate::store::{keys, Store};
use std::collections::HashMap;

/// Packs with less than this fraction of their frame bytes live are sparse:
/// a fold rewrites their live frames into new packs.
pub const REPACK_BELOW: f64 = 0.5;

/// The frames rows use, per pack.
#[derive(Debug, Default)]
pub struct FrameUse {
    frames: HashMap<[u8; 32], Vec<(u64, u64)>>,
}

impl FrameUse {
    /// Count the frame `loc` names (nothing for a non-packed location).
    pub fn add(&mut self, loc: BlobLoc) {
        if let BlobLoc::Packed {
            pack, offset, len, ..
        } = loc
        {
            self.frames.entry(pack).or_default().push((offset, len));
        }
    }

    /// Whether no packed frame was counted.
    pub fn is_empty(&self) -> bool {
        self.frames.is_empty()
    }

    /// Bytes of the distinct frames of `pack` that rows use.
    fn live_bytes(&mut self, pack: &[u8; 32]) -> u64 {
        let Some(f) = self.frames.get_mut(pack) else {
            return 0;
        };
        f.sort_unstable();
        f.dedup();
        f.iter().map(|&(_, len)| len).sum()
    }

    /// How much of `pack` (`size` bytes stored) is live.
    pub fn pack_use(&mut self, store: &Store, pack: [u8; 32], size: u64) -> PackUse {
        let frames = size.saturating_sub(pack_overhead(store, &pack, size));
        PackUse {
            pack,
            size,
            frames,
            live: self.live_bytes(&pack).min(frames),
        }
    }
}

/// One pack's live share.
#[derive(Debug, Clone, Copy)]
pub struct PackUse {
    pub pack: [u8; 32],
    /// Stored size.
    pub size: u64,
    /// Bytes of frames (the size less header and trailer).
    pub frames: u64,
    /// Bytes of frames some counted row uses.
    pub live: u64,
}

impl PackUse {
    pub fn dead(&self) -> u64 {
        self.frames - self.live
    }

    /// Under [`REPACK_BELOW`] live.
    pub fn is_sparse(&self) -> bool {
        (self.live as f64) < (self.frames as f64) * REPACK_BELOW
    }
}

/// Header and trailer bytes of a pack (neither live nor dead); 0 when its
/// tail cannot be read (verify reports that, not liveness).
fn pack_overhead(store: &Store, pack: &[u8; 32], size: u64) -> u64 {
    let key = keys::pack(&hex::encode(pack));
    store
        .storage()
        .get_range_uncached(&key, size.saturating_sub(TAIL_LEN), TAIL_LEN)
        .ok()
        .and_then(|t| overhead(&t))
        .unwrap_or(0)
}
