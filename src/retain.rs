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

use crate::error::{Error, Result};
use crate::format::parse_versioned;
use crate::format::record::{IndexRecord, State};
use crate::index::GenIndex;
use crate::storage::CasOutcome;
use crate::store::{check_set_name, Store};
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;

/// 1: initial layout.
pub const RETENTION_VERSION: u32 = 1;
pub const RETENTION_TAG: &str = "strata-retention";
const MAX_RETENTION_BYTES: u64 = 64 << 10;
const CAS_RETRIES: usize = 16;

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

fn key(set: &str) -> String {
    format!("sets/{set}/retention.json")
}

/// The stored policy of `set`, `None` when it keeps everything.
pub fn load(store: &Store, set: &str) -> Result<Option<Policy>> {
    Ok(load_raw(store, set)?.map(|(r, _)| r.policy))
}

fn load_raw(store: &Store, set: &str) -> Result<Option<(PolicyRecord, Vec<u8>)>> {
    let key = key(set);
    let bytes = match store.storage().get(&key, MAX_RETENTION_BYTES) {
        Ok(b) => b,
        Err(e) if e.is_not_found() => return Ok(None),
        Err(e) => return Err(e),
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
    if policy.keep_last == Some(0) {
        return Err(Error::Invalid(
            "--keep-last must be at least 1 (latest is always kept)".into(),
        ));
    }
    for _ in 0..CAS_RETRIES {
        let current = load_raw(store, set)?;
        let next = PolicyRecord {
            tag: RETENTION_TAG.into(),
            version: RETENTION_VERSION,
            set: set.to_string(),
            policy,
            counter: current.as_ref().map_or(1, |(r, _)| r.counter + 1),
            nonce: crate::token::new_token(),
        };
        let body = serde_json::to_vec_pretty(&next).map_err(|e| Error::Internal(e.to_string()))?;
        let expected = current.as_ref().map(|(_, b)| b.as_slice());
        if store.storage().cas(&key(set), expected, &body)? == CasOutcome::Swapped {
            return Ok(());
        }
    }
    Err(Error::Conflict(format!(
        "retention policy kept changing: set=`{set}`"
    )))
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
}

/// The decision for every COMMITTED generation of a set.
#[derive(Debug, Clone, Default, Serialize)]
pub struct Plan {
    pub set: String,
    pub policy: Option<Policy>,
    pub keep: BTreeMap<u64, Vec<Keep>>,
    pub retire: Vec<u64>,
}

/// Decide what `set` keeps at `now_ns` (nothing is written).
pub fn plan(store: &Store, set: &str, now_ns: i64) -> Result<Plan> {
    let policy = load(store, set)?;
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
        if let Some(why) = policy_keeps(policy, &committed, g, r, now_ns) {
            keep.entry(g).or_default().push(why);
        }
    }
    keep.retain(|g, _| committed.contains_key(g));
    let retire = committed
        .keys()
        .copied()
        .filter(|g| !keep.contains_key(g))
        .collect();
    Ok(Plan {
        set: set.to_string(),
        policy,
        keep,
        retire,
    })
}

fn policy_keeps(
    policy: Option<Policy>,
    committed: &BTreeMap<u64, IndexRecord>,
    g: u64,
    r: &IndexRecord,
    now_ns: i64,
) -> Option<Keep> {
    let Some(p) = policy else {
        return Some(Keep::NoPolicy);
    };
    if let Some(n) = p.keep_last {
        let newer = committed.range(g + 1..).count() as u64;
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

/// Retire what `plan` decided; returns the generations actually retired
/// (one that changed meanwhile — re-tagged, materialized, now latest — is
/// skipped and decided again next time).
pub fn apply(store: &Store, plan: &Plan, owner: &str) -> Result<Vec<u64>> {
    let index = GenIndex::new(store, &plan.set);
    let mut retired = Vec::new();
    for &g in &plan.retire {
        let current = index.load(g)?;
        if current.state != State::Committed || still_tagged(store, &plan.set, g)? {
            continue;
        }
        match index.retire(&current, owner) {
            Ok(_) => retired.push(g),
            Err(e) if e.kind() == crate::error::ErrorKind::Conflict => {}
            Err(e) => return Err(e),
        }
    }
    Ok(retired)
}

/// A tag created after planning keeps its generation.
fn still_tagged(store: &Store, set: &str, g: u64) -> Result<bool> {
    Ok(crate::tag::list(store, set)?
        .iter()
        .any(|t| t.generation == g))
}
