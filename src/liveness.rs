//! Pack liveness: how many of a pack's frame bytes rows still use, and the
//! one threshold under which a pack is sparse.
//!
//! The sweep's report (store-wide, over every reachable row) and a fold's
//! repack (one generation's composed rows) both count here, by frame
//! (offset, length) against the pack's frame bytes (its size less header and
//! trailer), so the sparse packs a sweep reports are the packs a fold of the
//! same rows rewrites. A fold counts its rows' frames in memory
//! ([`FrameUse`]); a sweep counts every reachable row's as sorted
//! [`Frame`] records under its memory budget (`crate::spill`) and sums
//! them per pack in pack order ([`LiveByPack`]).

use crate::error::Result;
use crate::format::pack::{overhead, TAIL_LEN};
use crate::row::BlobLoc;
use crate::spill::{read_fixed, Record};
use crate::store::{keys, Store};
use std::cmp::Ordering;
use std::collections::HashMap;
use std::io::Read;
use std::path::Path;

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
        let live = self.live_bytes(&pack);
        PackUse::of(store, pack, size, live)
    }
}

/// One frame a row uses. The sort key is the whole record, so a frame
/// many rows share is counted once.
#[derive(Debug, Clone, Copy)]
pub struct Frame {
    pub pack: [u8; 32],
    pub offset: u64,
    pub len: u64,
}

impl Frame {
    /// The frame `loc` names (none for a non-packed location).
    pub fn of(loc: BlobLoc) -> Option<Frame> {
        match loc {
            BlobLoc::Packed {
                pack, offset, len, ..
            } => Some(Frame { pack, offset, len }),
            _ => None,
        }
    }
}

/// Scratch encoding: pack, offset (u64le), length (u64le).
const FRAME_BYTES: usize = 48;

impl Record for Frame {
    fn key_cmp(&self, other: &Self) -> Ordering {
        (self.pack, self.offset, self.len).cmp(&(other.pack, other.offset, other.len))
    }

    fn encode(&self, out: &mut Vec<u8>) {
        out.extend_from_slice(&self.pack);
        out.extend_from_slice(&self.offset.to_le_bytes());
        out.extend_from_slice(&self.len.to_le_bytes());
    }

    fn read(input: &mut impl Read, run: &Path) -> Result<Option<Frame>> {
        let Some(b) = read_fixed::<FRAME_BYTES>(input, run)? else {
            return Ok(None);
        };
        let (mut pack, mut offset, mut len) = ([0u8; 32], [0u8; 8], [0u8; 8]);
        pack.copy_from_slice(&b[..32]);
        offset.copy_from_slice(&b[32..40]);
        len.copy_from_slice(&b[40..]);
        Ok(Some(Frame {
            pack,
            offset: u64::from_le_bytes(offset),
            len: u64::from_le_bytes(len),
        }))
    }

    /// The same frame used again adds nothing.
    fn absorb(&mut self, _later: &Frame) -> Result<()> {
        Ok(())
    }
}

/// Live frame bytes per pack from distinct frames sorted by pack, asked
/// for packs in ascending order.
pub struct LiveByPack<I> {
    next: Option<Frame>,
    rest: I,
}

impl<I: Iterator<Item = Result<Frame>>> LiveByPack<I> {
    pub fn new(mut frames: I) -> Result<LiveByPack<I>> {
        let next = frames.next().transpose()?;
        Ok(LiveByPack { next, rest: frames })
    }

    /// How much of `pack` (`size` bytes stored) is live; frames of packs
    /// before it are passed.
    pub fn pack_use(&mut self, store: &Store, pack: [u8; 32], size: u64) -> Result<PackUse> {
        let mut live = 0u64;
        while let Some(f) = self.next.filter(|f| f.pack <= pack) {
            if f.pack == pack {
                live = live.saturating_add(f.len);
            }
            self.next = self.rest.next().transpose()?;
        }
        Ok(PackUse::of(store, pack, size, live))
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
    /// The share of `pack` (`size` bytes stored) that `live` bytes of
    /// distinct frames use: the one rule every count goes through.
    fn of(store: &Store, pack: [u8; 32], size: u64, live: u64) -> PackUse {
        let frames = size.saturating_sub(pack_overhead(store, &pack, size));
        PackUse {
            pack,
            size,
            frames,
            live: live.min(frames),
        }
    }

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
