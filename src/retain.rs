//! Retention: which generations of a set are kept, and retiring the rest.
//!
//! The policy lives in `sets/<set>/retention.json`, replaced only by pointer
//! CAS (a counter and a nonce in the body, so A → B → A never matches). A set
//! without a policy keeps everything. Kept are: latest (always), tagged
//! generations, the last N, and those committed within a duration. Every
//! other COMMITTED generation is RETIRED by creating its next index record
//! exclusively ([`GenIndex::retire`]); nothing is deleted here. Retired
//! generations are no longer listed or pinnable; pins taken earlier keep
//! what they read until released (the sweep marks held pins).

use crate::cas::pointer::{self, Counted};
use crate::cas::versioned;
use crate::error::{Error, Result};
use crate::format::parse_versioned;
use crate::format::record::{IndexRecord, State};
use crate::index::GenIndex;
use crate::storage::fence;
use crate::store::{check_set_name, keys, Store};
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::ops::Bound::{Excluded, Unbounded};

/// 1: initial layout.
pub const RETENTION_VERSION: u32 = 1;
pub const RETENTION_TAG: &str = "strata-retention";
const MAX_RETENTION_BYTES: u64 = 64 << 10;

/// What a set keeps besides latest and tagged generations.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Policy {
    /// Keep the newest N committed generations.
    pub keep_last: Option<u64>,
    /// Keep generations committed less than this many seconds ago.
    pub keep_within_s: Option<u64>,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
struct PolicyRecord {
    #[serde(rename = "type")]
    tag: String,
    version: u32,
    set: String,
    #[serde(flatten)]
    policy: Policy,
    counter: u64,
    nonce: String,
}

/// The stored policy of `set`, `None` when it keeps everything.
pub fn load(store: &Store, set: &str) -> Result<Option<Policy>> {
    Ok(load_raw(store, set)?.map(|(r, _)| r.policy))
}

fn load_raw(store: &Store, set: &str) -> Result<Option<(PolicyRecord, Vec<u8>)>> {
    let key = keys::retention(set);
    let Some(bytes) = versioned::try_get(store, &key, MAX_RETENTION_BYTES)? else {
        return Ok(None);
    };
    let r: PolicyRecord = parse_versioned(
        "retention policy",
        &key,
        RETENTION_TAG,
        RETENTION_VERSION,
        &bytes,
    )?;
    if r.set != set {
        return Err(Error::corrupt(
            "retention policy",
            &key,
            "set differs from its name",
        ));
    }
    Ok(Some((r, bytes)))
}

/// Store `policy` as the retention of `set` (replacing any earlier one).
pub fn set_policy(store: &Store, set: &str, policy: Policy) -> Result<()> {
    check_set_name(set)?;
    if !store.sets()?.iter().any(|s| s == set) {
        return Err(Error::NotFound {
            what: "set",
            name: set.to_string(),
        });
    }
    if policy.keep_last == Some(0) {
        return Err(Error::Invalid(
            "--keep-last must be at least 1 (latest is always kept)".into(),
        ));
    }
    let key = keys::retention(set);
    let read = || load_raw(store, set);
    pointer::update(store, &key, "retention policy", read, |_, stamp| {
        let next = PolicyRecord {
            tag: RETENTION_TAG.into(),
            version: RETENTION_VERSION,
            set: set.to_string(),
            policy,
            counter: stamp.counter,
            nonce: stamp.nonce,
        };
        let body = serde_json::to_vec_pretty(&next)
            .map_err(|e| Error::internal_from("encode the retention policy", e))?;
        Ok(Some(body))
    })?;
    Ok(())
}

impl Counted for PolicyRecord {
    fn counter(&self) -> u64 {
        self.counter
    }
}

/// Why a generation is kept.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Keep {
    Latest,
    Tagged(String),
    LastN,
    Within,
    NoPolicy,
    /// A new representation is being published (decided again next time).
    Materializing,
}

/// The decision for every COMMITTED generation of a set.
#[derive(Debug, Clone, Default, Serialize)]
pub struct Plan {
    pub set: String,
    pub policy: Option<Policy>,
    pub keep: BTreeMap<u64, Vec<Keep>>,
    pub retire: Vec<u64>,
    /// The record each retirement was decided on.
    #[serde(skip)]
    decided: BTreeMap<u64, IndexRecord>,
}

/// Decide what `set` keeps at `now_ns` under its stored policy (nothing is written).
pub fn plan(store: &Store, set: &str, now_ns: i64) -> Result<Plan> {
    plan_with(store, set, load(store, set)?, now_ns)
}

/// Decide what `set` would keep under `policy` (`None`: keep everything).
pub fn plan_with(store: &Store, set: &str, policy: Option<Policy>, now_ns: i64) -> Result<Plan> {
    let committed: BTreeMap<u64, IndexRecord> = GenIndex::new(store, set)
        .all()?
        .into_iter()
        .filter(|(_, r)| r.state == State::Committed)
        .collect();
    let mut keep: BTreeMap<u64, Vec<Keep>> = BTreeMap::new();
    let latest = GenIndex::new(store, set).latest()?.map(|r| r.generation);
    if let Some(l) = latest {
        keep.entry(l).or_default().push(Keep::Latest);
    }
    for t in crate::tag::list(store, set)? {
        keep.entry(t.generation)
            .or_default()
            .push(Keep::Tagged(t.name));
    }
    for (&g, r) in &committed {
        if r.representations.iter().any(|x| x.state == State::Prepared) {
            keep.entry(g).or_default().push(Keep::Materializing);
        }
        if let Some(why) = policy_keeps(policy, &committed, g, r, now_ns) {
            keep.entry(g).or_default().push(why);
        }
    }
    keep.retain(|g, _| committed.contains_key(g));
    let decided: BTreeMap<u64, IndexRecord> = committed
        .into_iter()
        .filter(|(g, _)| !keep.contains_key(g))
        .collect();
    Ok(Plan {
        set: set.to_string(),
        policy,
        keep,
        retire: decided.keys().copied().collect(),
        decided,
    })
}

fn policy_keeps(
    policy: Option<Policy>,
    committed: &BTreeMap<u64, IndexRecord>,
    g: u64,
    r: &IndexRecord,
    now_ns: i64,
) -> Option<Keep> {
    let Some(p) = policy.filter(|p| p.keep_last.is_some() || p.keep_within_s.is_some()) else {
        return Some(Keep::NoPolicy);
    };
    if let Some(n) = p.keep_last {
        let newer = committed.range((Excluded(g), Unbounded)).count() as u64;
        if newer < n {
            return Some(Keep::LastN);
        }
    }
    if let Some(s) = p.keep_within_s {
        let at = r.committed_ns.unwrap_or(r.written_ns);
        let age_s = now_ns.saturating_sub(at).max(0) as u64 / 1_000_000_000;
        if age_s < s {
            return Some(Keep::Within);
        }
    }
    None
}

/// Retire what `plan` decided; returns the generations actually retired.
/// One that changed since (a new record, e.g. a materialization in flight),
/// got a tag, or became latest is skipped and decided again next time.
pub fn apply(store: &Store, plan: &Plan, owner: &str) -> Result<Vec<u64>> {
    if plan.decided.is_empty() {
        return Ok(Vec::new());
    }
    let _lock = crate::tag::protection_lock(store, &plan.set, owner)?;
    let tagged: Vec<u64> = crate::tag::list(store, &plan.set)?
        .iter()
        .map(|t| t.generation)
        .collect();
    let index = GenIndex::new(store, &plan.set);
    let mut retired = Vec::new();
    for (g, decided) in &plan.decided {
        if tagged.contains(g) {
            continue;
        }
        let _fence = fence::enter(&[&*_lock])?;
        match index.retire(decided, owner) {
            Ok(_) => retired.push(*g),
            Err(e) if e.kind() == crate::error::ErrorKind::Conflict => {}
            Err(e) => return Err(e),
        }
    }
    Ok(retired)
}
