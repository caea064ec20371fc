//! Verify: re-read and re-hash everything reachable from the selected
//! generations: index records, manifests, segments (digest, schema, key
//! order), the recomputed identity, packs (digest and trailer), every blob a
//! row references, and the bindings of each generation's manifest to its
//! parent and base (`lineage::binding_problem`). Problems are collected,
//! never fatal one by one.

use crate::blob;
use crate::compose::{load_manifest, GenView};
use crate::error::{Error, Result};
use crate::format::pack::{self, MAX_PACK_BYTES};
use crate::format::record::State;
use crate::identity::IdentityHasher;
use crate::index::GenIndex;
use crate::row::{BlobLoc, Kind};
use crate::store::{keys, Store};
use serde::Serialize;
use std::collections::BTreeSet;

#[derive(Debug, Default, Serialize)]
pub struct VerifyReport {
    pub generations: Vec<String>,
    pub manifests: u64,
    pub segments: u64,
    pub packs: u64,
    pub blobs: u64,
    pub rows: u64,
    pub problems: Vec<String>,
}

/// Which generations to check.
#[derive(Debug, Clone, Copy)]
pub enum Selection {
    Latest,
    One(u64),
    All,
}

pub fn verify(store: &Store, sets: &[String], sel: Selection) -> Result<VerifyReport> {
    let mut report = VerifyReport::default();
    let mut seen = Seen::default();
    for set in sets {
        let index = GenIndex::new(store, set);
        let gens: Vec<u64> = match sel {
            Selection::Latest => index.latest()?.map(|r| r.generation).into_iter().collect(),
            // An unknown generation is bad input, not a problem found.
            Selection::One(g) => vec![index.load(g)?.generation],
            Selection::All => index
                .all()?
                .into_iter()
                .filter(|(_, r)| r.state == State::Committed)
                .map(|(g, _)| g)
                .collect(),
        };
        for g in gens {
            report.generations.push(format!("{set}@{g}"));
            if let Err(e) = verify_generation(store, set, g, &mut report, &mut seen) {
                report
                    .problems
                    .push(format!("{set}@{g}: {}", crate::cli_chain(&e)));
            }
        }
    }
    Ok(report)
}

#[derive(Default)]
struct Seen {
    manifests: BTreeSet<String>,
    packs: BTreeSet<String>,
    blobs: BTreeSet<String>,
}

fn verify_generation(
    store: &Store,
    set: &str,
    g: u64,
    report: &mut VerifyReport,
    seen: &mut Seen,
) -> Result<()> {
    let view = GenView::open(store, set, Some(g), "verify")?;
    if let Some(b) = crate::lineage::binding_problem(store, &view.pin.record, &view.top().manifest)?
    {
        report.problems.push(format!("{set}@{g}: binding: {b}"));
    }
    for rep in std::iter::once(&view.base).chain(view.delta.as_ref()) {
        if seen.manifests.insert(rep.manifest_name.clone()) {
            report.manifests += 1;
            report.segments += rep.manifest.segments.len() as u64;
            load_manifest(store, &rep.manifest_name)?;
            for p in &rep.manifest.packs {
                check_pack(store, &p.name, p.size, report, seen);
            }
        }
    }
    let mut hasher = IdentityHasher::new();
    let mut last: Option<crate::row::Row> = None;
    for row in view.rows()? {
        let row = row?;
        if last.as_ref().is_some_and(|l| l.key_cmp(&row).is_ge()) {
            return Err(Error::corrupt(
                "generation",
                format!("{set}@{g}"),
                "composed rows out of order",
            ));
        }
        report.rows += 1;
        hasher.push(&row);
        check_content(store, &row, report, seen);
        last = Some(row);
    }
    let identity = hasher.finish();
    if identity != view.pin.record.identity {
        report.problems.push(format!(
            "{set}@{g}: identity mismatch: recomputed={identity} recorded={}",
            view.pin.record.identity
        ));
    }
    Ok(())
}

fn check_pack(store: &Store, name: &str, size: u64, report: &mut VerifyReport, seen: &mut Seen) {
    if !seen.packs.insert(name.to_string()) {
        return;
    }
    report.packs += 1;
    let res = store
        .storage()
        .get(&keys::pack(name), MAX_PACK_BYTES)
        .and_then(|bytes| {
            if bytes.len() as u64 != size {
                return Err(Error::corrupt("pack", name, "size differs from manifest"));
            }
            pack::parse(name, &bytes).map(|_| ())
        });
    if let Err(e) = res {
        report
            .problems
            .push(format!("pack {name}: {}", crate::cli_chain(&e)));
    }
}

fn check_content(store: &Store, row: &crate::row::Row, report: &mut VerifyReport, seen: &mut Seen) {
    if row.kind != Kind::File {
        return;
    }
    let key = match row.blob {
        BlobLoc::Standalone => hex::encode(row.digest.unwrap_or_default()),
        BlobLoc::Chunked { list, .. } => format!("chunks {}", hex::encode(list)),
        BlobLoc::Packed { pack, offset, .. } => format!("{}@{offset}", hex::encode(pack)),
        BlobLoc::None => "empty".into(),
    };
    if !seen.blobs.insert(key) {
        return;
    }
    report.blobs += 1;
    let res = blob::copy_to(store, row, &mut std::io::sink());
    if let Err(e) = res {
        report.problems.push(format!(
            "{}: {}",
            crate::row::show(&row.path()),
            crate::cli_chain(&e)
        ));
    }
}
