//! Condemned lists: per epoch, every listed object the mark did not reach,
//! with the epoch and time it was first condemned (invariant 5: deletion
//! only after an earlier epoch condemned it, a grace period ago). Epoch
//! files are created exclusively and never rewritten.

use super::mark::{digest, Kind, Marks};
use super::report::{SweepReport, Tally};
use crate::error::{Error, Result};
use crate::failpoint::Step;
use crate::storage::PutOutcome;
use crate::store::{keys, Store};
use serde::Serialize;
use std::collections::{BTreeMap, HashMap};

/// 1: initial layout.
pub(super) const CONDEMNED_VERSION: u32 = 1;
const CONDEMNED_TAG: &str = "strata-condemned";
const MAX_CONDEMNED_BYTES: u64 = 1 << 30;
/// Epoch files (condemned lists and reports) kept besides the newest.
const KEEP_EPOCHS: u64 = 4;

/// Epoch and time each condemned object was first condemned.
pub(super) type FirstCondemned = HashMap<(Kind, [u8; 32]), (u64, i64)>;

/// One unreachable object.
#[derive(Debug, Clone)]
pub(super) struct Condemned {
    pub(super) kind: Kind,
    pub(super) digest: [u8; 32],
    pub(super) size: u64,
    pub(super) first_epoch: u64,
    pub(super) first_ns: i64,
}

impl Condemned {
    pub(super) fn key(&self) -> String {
        self.kind.key(&hex::encode(self.digest))
    }

    pub(super) fn line(&self) -> String {
        format!(
            "{} {} {} {} {}\n",
            self.kind.code(),
            hex::encode(self.digest),
            self.size,
            self.first_epoch,
            self.first_ns
        )
    }
}

#[derive(Serialize, serde::Deserialize)]
struct CondemnedHeader {
    #[serde(rename = "type")]
    tag: String,
    version: u32,
    epoch: u64,
    written_ns: i64,
    count: u64,
}

/// Epochs with a condemned list, ascending.
pub(super) fn epochs(store: &Store) -> Result<Vec<u64>> {
    let mut out: Vec<u64> = store
        .storage()
        .list(keys::EPOCH_DIR)?
        .iter()
        .filter_map(|n| n.strip_suffix(".condemned")?.parse().ok())
        .collect();
    out.sort_unstable();
    Ok(out)
}

/// The condemned list of `epoch`: first-condemned epoch and time per object.
pub(super) fn load_condemned(store: &Store, epoch: u64) -> Result<FirstCondemned> {
    let key = keys::epoch(epoch, "condemned");
    let bytes = store.storage().get(&key, MAX_CONDEMNED_BYTES)?;
    let text = std::str::from_utf8(&bytes)
        .map_err(|_| Error::corrupt("condemned list", &key, "not UTF-8"))?;
    let mut lines = text.lines();
    let header = lines.next().unwrap_or("");
    let h: CondemnedHeader = crate::format::parse_versioned(
        "condemned list",
        &key,
        CONDEMNED_TAG,
        CONDEMNED_VERSION,
        header.as_bytes(),
    )?;
    let mut out = HashMap::new();
    for line in lines {
        let bad = || Error::corrupt("condemned list", &key, format!("bad line `{line}`"));
        let f: Vec<&str> = line.split(' ').collect();
        let [code, hexd, _size, first_epoch, first_ns] = f[..] else {
            return Err(bad());
        };
        let kind = Kind::from_code(code).ok_or_else(bad)?;
        let d = digest("condemned object", hexd)?;
        let fe: u64 = first_epoch.parse().map_err(|_| bad())?;
        let fns: i64 = first_ns.parse().map_err(|_| bad())?;
        out.insert((kind, d), (fe, fns));
    }
    if out.len() as u64 != h.count || h.epoch != epoch {
        return Err(Error::corrupt(
            "condemned list",
            &key,
            "count or epoch differs from its header",
        ));
    }
    Ok(out)
}

/// What listing the store found: the objects the mark did not reach, how
/// many were listed, and the listed bytes of the reached ones by category.
pub(super) struct Listing {
    pub(super) condemned: Vec<Condemned>,
    pub(super) listed: u64,
    pub(super) reachable: BTreeMap<String, Tally>,
}

/// Every stored object that is not marked.
pub(super) fn unreachable(
    store: &Store,
    marks: &Marks,
    prev: &FirstCondemned,
    epoch: u64,
    now: i64,
) -> Result<Listing> {
    let storage = store.storage();
    let mut dirs = vec![(
        Kind::Manifest,
        keys::MANIFESTS.to_string(),
        keys::MANIFEST_SUFFIX,
    )];
    for (kind, top, ext) in [
        (Kind::Segment, keys::SEGMENTS, keys::SEGMENT_SUFFIX),
        (Kind::Pack, keys::PACKS, keys::PACK_SUFFIX),
        (Kind::Blob, keys::BLOBS, ""),
        (Kind::ChunkList, keys::CHUNK_LISTS, ""),
        (Kind::Chunk, keys::CHUNKS, ""),
    ] {
        // Objects live in two-hex-digit prefix directories; anything else
        // there is not ours to judge.
        for sub in storage.list(top)? {
            if sub.len() == 2 && sub.bytes().all(|b| b.is_ascii_hexdigit()) {
                dirs.push((kind, format!("{top}/{sub}"), ext));
            }
        }
    }
    let mut out = Vec::new();
    let mut listed = 0;
    let mut reachable: BTreeMap<String, Tally> = BTreeMap::new();
    for (kind, dir, ext) in dirs {
        for (name, size) in storage.list_sizes(&dir)? {
            let Some(d) = name
                .strip_suffix(ext)
                .and_then(|h| digest("object", h).ok())
            else {
                continue;
            };
            listed += 1;
            if marks.contains(kind, &d) {
                reachable
                    .entry(kind.category().to_string())
                    .or_default()
                    .add(size);
                continue;
            }
            let (first_epoch, first_ns) = prev.get(&(kind, d)).copied().unwrap_or((epoch, now));
            out.push(Condemned {
                kind,
                digest: d,
                size,
                first_epoch,
                first_ns,
            });
        }
    }
    Ok(Listing {
        condemned: out,
        listed,
        reachable,
    })
}

pub(super) fn write_condemned(
    store: &Store,
    epoch: u64,
    list: &[Condemned],
    now: i64,
) -> Result<()> {
    let header = CondemnedHeader {
        tag: CONDEMNED_TAG.into(),
        version: CONDEMNED_VERSION,
        epoch,
        written_ns: now,
        count: list.len() as u64,
    };
    let mut text = serde_json::to_string(&header)
        .map_err(|e| Error::internal_from("encode the condemned list header", e))?;
    text.push('\n');
    for c in list {
        text.push_str(&c.line());
    }
    create_epoch_file(store, &keys::epoch(epoch, "condemned"), text.as_bytes())
}

fn create_epoch_file(store: &Store, key: &str, bytes: &[u8]) -> Result<()> {
    match store.storage().put_if_absent(key, bytes)? {
        PutOutcome::Created => Ok(()),
        PutOutcome::AlreadyExists => Err(Error::Conflict(format!(
            "another sweep wrote this epoch first: key=`{key}`"
        ))),
    }
}

/// Write the report, forget old epochs.
pub(super) fn finish(store: &Store, epoch: u64, known: &[u64], report: &SweepReport) -> Result<()> {
    let bytes = serde_json::to_vec_pretty(report)
        .map_err(|e| Error::internal_from("encode the sweep report", e))?;
    create_epoch_file(store, &keys::epoch(epoch, "report.json"), &bytes)?;
    store.failpoints().hit(Step::Swept)?;
    for &old in known
        .iter()
        .filter(|&&e| e < epoch.saturating_sub(KEEP_EPOCHS))
    {
        store.storage().delete(&keys::epoch(old, "condemned"))?;
        store.storage().delete(&keys::epoch(old, "report.json"))?;
    }
    Ok(())
}
