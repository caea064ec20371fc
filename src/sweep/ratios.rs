//! Pack live ratios of what the mark reached: every reachable row's frame
//! counted against its pack (`crate::liveness`, the rule a fold's repack
//! uses), under the sweep's memory budget; reused while the marked
//! manifests stay the same (their rows are immutable).

use super::mark::{Kind, Obj};
use super::report::{SparsePack, SweepReport};
use crate::compose::Representation;
use crate::error::Result;
use crate::liveness::{Frame, LiveByPack};
use crate::spill::{SortBudget, Sorter, Spilled};
use crate::store::Store;
use std::path::Path;

/// Names how pack live ratios are computed; changing it makes the ratios in
/// older reports stale (they are not reused).
pub(super) const LIVENESS_KEY_TAG: &str = "strata-pack-liveness-2";

/// Pack live ratios of one set of reachable manifests.
#[derive(Default)]
pub(super) struct Liveness {
    pub(super) key: String,
    pub(super) live: u64,
    pub(super) dead: u64,
    pub(super) sparse: Vec<SparsePack>,
    pub(super) rows: u64,
}

/// Live and dead bytes of every marked pack, from the location columns of
/// every marked manifest's rows; reused from `previous` when the marked
/// manifests are the same. Frames sort in `dir` under `budget`.
pub(super) fn pack_liveness(
    store: &Store,
    marked: &Spilled<Obj>,
    previous: Option<&SweepReport>,
    dir: &Path,
    budget: SortBudget,
) -> Result<Liveness> {
    let key = liveness_key(marked)?;
    if let Some(p) = previous.filter(|p| p.liveness_key == key) {
        return Ok(Liveness {
            key,
            live: p.space.packs_live_bytes,
            dead: p.space.packs_dead_bytes,
            sparse: p.sparse_packs.clone(),
            rows: 0,
        });
    }
    let (frames, rows) = frames_of(store, marked, dir, budget)?;
    let mut out = tally_packs(store, marked, frames)?;
    out.key = key;
    out.rows = rows;
    Ok(out)
}

/// Marked objects of `kind`, in digest order.
fn marked_of(marked: &Spilled<Obj>, kind: Kind) -> Result<impl Iterator<Item = Result<Obj>> + '_> {
    Ok(marked
        .sorted()?
        .skip_while(move |o| o.as_ref().is_ok_and(|o| o.kind < kind))
        .take_while(move |o| o.as_ref().map_or(true, |o| o.kind == kind)))
}

/// BLAKE3 of [`LIVENESS_KEY_TAG`] and each marked manifest's name, sorted.
fn liveness_key(marked: &Spilled<Obj>) -> Result<String> {
    let mut h = blake3::Hasher::new();
    h.update(LIVENESS_KEY_TAG.as_bytes());
    for m in marked_of(marked, Kind::Manifest)? {
        h.update(b"\n");
        h.update(hex::encode(m?.digest).as_bytes());
    }
    Ok(hex::encode(h.finalize().as_bytes()))
}

/// Every frame the marked manifests' rows use, sorted; and the rows read.
fn frames_of(
    store: &Store,
    marked: &Spilled<Obj>,
    dir: &Path,
    budget: SortBudget,
) -> Result<(Spilled<Frame>, u64)> {
    let mut frames = Sorter::new(dir, budget)?;
    let mut rows = 0;
    for m in marked_of(marked, Kind::Manifest)? {
        let rep = Representation::open(store, &hex::encode(m?.digest))?;
        if rep.manifest.packs.is_empty() {
            continue;
        }
        let mut failed = Ok(());
        rep.blob_locs(|loc| {
            rows += 1;
            if let (Some(f), Ok(())) = (Frame::of(loc), &failed) {
                failed = frames.push(f);
            }
        })?;
        failed?;
    }
    Ok((frames.into_spilled()?, rows))
}

/// Live, dead and sparse packs among the marked ones.
fn tally_packs(store: &Store, marked: &Spilled<Obj>, frames: Spilled<Frame>) -> Result<Liveness> {
    let mut live = LiveByPack::new(frames.into_sorted()?)?;
    let mut out = Liveness::default();
    for p in marked_of(marked, Kind::Pack)? {
        let p = p?;
        let pack = live.pack_use(store, p.digest, p.size)?;
        out.live += pack.live;
        out.dead += pack.dead();
        if pack.is_sparse() {
            out.sparse.push(SparsePack {
                name: hex::encode(p.digest),
                size: p.size,
                live_bytes: pack.live,
            });
        }
    }
    Ok(out)
}
