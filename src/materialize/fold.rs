//! The fold: a generation's base ⊕ delta, in key order, into a new base in
//! staging (through the shared representation writer), with relocated
//! frames of sparse packs, its identity checked against the generation's
//! before anything leaves staging.

use super::repack::repack;
use super::verify::verify_output;
use super::Cancel;
use crate::compose::GenView;
use crate::error::{Error, Result};
use crate::failpoint::Step;
use crate::format::manifest::RepKind;
use crate::format::segment::GROUP_ROWS;
use crate::rep_writer::{store_manifest, RepHead, RepWriter};
use crate::staging::Staging;
use crate::store::Store;
use crate::task::{CheckpointWriter, TaskRecord};
use std::path::Path;

/// Fold the view into a base in staging, move it to its final names and
/// verify it; returns the manifest name and the rows written.
pub(super) fn fold(
    store: &Store,
    t: &TaskRecord,
    view: &GenView,
    staging: &Staging,
    cancel: &Cancel,
) -> Result<(String, u64)> {
    let relocated = repack(store, view, staging)?;
    cancel.check("after repacking")?;
    let dir = staging.dir.join("segments");
    let mut writer = RepWriter::new(&dir)?;
    let mut checkpoint = CheckpointWriter::new(store, t);
    let mut rows = view.rows()?;
    let mut written = 0u64;
    while let Some(mut r) = rows.next_row()? {
        if let Some(loc) = r.digest.and_then(|d| relocated.get(&d)) {
            r.blob = *loc;
        }
        writer.live(&r);
        written += 1;
        let boundary = written % GROUP_ROWS as u64 == 0;
        let key = boundary.then(|| [hex::encode(&r.parent), hex::encode(&r.name)]);
        writer.write(r)?;
        if let Some(key) = key {
            progress(&mut checkpoint, &dir, written, key);
            checkpoint.tick();
            cancel.check("between row groups")?;
        }
    }
    let staged = writer.finish()?;
    let last_key = checkpoint.progress.last_key.clone().unwrap_or_default();
    progress(&mut checkpoint, &dir, written, last_key);
    checkpoint.write();
    store.failpoints().hit(Step::Folded)?;
    if staged.identity != view.pin.record.identity {
        return Err(Error::corrupt(
            "materialized rows",
            &t.id,
            "identity differs from the generation's",
        ));
    }
    let segments = staged.store_segments(store)?;
    let manifest = staged.manifest(store, base_head(view), segments)?;
    let name = store_manifest(store, &manifest)?;
    let rows = verify_output(store, &name, view)?;
    Ok((name, rows))
}

/// The checkpoint's figures after `rows` rows (segment bytes as staged so far).
fn progress(checkpoint: &mut CheckpointWriter, dir: &Path, rows: u64, last_key: [String; 2]) {
    let p = &mut checkpoint.progress;
    p.rows_folded = rows;
    p.bytes_written = staged_bytes(dir);
    p.last_key = Some(last_key);
}

/// Bytes of the files in `dir` (0 where unreadable: the figure is advisory).
fn staged_bytes(dir: &Path) -> u64 {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return 0;
    };
    entries
        .flatten()
        .filter_map(|e| e.metadata().ok())
        .map(|m| m.len())
        .sum()
}

/// The new base keeps the generation's bindings, instant and message.
fn base_head(view: &GenView) -> RepHead {
    let top = &view.top().manifest;
    RepHead {
        set: top.set.clone(),
        generation: top.generation,
        representation: RepKind::Base,
        base: None,
        parent: top.parent.clone(),
        observed_ns: top.observed_ns,
        message: top.message.clone(),
        journal: None,
        coverage: top.coverage.clone(),
        metadata: top.metadata,
    }
}
