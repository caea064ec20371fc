//! Residue: what crashed processes leave behind — pins, staging owners with
//! their staging directories and journals, and the store's named leases —
//! probed and given a verdict (held, unheld, missing, invalid).
//!
//! Liveness is decided only by the backend's lease probe (an OS lock
//! locally), never by a PID or a holder string (invariant 4). Unheld pins
//! and unheld staging owners (with their staging and journals) are
//! reclaimed: their names carry a token that is never taken again, so
//! nobody can come back to them. Invalid markers are reported for an
//! operator and never removed. Writer, sweeper and deleting leases are
//! reusable lock files: reported, never removed (unlinking a lock file
//! another process is about to lock would let two holders coexist).

use crate::error::{ErrorKind, Result};
use crate::pin::PinState;
use crate::storage::LeaseState;
use crate::store::{keys, Store};
use serde::{Deserialize, Serialize};

/// The action of residue a sweep removes.
pub const RECLAIM: &str = "reclaim";

/// Liveness verdict of one marker or lease.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Verdict {
    Held,
    Unheld,
    Missing,
    Invalid,
}

/// One probed marker or lease as `strata leases` reports it.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct LeaseInfo {
    /// pin, staging, writer, sweeper or deleting.
    pub kind: String,
    pub key: String,
    pub verdict: Verdict,
    pub holder: String,
    /// What the probe saw besides the verdict (pinned generation, journals).
    pub detail: String,
    /// What a sweep did or would do about it.
    pub action: String,
}

fn verdict(state: LeaseState) -> (Verdict, String) {
    match state {
        LeaseState::Held { holder } => (Verdict::Held, holder),
        LeaseState::Unheld => (Verdict::Unheld, String::new()),
        LeaseState::Missing => (Verdict::Missing, String::new()),
    }
}

/// Every pin, staging owner and orphaned journal with its verdict: what a
/// sweep reclaims or reports.
pub fn scan(store: &Store) -> Result<Vec<LeaseInfo>> {
    settle(store)?;
    let mut out = pins(store)?;
    out.extend(staging(store)?);
    out.extend(orphan_journals(store)?);
    Ok(out)
}

/// Where lease liveness is decided by observation (remote stores), watch
/// every pin and staging owner once, for up to a lease ttl, so that the
/// verdicts that follow are settled rather than "not observed long enough".
fn settle(store: &Store) -> Result<()> {
    let storage = store.storage();
    if storage.lease_ttl().is_none() {
        return Ok(());
    }
    let mut leases = Vec::new();
    for set in storage.list(keys::PINS)? {
        for name in storage.list(&keys::pin_dir(&set))? {
            leases.push(format!("{}/{name}", keys::pin_dir(&set)));
        }
    }
    for name in storage.list(keys::STAGING)? {
        if name.ends_with(".owner") {
            leases.push(format!("{}/{name}", keys::STAGING));
        }
    }
    storage.settle_leases(&leases)
}

/// [`scan`] plus the store's reusable lock files (`strata leases`).
pub fn scan_all(store: &Store) -> Result<Vec<LeaseInfo>> {
    let mut out = scan(store)?;
    out.extend(named(store)?);
    Ok(out)
}

/// Journals whose staging owner file is gone (a crash between removals) and
/// that no commit may resume: verdict missing, reclaimed.
fn orphan_journals(store: &Store) -> Result<Vec<LeaseInfo>> {
    let storage = store.storage();
    let mut out = Vec::new();
    for set in storage.list(keys::JOURNALS)? {
        for name in storage.list(&keys::journal_dir(&set))? {
            let Some(token) = name.strip_suffix(".journal") else {
                continue;
            };
            let key = format!("{}/{name}", keys::journal_dir(&set));
            let missing = storage.probe_lease(&keys::staging_owner(token))? == LeaseState::Missing;
            if missing && !crate::resumable::is_resumable(store, &key) {
                out.push(LeaseInfo {
                    kind: "journal".into(),
                    key,
                    verdict: Verdict::Missing,
                    holder: String::new(),
                    detail: "its staging owner is gone".into(),
                    action: RECLAIM.into(),
                });
            }
        }
    }
    Ok(out)
}

fn pins(store: &Store) -> Result<Vec<LeaseInfo>> {
    Ok(crate::pin::list(store)?
        .into_iter()
        .map(|p| {
            let (verdict, action) = match p.state {
                PinState::Held => (Verdict::Held, "kept"),
                PinState::Unheld => (Verdict::Unheld, RECLAIM),
                PinState::Invalid => (Verdict::Invalid, "kept for an operator"),
            };
            LeaseInfo {
                kind: "pin".into(),
                detail: match verdict {
                    Verdict::Invalid if p.held => "body does not parse; lock held".into(),
                    Verdict::Invalid => "body does not parse; lock unheld".into(),
                    _ => format!("{}@{} {}", p.set, p.generation, p.representation),
                },
                key: p.key,
                verdict,
                holder: p.holder,
                action: action.into(),
            }
        })
        .collect())
}

fn staging(store: &Store) -> Result<Vec<LeaseInfo>> {
    let storage = store.storage();
    let mut out = Vec::new();
    for name in storage.list(keys::STAGING)? {
        let Some(token) = name.strip_suffix(".owner") else {
            continue;
        };
        let key = keys::staging_owner(token);
        let state = match probe_owner(store, token) {
            Ok(state) => state,
            Err(e) if matches!(e.kind(), ErrorKind::Corrupt | ErrorKind::InvalidInput) => {
                out.push(LeaseInfo {
                    kind: "staging".into(),
                    key,
                    verdict: Verdict::Invalid,
                    holder: String::new(),
                    detail: crate::cli_chain(&e),
                    action: "kept for an operator".into(),
                });
                continue;
            }
            Err(e) => return Err(e),
        };
        let (verdict, holder) = verdict(state);
        if verdict == Verdict::Missing {
            continue;
        }
        let journals = journals_of(store, token)?;
        out.push(LeaseInfo {
            kind: "staging".into(),
            key,
            verdict,
            holder,
            detail: format!("{} journal(s)", journals.len()),
            action: if verdict == Verdict::Held {
                "kept".into()
            } else {
                RECLAIM.into()
            },
        });
    }
    Ok(out)
}

/// Probe the owner lease of staging `token`; a name no attempt would take
/// is refused before anything is probed or removed under it.
fn probe_owner(store: &Store, token: &str) -> Result<LeaseState> {
    crate::staging::check_token(token)?;
    store.storage().probe_lease(&keys::staging_owner(token))
}

/// Journal keys written under `token`, in any set, but those a commit may
/// resume (`crate::resumable`).
fn journals_of(store: &Store, token: &str) -> Result<Vec<String>> {
    let mut out = Vec::new();
    for set in store.storage().list(keys::JOURNALS)? {
        let key = keys::journal(&set, token);
        if store.storage().size(&key)?.is_some() && !crate::resumable::is_resumable(store, &key) {
            out.push(key);
        }
    }
    Ok(out)
}

fn named(store: &Store) -> Result<Vec<LeaseInfo>> {
    let mut keys_: Vec<(&'static str, String)> = store
        .sets()?
        .into_iter()
        .flat_map(|s| {
            [
                ("writer", keys::writer_lease(&s)),
                ("retention", keys::retention_lock(&s)),
            ]
        })
        .collect();
    keys_.push(("sweeper", keys::SWEEPER_LEASE.to_string()));
    keys_.push(("deleting", keys::DELETING_LEASE.to_string()));
    let mut out = Vec::new();
    for (kind, key) in keys_ {
        let (verdict, holder) = verdict(store.storage().probe_lease(&key)?);
        if verdict == Verdict::Missing {
            continue;
        }
        out.push(LeaseInfo {
            kind: kind.into(),
            key,
            verdict,
            holder,
            detail: String::new(),
            action: "kept (reusable lock)".into(),
        });
    }
    Ok(out)
}

/// Reclaim the unheld pins and staging owners of `items` (re-probing each
/// right before removing it); returns what was reclaimed.
pub fn reclaim(store: &Store, items: &[LeaseInfo]) -> Result<Vec<LeaseInfo>> {
    let storage = store.storage();
    let mut done = Vec::new();
    for item in items.iter().filter(|i| i.action == RECLAIM) {
        if item.kind == "journal" {
            storage.delete(&item.key)?;
            done.push(item.clone());
            continue;
        }
        if storage.probe_lease(&item.key)? != LeaseState::Unheld {
            continue;
        }
        if item.kind == "staging" {
            let token = keys::staging_token(&item.key).unwrap_or_default();
            for j in journals_of(store, token)? {
                storage.delete(&j)?;
            }
            crate::staging::check_token(token)?;
            storage.delete_dir(&keys::staging_dir(token))?;
        }
        storage.delete(&item.key)?;
        done.push(item.clone());
    }
    Ok(done)
}

/// Holder of some live writer (a held staging owner: a commit or a
/// materialization attempt), if any.
///
/// On a store whose leases are decided by observation, an owner that only
/// *looks* dead still counts: until a reclaim removes its lease object it
/// could renew after a pause and publish, so only reclaimed owners are gone.
pub fn live_writer(store: &Store) -> Result<Option<String>> {
    let observed = store.storage().lease_ttl().is_some();
    for name in store.storage().list(keys::STAGING)? {
        let Some(token) = name.strip_suffix(".owner") else {
            continue;
        };
        let state = match probe_owner(store, token) {
            Ok(state) => state,
            // Cannot be judged: it might be a live writer.
            Err(e) if matches!(e.kind(), ErrorKind::Corrupt | ErrorKind::InvalidInput) => {
                return Ok(Some(format!(
                    "invalid staging owner {token}: {}",
                    crate::cli_chain(&e)
                )))
            }
            Err(e) => return Err(e),
        };
        match state {
            LeaseState::Held { holder } => return Ok(Some(holder)),
            LeaseState::Unheld if observed => {
                return Ok(Some(format!("unreclaimed owner of staging {token}")))
            }
            _ => {}
        }
    }
    Ok(None)
}
