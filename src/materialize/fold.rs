//! The fold: a generation's base ⊕ delta, in key order, into a new base in
//! staging (through the shared representation writer), with relocated
//! frames of sparse packs, its identity checked against the generation's
//! before anything leaves staging.

use super::repack::repack;
use super::verify::verify_output;
use crate::compose::GenView;
use crate::error::{Error, Result};
use crate::failpoint::Step;
use crate::format::manifest::RepKind;
use crate::rep_writer::{store_manifest, RepHead, RepWriter};
use crate::staging::Staging;
use crate::store::Store;
use crate::task::TaskRecord;

/// Fold the view into a base in staging, move it to its final names and
/// verify it; returns the manifest name and the rows written.
pub(super) fn fold(
    store: &Store,
    t: &TaskRecord,
    view: &GenView,
    staging: &Staging,
) -> Result<(String, u64)> {
    let relocated = repack(store, view, staging)?;
    let mut writer = RepWriter::new(&staging.dir.join("segments"))?;
    let mut rows = view.rows()?;
    while let Some(mut r) = rows.next_row()? {
        if let Some(loc) = r.digest.and_then(|d| relocated.get(&d)) {
            r.blob = *loc;
        }
        writer.live(&r);
        writer.write(r)?;
    }
    let staged = writer.finish()?;
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
    }
}
