//! Tags: durable names for generations (`sets/<set>/tags/<name>.json`).
//!
//! A tag is created exclusively and never rewritten in place: moving a tag is
//! `untag` then `tag`, so a reader never sees a half-moved tag. Tagging an
//! existing name with the same generation is a no-op; with another
//! generation it is a conflict. Only a COMMITTED generation can be tagged.
//! Tags are retention roots (a tagged generation is kept by retention).
//!
//! Tagging and retiring both hold the set's protection lock
//! ([`protection_lock`]), so a tag created while retention decides is seen
//! before anything is retired.

use crate::cas::versioned;
use crate::error::{Error, Result};
use crate::format::parse_versioned;
use crate::format::record::State;
use crate::index::GenIndex;
use crate::storage::{fence, Lease, TryLease};
use crate::store::{keys, Store};
use serde::{Deserialize, Serialize};

/// 1: initial layout.
pub const TAG_VERSION: u32 = 1;
pub const TAG_TAG: &str = "strata-tag";
const MAX_TAG_BYTES: u64 = 64 << 10;

/// One tag record.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Tag {
    #[serde(rename = "type")]
    pub tag: String,
    pub version: u32,
    pub set: String,
    pub name: String,
    pub generation: u64,
    pub created_ns: i64,
}

/// Tag names match `[A-Za-z0-9][A-Za-z0-9._-]{0,127}`.
pub fn check_tag_name(name: &str) -> Result<()> {
    let b = name.as_bytes();
    let ok = !b.is_empty()
        && b.len() <= 128
        && b[0].is_ascii_alphanumeric()
        && b.iter()
            .all(|c| c.is_ascii_alphanumeric() || b"._-".contains(c));
    if !ok {
        return Err(Error::Invalid(format!(
            "tag names match [A-Za-z0-9][A-Za-z0-9._-]{{0,127}}: tag=`{name}`"
        )));
    }
    Ok(())
}

/// Tag `generation` (latest when `None`) of `set` as `name`; returns the
/// generation tagged.
pub fn tag(store: &Store, set: &str, name: &str, generation: Option<u64>) -> Result<u64> {
    check_tag_name(name)?;
    let index = GenIndex::new(store, set);
    let record = match generation {
        Some(g) => index.load(g)?,
        None => index.latest()?.ok_or_else(|| Error::NotFound {
            what: "committed generation",
            name: set.to_string(),
        })?,
    };
    // Under the retention lock, re-read: retention cannot retire it meanwhile.
    let _lock = protection_lock(store, set, &format!("tag pid={}", std::process::id()))?;
    let record = index.load(record.generation)?;
    if record.state != State::Committed {
        return Err(Error::Invalid(format!(
            "only a committed generation can be tagged: set=`{set}` gen={} state={:?}",
            record.generation, record.state
        )));
    }
    let t = Tag {
        tag: TAG_TAG.into(),
        version: TAG_VERSION,
        set: set.into(),
        name: name.into(),
        generation: record.generation,
        created_ns: crate::token::now_ns(),
    };
    let bytes = serde_json::to_vec(&t).map_err(|e| Error::internal_from("encode a tag", e))?;
    let created = {
        let _fence = fence::enter(&[&*_lock])?;
        versioned::create_or_existing(store, &keys::tag(set, name), &bytes)?
    };
    if created {
        return Ok(t.generation);
    }
    let existing = load(store, set, name)?;
    if existing.generation != t.generation {
        return Err(Error::Conflict(format!(
            "tag exists on another generation; untag it first: set=`{set}` tag=`{name}` gen={}",
            existing.generation
        )));
    }
    Ok(t.generation)
}

/// Hold the set's protection lock (`holder` names who): tagging and
/// retiring take it.
pub(crate) fn protection_lock(store: &Store, set: &str, holder: &str) -> Result<Box<dyn Lease>> {
    match store
        .storage()
        .lease(&keys::retention_lock(set), holder, true)?
    {
        TryLease::Acquired(l) => Ok(l),
        TryLease::Busy { holder } => Err(Error::Conflict(format!(
            "retention lock busy: set=`{set}` holder=`{holder}`"
        ))),
    }
}

/// Remove tag `name` of `set`.
pub fn untag(store: &Store, set: &str, name: &str) -> Result<()> {
    check_tag_name(name)?;
    load(store, set, name)?;
    store.storage().delete(&keys::tag(set, name))
}

/// One tag by name.
pub fn load(store: &Store, set: &str, name: &str) -> Result<Tag> {
    let key = keys::tag(set, name);
    let bytes = store
        .storage()
        .get(&key, MAX_TAG_BYTES)
        .map_err(|e| match e.is_not_found() {
            true => Error::NotFound {
                what: "tag",
                name: format!("{set}/{name}"),
            },
            false => e,
        })?;
    let t: Tag = parse_versioned("tag", &key, TAG_TAG, TAG_VERSION, &bytes)?;
    if t.set != set || t.name != name {
        return Err(Error::corrupt(
            "tag",
            key,
            "set or name differs from its key",
        ));
    }
    Ok(t)
}

/// The tags of `set`, which must exist (`NotFound` otherwise), by name.
pub fn list_of_set(store: &Store, set: &str) -> Result<Vec<Tag>> {
    crate::store::check_set_name(set)?;
    if !store.sets()?.iter().any(|s| s == set) {
        return Err(Error::NotFound {
            what: "set",
            name: set.to_string(),
        });
    }
    list(store, set)
}

/// Every tag of `set`, by name.
pub fn list(store: &Store, set: &str) -> Result<Vec<Tag>> {
    let names = store.storage().list(&keys::tag_dir(set))?;
    let mut out = Vec::new();
    for file in names {
        let Some(name) = file.strip_suffix(".json") else {
            continue;
        };
        if check_tag_name(name).is_err() {
            continue;
        }
        match load(store, set, name) {
            Ok(t) => out.push(t),
            Err(e) if e.is_not_found() => continue,
            Err(e) => return Err(e),
        }
    }
    Ok(out)
}
