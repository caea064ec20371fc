//! Lineage: the bindings a generation's manifest makes to its parent and
//! base, checked against the index (`binding_problem`, used by `verify`),
//! and the budgeted ancestry walk down the parent bindings (`walk`, behind
//! `strata lineage`), which ends with a typed [`LineageEnd`].
//!
//! A parent binding names the manifest the child was published against: the
//! representation readers selected then. A fold later adds a base with the
//! same identity and retires that representation in the parent's index
//! record, so the binding holds while the parent's newest record lists the
//! named manifest among its representations (committed or retired), whether
//! or not a sweep has reclaimed the retired manifest's bytes.

use crate::compose::load_manifest;
use crate::error::{Error, Result};
use crate::format::manifest::{Manifest, ParentBinding, RepKind};
use crate::format::record::{IndexRecord, State};
use crate::index::GenIndex;
use crate::store::Store;
use serde::Serialize;
use std::collections::HashSet;
use std::fmt;

/// Generations a walk examines unless told otherwise.
pub const DEFAULT_BUDGET: u64 = 1000;
/// Largest budget a walk accepts (its visited list is kept in memory).
pub const MAX_BUDGET: u64 = 100_000;

/// What is wrong with a binding (which one, and how).
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(tag = "problem", rename_all = "kebab-case")]
pub enum Broken {
    /// The manifest does not match the index record selecting it.
    ManifestRecord,
    /// A generation after the first names no parent.
    NoParent,
    /// Generation 1 names a parent.
    ParentOfFirst { named: u64 },
    /// The parent named is not the generation right before.
    ParentGeneration { named: u64 },
    /// The index record's parent differs from the manifest's.
    RecordParent {
        record: Option<u64>,
        manifest: Option<u64>,
    },
    /// The parent generation has no committed or retired record.
    ParentUnknown { named: u64 },
    /// The parent manifest named is none of the parent's representations.
    ParentManifest { named: String },
    /// The base manifest belongs to another set.
    BaseSet { found: String },
    /// The base manifest's generation, identity or kind differ from the
    /// binding.
    BaseManifest { named: String },
}

impl fmt::Display for Broken {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Broken::ManifestRecord => write!(f, "manifest does not match its index record"),
            Broken::NoParent => write!(f, "parent binding missing"),
            Broken::ParentOfFirst { named } => {
                write!(f, "generation 1 names a parent: named={named}")
            }
            Broken::ParentGeneration { named } => {
                write!(f, "parent binding names a generation other than the previous one: named={named}")
            }
            Broken::RecordParent { record, manifest } => write!(
                f,
                "index record and manifest name different parents: record={record:?} manifest={manifest:?}"
            ),
            Broken::ParentUnknown { named } => {
                write!(f, "parent generation has no committed record: named={named}")
            }
            Broken::ParentManifest { named } => write!(
                f,
                "parent manifest digest is none of the parent's representations: named={named}"
            ),
            Broken::BaseSet { found } => {
                write!(f, "base manifest belongs to another set: found=`{found}`")
            }
            Broken::BaseManifest { named } => write!(
                f,
                "base manifest differs from the binding (generation, identity or kind): named={named}"
            ),
        }
    }
}

/// How a walk ended.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(tag = "result", rename_all = "kebab-case")]
pub enum LineageEnd {
    /// Every binding held down to generation 1.
    Complete,
    /// The parent generation is retired (its manifests may be gone).
    ParentRetired { generation: u64 },
    /// A binding of `generation` does not match.
    BrokenBinding { generation: u64, broken: Broken },
    /// `budget` generations were examined without reaching an end;
    /// `generation` is the next one the walk would have examined.
    BudgetExceeded { budget: u64, generation: u64 },
}

/// One generation the walk examined (its bindings held).
#[derive(Debug, Clone, Serialize)]
pub struct LineageNode {
    pub generation: u64,
    pub representation: RepKind,
    pub manifest: String,
    pub parent: Option<u64>,
    pub parent_manifest: Option<String>,
    pub base: Option<u64>,
}

/// The result of an ancestry walk.
#[derive(Debug, Clone, Serialize)]
pub struct Lineage {
    pub set: String,
    pub from: u64,
    pub budget: u64,
    pub visited: Vec<LineageNode>,
    pub end: LineageEnd,
}

/// The outcome of checking one generation's parent binding.
enum ParentCheck {
    /// Generation 1: no parent, none named.
    First,
    /// The parent is retired: nothing more to check.
    Retired(u64),
    Broken(Broken),
    /// The binding holds; the parent's newest record.
    Bound(IndexRecord),
}

/// The manifest that `record` selects for reading, with its name.
pub fn selected_manifest(store: &Store, record: &IndexRecord) -> Result<(String, Manifest)> {
    if record.state != State::Committed {
        return Err(Error::Invalid(format!(
            "generation is not committed: set=`{}` generation={} state={}",
            record.set,
            record.generation,
            record.state.label()
        )));
    }
    let rep = record.read_rep().ok_or_else(|| {
        Error::corrupt(
            "index record",
            format!("{}@{}", record.set, record.generation),
            "no committed representation",
        )
    })?;
    Ok((rep.manifest.clone(), load_manifest(store, &rep.manifest)?))
}

/// The first problem with the bindings of `manifest`, the manifest that
/// `record` (a retained generation's newest record) selects: manifest ↔
/// record, the parent binding, and (for a delta) the base manifest's set.
pub fn binding_problem(
    store: &Store,
    record: &IndexRecord,
    manifest: &Manifest,
) -> Result<Option<Broken>> {
    if let Some(b) = record_problem(record, manifest) {
        return Ok(Some(b));
    }
    if let ParentCheck::Broken(b) = check_parent(store, record, manifest)? {
        return Ok(Some(b));
    }
    base_problem(store, manifest)
}

fn record_problem(record: &IndexRecord, manifest: &Manifest) -> Option<Broken> {
    let same = manifest.set == record.set
        && manifest.generation == record.generation
        && manifest.identity == record.identity;
    (!same).then_some(Broken::ManifestRecord)
}

/// The parent generation named by the manifest (already checked to be the
/// previous one) against the index record's.
fn record_parent_problem(record: &IndexRecord, named: Option<u64>) -> Option<Broken> {
    (named != record.parent).then_some(Broken::RecordParent {
        record: record.parent,
        manifest: named,
    })
}

fn check_parent(store: &Store, record: &IndexRecord, manifest: &Manifest) -> Result<ParentCheck> {
    let binding = match named_parent(record, manifest) {
        Ok(Some(b)) => b,
        Ok(None) => return Ok(ParentCheck::First),
        Err(b) => return Ok(ParentCheck::Broken(b)),
    };
    let parent = GenIndex::new(store, &record.set).newest(binding.generation)?;
    Ok(match parent {
        Some(p) if p.state == State::Retired => ParentCheck::Retired(binding.generation),
        Some(p) if p.state == State::Committed => lists(p, binding),
        _ => ParentCheck::Broken(Broken::ParentUnknown {
            named: binding.generation,
        }),
    })
}

/// The parent binding, provided it names the previous generation as the
/// index record does (`None` for generation 1, which names none).
fn named_parent<'m>(
    record: &IndexRecord,
    manifest: &'m Manifest,
) -> std::result::Result<Option<&'m ParentBinding>, Broken> {
    let g = record.generation;
    let named = manifest.parent.as_ref().map(|p| p.generation);
    let broken = match (&manifest.parent, g) {
        (Some(p), 1) => Broken::ParentOfFirst {
            named: p.generation,
        },
        (Some(p), _) if p.generation != g - 1 => Broken::ParentGeneration {
            named: p.generation,
        },
        (None, g) if g > 1 => Broken::NoParent,
        (p, _) => match record_parent_problem(record, named) {
            Some(b) => b,
            None => return Ok(p.as_ref()),
        },
    };
    Err(broken)
}

/// Bound when the parent's record lists the named manifest among its
/// committed or retired representations.
fn lists(parent: IndexRecord, binding: &ParentBinding) -> ParentCheck {
    let listed = parent
        .representations
        .iter()
        .any(|r| r.state != State::Prepared && r.manifest == binding.manifest);
    match listed {
        true => ParentCheck::Bound(parent),
        false => ParentCheck::Broken(Broken::ParentManifest {
            named: binding.manifest.clone(),
        }),
    }
}

fn base_problem(store: &Store, manifest: &Manifest) -> Result<Option<Broken>> {
    let Some(b) = &manifest.base else {
        return Ok(None);
    };
    let base = load_manifest(store, &b.manifest)?;
    if base.set != manifest.set {
        return Ok(Some(Broken::BaseSet { found: base.set }));
    }
    let same = base.generation == b.generation
        && base.identity == b.identity
        && base.representation == RepKind::Base;
    Ok((!same).then(|| Broken::BaseManifest {
        named: b.manifest.clone(),
    }))
}

/// Walk the ancestry of `set` from generation `from` (latest when `None`)
/// down the parent bindings, examining at most `budget` generations.
pub fn walk(store: &Store, set: &str, from: Option<u64>, budget: u64) -> Result<Lineage> {
    if budget > MAX_BUDGET {
        return Err(Error::Invalid(format!(
            "lineage budget over the limit: budget={budget} limit={MAX_BUDGET}"
        )));
    }
    let start = start_record(store, set, from)?;
    let mut lineage = Lineage {
        set: set.to_string(),
        from: start.generation,
        budget,
        visited: Vec::new(),
        end: LineageEnd::Complete,
    };
    let mut bases_checked = HashSet::new();
    let mut record = start;
    loop {
        if lineage.visited.len() as u64 == budget {
            let generation = record.generation;
            lineage.end = LineageEnd::BudgetExceeded { budget, generation };
            return Ok(lineage);
        }
        match step(store, &record, &mut lineage, &mut bases_checked)? {
            Step::Next(parent) => record = parent,
            Step::End(end) => {
                lineage.end = end;
                return Ok(lineage);
            }
        }
    }
}

enum Step {
    Next(IndexRecord),
    End(LineageEnd),
}

/// Examine one generation: its manifest, its bindings, then its parent.
fn step(
    store: &Store,
    record: &IndexRecord,
    lineage: &mut Lineage,
    bases_checked: &mut HashSet<String>,
) -> Result<Step> {
    let g = record.generation;
    let broken = |b| {
        Ok(Step::End(LineageEnd::BrokenBinding {
            generation: g,
            broken: b,
        }))
    };
    let (name, manifest) = match selected_manifest(store, record) {
        Err(e) if e.is_not_found() && g != lineage.from && retired_now(store, record)? => {
            return Ok(Step::End(LineageEnd::ParentRetired { generation: g }));
        }
        other => other?,
    };
    if let Some(b) = record_problem(record, &manifest) {
        return broken(b);
    }
    let base_named = manifest.base.as_ref().map(|b| b.manifest.clone());
    if let Some(base) = base_named.filter(|b| !bases_checked.contains(b)) {
        if let Some(b) = base_problem(store, &manifest)? {
            return broken(b);
        }
        bases_checked.insert(base);
    }
    let check = check_parent(store, record, &manifest)?;
    if let ParentCheck::Broken(b) = check {
        return broken(b);
    }
    lineage.visited.push(node(g, name, &manifest));
    Ok(match check {
        ParentCheck::Bound(parent) => Step::Next(parent),
        ParentCheck::Retired(p) => Step::End(LineageEnd::ParentRetired { generation: p }),
        _ => Step::End(LineageEnd::Complete),
    })
}

fn node(generation: u64, manifest_name: String, m: &Manifest) -> LineageNode {
    LineageNode {
        generation,
        representation: m.representation,
        manifest: manifest_name,
        parent: m.parent.as_ref().map(|p| p.generation),
        parent_manifest: m.parent.as_ref().map(|p| p.manifest.clone()),
        base: m.base.as_ref().map(|b| b.generation),
    }
}

/// True when `record`'s generation has been retired since it was read (a
/// retention raced the walk and a sweep took its manifest).
fn retired_now(store: &Store, record: &IndexRecord) -> Result<bool> {
    let now = GenIndex::new(store, &record.set).newest(record.generation)?;
    Ok(now.is_some_and(|r| r.state == State::Retired))
}

/// The committed generation a walk starts from.
fn start_record(store: &Store, set: &str, from: Option<u64>) -> Result<IndexRecord> {
    let index = GenIndex::new(store, set);
    let record = match from {
        Some(g) => index.load(g)?,
        None => index.latest()?.ok_or_else(|| Error::NotFound {
            what: "set with a committed generation",
            name: set.to_string(),
        })?,
    };
    if record.state != State::Committed {
        return Err(Error::Invalid(format!(
            "a lineage walk starts at a committed generation: generation={} state={}",
            record.generation,
            record.state.label()
        )));
    }
    Ok(record)
}
