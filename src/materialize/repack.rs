//! Repack: the live frames of the generation's sparse packs
//! ([`crate::liveness`], the rule the sweep reports by) are copied, verified,
//! into new packs before the fold, which points rows at the copies.

use crate::compose::GenView;
use crate::error::Result;
use crate::liveness::FrameUse;
use crate::pack_writer::RollingPacks;
use crate::row::BlobLoc;
use crate::staging::Staging;
use crate::store::Store;
use std::collections::{HashMap, HashSet};

/// Blobs relocated per task at most (bounds the relocation map).
const REPACK_MAX_BLOBS: usize = 500_000;

/// Where repacked blobs now live, by digest.
type Relocated = HashMap<[u8; 32], BlobLoc>;

/// The generation's sparse packs that rows still use: their live frames
/// are rewritten (`crate::liveness`, the rule the sweep reports by).
fn sparse_packs(store: &Store, view: &GenView) -> Result<HashSet<[u8; 32]>> {
    let reps = || std::iter::once(&view.base).chain(&view.delta);
    if reps().all(|rep| rep.manifest.packs.is_empty()) {
        return Ok(HashSet::new());
    }
    let mut used = FrameUse::default();
    let mut rows = view.rows()?;
    while let Some(r) = rows.next_row()? {
        used.add(r.blob);
    }
    let mut sparse = HashSet::new();
    let mut listed = HashSet::new();
    for p in reps().flat_map(|rep| rep.manifest.packs.iter()) {
        let Some(name) = hex::decode(&p.name)
            .ok()
            .and_then(|b| <[u8; 32]>::try_from(b).ok())
        else {
            continue;
        };
        if !listed.insert(name) {
            continue;
        }
        let pack = used.pack_use(store, name, p.size);
        if pack.live > 0 && pack.is_sparse() {
            sparse.insert(name);
        }
    }
    Ok(sparse)
}

/// Copy the live frames of sparse packs into new packs (verified on the
/// way) and say where each relocated blob now lives.
pub(super) fn repack(store: &Store, view: &GenView, staging: &Staging) -> Result<Relocated> {
    let sparse = sparse_packs(store, view)?;
    let mut relocated = Relocated::new();
    if sparse.is_empty() {
        return Ok(relocated);
    }
    let mut out = RollingPacks::new(store, &staging.dir.join("repack"))?;
    let mut rows = view.rows()?;
    while let Some(r) = rows.next_row()? {
        let (BlobLoc::Packed { pack, codec, .. }, Some(d)) = (r.blob, r.digest) else {
            continue;
        };
        let seen = relocated.contains_key(&d) || out.pending(|p| *p == d);
        if !sparse.contains(&pack)
            || seen
            || relocated.len() + out.pending_count() >= REPACK_MAX_BLOBS
        {
            continue;
        }
        let frame = crate::blob::packed_frame(store, &r)?;
        relocated.extend(out.append(d, d, codec, r.size, &frame)?);
    }
    relocated.extend(out.seal()?);
    Ok(relocated)
}
