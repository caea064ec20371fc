//! Output verification: a fold's base is re-read before it is published
//! (invariant 3): manifest and segments parse and match their digests, rows
//! ascend, relocated frames match their digests, and identity and row count
//! equal the generation's.

use crate::compose::{GenView, Representation};
use crate::error::{Error, Result};
use crate::format::manifest::RepKind;
use crate::identity::IdentityHasher;
use crate::row::{BlobLoc, Row};
use crate::store::Store;
use std::collections::HashSet;

/// Re-read an output representation: the manifest and every segment parse
/// and match their digests, rows ascend strictly, relocated frames match
/// their digests, and the recomputed identity and counts equal the
/// generation's. Returns the row count.
pub(super) fn verify_output(store: &Store, manifest: &str, view: &GenView) -> Result<u64> {
    let rep = Representation::open(store, manifest)?;
    let bad = |check: &str| Error::corrupt("materialized base", manifest, check.to_string());
    if rep.kind() != RepKind::Base || rep.manifest.generation != view.generation() {
        return Err(bad("not a base of this generation"));
    }
    // Frames in packs the sources do not list were relocated by this task:
    // each is read back and checked against its row's digest.
    let source_packs: HashSet<[u8; 32]> = std::iter::once(&view.base)
        .chain(&view.delta)
        .flat_map(|r| r.manifest.packs.iter())
        .filter_map(|p| hex::decode(&p.name).ok()?.try_into().ok())
        .collect();
    let check = |seg| check_segment(store, &rep, seg, &source_packs, &bad);
    let mut hasher = IdentityHasher::new();
    let mut last: Option<Row> = None;
    let mut n = 0u64;
    let segments: Vec<usize> = (0..rep.segment_count()).collect();
    for batch in segments.chunks(VERIFY_PARALLEL) {
        for checked in check_parallel(batch, &check) {
            let checked = checked?;
            let joins = match (&last, &checked.first) {
                (Some(l), Some(f)) => l.key_cmp(f).is_lt(),
                _ => true,
            };
            if !joins {
                return Err(bad("rows out of key order"));
            }
            hasher.push_encoded(&checked.encoded);
            n += checked.rows;
            last = checked.last.or(last);
        }
    }
    if hasher.finish() != view.pin.record.identity || n != rep.manifest.counts.rows {
        return Err(bad("identity or row count differs"));
    }
    Ok(n)
}

/// Output segments checked at once (each on its own thread, which decodes
/// and drops its own rows; only the encoded identity bytes cross over).
const VERIFY_PARALLEL: usize = 2;

/// What checking one output segment found.
struct CheckedSegment {
    first: Option<Row>,
    last: Option<Row>,
    /// The identity encoding of its rows, in order.
    encoded: Vec<u8>,
    rows: u64,
}

fn check_parallel(
    segments: &[usize],
    check: &(impl Fn(usize) -> Result<CheckedSegment> + Sync),
) -> Vec<Result<CheckedSegment>> {
    std::thread::scope(|s| {
        let running: Vec<_> = segments
            .iter()
            .map(|&i| s.spawn(move || check(i)))
            .collect();
        running
            .into_iter()
            .map(|h| {
                h.join()
                    .unwrap_or_else(|_| Err(Error::internal("a verify thread panicked")))
            })
            .collect()
    })
}

/// Decode segment `seg` of the output, check its rows ascend and its
/// relocated frames, and encode its rows for the identity.
fn check_segment(
    store: &Store,
    rep: &Representation,
    seg: usize,
    source_packs: &HashSet<[u8; 32]>,
    bad: &(impl Fn(&str) -> Error + Sync),
) -> Result<CheckedSegment> {
    let mut out = CheckedSegment {
        first: None,
        last: None,
        encoded: Vec::new(),
        rows: 0,
    };
    for group in 0..rep.group_count(seg)? {
        for r in rep.read_group(seg, group)? {
            if out.last.as_ref().is_some_and(|p| p.key_cmp(&r).is_ge()) {
                return Err(bad("rows out of key order"));
            }
            if let BlobLoc::Packed { pack, .. } = r.blob {
                if !source_packs.contains(&pack) {
                    crate::blob::packed_frame(store, &r)?;
                }
            }
            crate::identity::encode_row(&r, &mut out.encoded);
            out.rows += 1;
            if out.first.is_none() {
                out.first = Some(r.clone());
            }
            out.last = Some(r);
        }
    }
    Ok(out)
}
