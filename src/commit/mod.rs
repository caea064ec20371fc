//! Commit: observe a directory (or part of it) and publish what changed as
//! the next generation of a set.
//!
//! Owns the commit lifecycle: per-set write lease (an OS lock; a second
//! commit fails fast naming the holder, or waits), residue cleanup of dead
//! attempts, staging named by an owner token, walk → ingest → sealed journal
//! → publish. Every durability step is a [`Step`]; a process killed at any of
//! them leaves the store at its last committed generation (invariant 7).

mod beneath;
mod ingest;
mod large;
mod resume;
mod walk;

use crate::compose::GenView;
use crate::error::{Error, Result};
use crate::failpoint::Step;
use crate::format::journal::{JournalHeader, JournalWriter, SCOPE_IN_HEADER};
use crate::format::manifest::{Coverage, ScopeKind};
use crate::index::GenIndex;
use crate::publish::{publish, ChangeStats, PublishInput, Published};
use crate::row::normalize;
use crate::spill::SortBudget;
use crate::staging::Staging;
use crate::storage::{Lease, TryLease};
use crate::store::{check_set_name, keys, Store};
use crossbeam_channel::bounded;
use ingest::{hash_job, spawn_sink, DedupIndex, SinkMsg, StageDir};
use serde::Serialize;
use std::collections::HashSet;
use std::path::{Path, PathBuf};
use std::sync::atomic::AtomicU64;
use std::sync::{Arc, OnceLock};
use std::time::Instant;
use walk::{Event, Walker};

/// Longest commit message (it is copied into every index record).
pub const MAX_MESSAGE_BYTES: usize = 64 << 10;
/// Hash jobs allowed in flight at once (bounds memory held by workers).
const MAX_IN_FLIGHT: usize = 256;
/// Parent blobs indexed for deduplication at most (about 100 bytes each).
const DEDUP_MAX_ENTRIES: usize = 500_000;

/// Which part of the tree a commit observes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Scope {
    Whole,
    /// Covered paths (each with its whole subtree); sorted, none under another.
    Paths(Vec<Vec<u8>>),
}

impl Scope {
    /// Normalize user paths; `""` anywhere means the whole tree.
    pub fn from_paths(raw: &[Vec<u8>]) -> Result<Scope> {
        let mut paths = raw
            .iter()
            .map(|p| normalize(p))
            .collect::<Result<Vec<_>>>()?;
        if paths.iter().any(|p| p.is_empty()) {
            return Ok(Scope::Whole);
        }
        paths.sort();
        paths.dedup();
        let mut kept: HashSet<Vec<u8>> = HashSet::with_capacity(paths.len());
        let mut out = Vec::with_capacity(paths.len());
        for p in paths {
            let covered = p
                .iter()
                .enumerate()
                .any(|(i, &c)| c == b'/' && kept.contains(&p[..i]));
            if !covered {
                kept.insert(p.clone());
                out.push(p);
            }
        }
        Ok(Scope::Paths(out))
    }
}

#[derive(Debug, Clone)]
pub struct CommitOptions {
    pub set: String,
    pub dir: PathBuf,
    pub message: Option<String>,
    pub scope: Scope,
    pub force_base: bool,
    pub wait: bool,
    pub skip_unreadable: bool,
    /// The scope's paths came from a list (`--paths-from`): the manifest
    /// records their digest, not the paths.
    pub listed: bool,
    pub budget: SortBudget,
    /// Resume from a dead commit's sealed journal when one fits
    /// (`crate::resumable`); `--no-resume` clears it.
    pub resume: bool,
}

impl CommitOptions {
    pub fn new(set: &str, dir: &Path) -> CommitOptions {
        CommitOptions {
            set: set.to_string(),
            dir: dir.to_path_buf(),
            message: None,
            scope: Scope::Whole,
            force_base: false,
            wait: false,
            skip_unreadable: false,
            listed: false,
            budget: SortBudget::default(),
            resume: true,
        }
    }
}

/// Live counters a progress display can poll.
#[derive(Debug, Default)]
pub struct Progress {
    pub walked: AtomicU64,
    pub hashed_files: AtomicU64,
    pub hashed_bytes: AtomicU64,
    pub stored_bytes: AtomicU64,
}

/// What the walk saw besides rows.
#[derive(Debug, Default)]
pub(crate) struct WalkStats {
    pub entries: u64,
    pub unchanged_files: u64,
    /// FIFOs, sockets and device nodes seen.
    pub special: u64,
    /// Files whose content came from a resumed journal without a read.
    pub reused: u64,
    pub problems: Vec<String>,
}

#[derive(Debug, Clone, Serialize)]
pub struct CommitSummary {
    pub set: String,
    pub published: bool,
    pub generation: Option<u64>,
    pub parent: Option<u64>,
    pub representation: Option<String>,
    pub identity: Option<String>,
    #[serde(flatten)]
    pub changes: ChangeStats,
    pub walked: u64,
    pub hashed_files: u64,
    pub hashed_bytes: u64,
    pub new_bytes: u64,
    /// Objects already stored under the name of content this commit wrote
    /// that failed the adoption check and were replaced (docs/FORMAT.md,
    /// "Adopting an existing object").
    pub repaired_objects: u64,
    /// FIFOs, sockets and device nodes the walk saw (stored as rows).
    pub special: u64,
    pub skipped_unreadable: Vec<String>,
    pub warnings: Vec<String>,
    /// The dead commit's journal this one resumed from (its token).
    pub resumed_from: Option<String>,
    /// Files whose content was taken from that journal without a read.
    pub resumed_files: u64,
    /// Why no resumable journal was used, when one existed.
    pub not_resumed: Option<String>,
    /// Time spent walking and ingesting (ends when the journal is sealed).
    pub observe_ms: u64,
    /// Time spent sorting, merging, writing and committing.
    pub publish_ms: u64,
    pub duration_ms: u64,
}

/// Remove staging of attempts whose owner lease is unheld, and the
/// journals of `set` no commit can resume (`crate::resumable::clean`).
pub fn clean_residue(store: &Store, set: &str) -> Result<u64> {
    Ok(crate::staging::reclaim_unheld(store)? + crate::resumable::clean(store, set)?)
}

fn take_writer_lease(store: &Store, set: &str, wait: bool, token: &str) -> Result<Box<dyn Lease>> {
    let holder = format!(
        "commit pid={} token={token} since={}",
        std::process::id(),
        crate::token::now_ns()
    );
    match store
        .storage()
        .lease(&keys::writer_lease(set), &holder, wait)?
    {
        TryLease::Acquired(l) => Ok(l),
        TryLease::Busy { holder } => Err(Error::Busy {
            set: set.to_string(),
            holder,
        }),
    }
}

/// Check the options and resolve the directory (a symlinked `DIR` commits
/// the directory it names; nothing below it is ever followed).
fn validated(opts: &CommitOptions) -> Result<CommitOptions> {
    check_set_name(&opts.set)?;
    opts.budget.check()?;
    let dir = std::fs::canonicalize(&opts.dir).map_err(|e| Error::io("resolve", &opts.dir, e))?;
    if !dir.is_dir() {
        return Err(Error::Invalid(format!(
            "not a directory: dir=`{}`",
            opts.dir.display()
        )));
    }
    let message_len = opts.message.as_ref().map_or(0, |m| m.len());
    if message_len > MAX_MESSAGE_BYTES {
        return Err(Error::TooLarge {
            what: "commit message",
            size: message_len as u64,
            limit: MAX_MESSAGE_BYTES as u64,
        });
    }
    Ok(CommitOptions {
        dir,
        ..opts.clone()
    })
}

/// Commit `opts.dir` as the next generation of `opts.set`.
pub fn commit(
    store: &Store,
    opts: &CommitOptions,
    progress: Arc<Progress>,
) -> Result<CommitSummary> {
    let started = Instant::now();
    let opts = &validated(opts)?;
    let store = &store.counting_repairs();
    let token = crate::token::new_token();
    let writer_lease = take_writer_lease(store, &opts.set, opts.wait, &token)?;
    let parent = match GenIndex::new(store, &opts.set).latest()? {
        Some(r) => Some(GenView::open(
            store,
            &opts.set,
            Some(r.generation),
            "commit",
        )?),
        None => None,
    };
    let generation = parent.as_ref().map_or(0, |p| p.generation()) + 1;
    let header = journal_header(opts, parent.as_ref(), generation, &token);
    let mut summary = empty_summary(opts, parent.as_ref().map(|p| p.generation()));
    let hints = resume_hints(store, opts, &header, &mut summary);
    clean_residue(store, &opts.set)?;
    let holder = format!("commit pid={}", std::process::id());
    let staging = Staging::create(store, &token, &holder)?;
    staging.admission.admit("commit", 0)?;
    let journal_key = keys::journal(&opts.set, &token);
    let journal_path = store
        .storage()
        .local_path(&journal_key)
        .unwrap_or_else(|| staging.dir.join("journal"));
    let attempt = Attempt {
        header,
        hints: hints.as_ref(),
        staging: &staging,
        journal_path: &journal_path,
        token: &token,
        writer: &*writer_lease,
    };
    let result = observe_and_publish(
        store,
        opts,
        parent.as_ref(),
        &attempt,
        &progress,
        &mut summary,
    );
    finish_journals(store, &journal_path, hints.as_ref(), result.is_ok());
    drop(staging);
    result?;
    store.failpoints().hit(Step::Cleaned)?;
    summary.repaired_objects = store.repaired_objects();
    summary.duration_ms = started.elapsed().as_millis() as u64;
    Ok(summary)
}

/// What this attempt's journal header says.
fn journal_header(
    opts: &CommitOptions,
    parent: Option<&GenView>,
    generation: u64,
    token: &str,
) -> JournalHeader {
    JournalHeader {
        set: opts.set.clone(),
        generation,
        parent: parent.map(|p| p.generation()),
        scope: match &opts.scope {
            Scope::Whole => vec![String::new()],
            Scope::Paths(p) => p.iter().take(SCOPE_IN_HEADER).map(hex::encode).collect(),
        },
        scope_count: match &opts.scope {
            Scope::Whole => 1,
            Scope::Paths(p) => p.len() as u64,
        },
        owner: token.to_string(),
        created_ns: crate::token::now_ns(),
    }
}

/// The journal to resume from, if one fits; the summary says which, or
/// why none was used.
fn resume_hints(
    store: &Store,
    opts: &CommitOptions,
    header: &JournalHeader,
    summary: &mut CommitSummary,
) -> Option<resume::Hints> {
    if !opts.resume {
        return None;
    }
    match resume::choose(store, &opts.set, header) {
        Ok(h) => {
            summary.resumed_from = Some(h.token.clone());
            Some(h)
        }
        Err(why) if why.is_empty() => None,
        Err(why) => {
            summary.not_resumed = Some(why);
            None
        }
    }
}

/// After the attempt: its own journal goes unless it failed sealed (then
/// the next commit may resume from it); a journal it resumed from goes once
/// it published (its parent is no longer the latest).
fn finish_journals(store: &Store, journal: &Path, resumed: Option<&resume::Hints>, ok: bool) {
    let sealed = || crate::format::journal::JournalReader::open(journal).is_ok();
    let keep = !ok && store.storage().local_path("").is_some() && sealed();
    if !keep {
        crate::storage::remove_or_warn(journal, "local journal");
    }
    if let (true, Some(h)) = (ok, resumed) {
        if let Err(e) = store.storage().delete(&h.key) {
            tracing::warn!("cannot remove the resumed journal {}: {e}", h.key);
        }
    }
}

/// One commit attempt: its journal, staging and leases.
struct Attempt<'a> {
    header: JournalHeader,
    hints: Option<&'a resume::Hints>,
    staging: &'a Staging,
    journal_path: &'a Path,
    token: &'a str,
    writer: &'a dyn Lease,
}

fn empty_summary(opts: &CommitOptions, parent: Option<u64>) -> CommitSummary {
    CommitSummary {
        set: opts.set.clone(),
        published: false,
        generation: None,
        parent,
        representation: None,
        identity: None,
        changes: ChangeStats::default(),
        walked: 0,
        hashed_files: 0,
        hashed_bytes: 0,
        new_bytes: 0,
        repaired_objects: 0,
        special: 0,
        skipped_unreadable: Vec::new(),
        warnings: Vec::new(),
        resumed_from: None,
        resumed_files: 0,
        not_resumed: None,
        observe_ms: 0,
        publish_ms: 0,
        duration_ms: 0,
    }
}

fn observe_and_publish(
    store: &Store,
    opts: &CommitOptions,
    parent: Option<&GenView>,
    attempt: &Attempt,
    progress: &Arc<Progress>,
    summary: &mut CommitSummary,
) -> Result<()> {
    let (journal_path, staging) = (attempt.journal_path, attempt.staging);
    let generation = attempt.header.generation;
    crate::storage::ensure_local_dir(journal_path.parent().unwrap_or(Path::new(".")))?;
    let started = Instant::now();
    let journal = JournalWriter::create(journal_path, &attempt.header)?;
    let (walk, journal) = observe(store, opts, parent, attempt, journal, progress)?;
    summary.resumed_files = walk.reused;
    record_walk(summary, walk, progress, opts.skip_unreadable)?;
    store.failpoints().hit(Step::BlobsDurable)?;
    let records = journal.count();
    journal.seal()?;
    store.failpoints().hit(Step::JournalSealed)?;
    summary.observe_ms = started.elapsed().as_millis() as u64;
    if records == 0 {
        summary.changes.unchanged = summary.walked;
        return Ok(());
    }
    let coverage = coverage(opts, summary.skipped_unreadable.len() as u64);
    // A whole-tree walk over a parent without metadata caught it up.
    let metadata = parent.is_none_or(|p| p.top().manifest.metadata)
        || (coverage.scope == ScopeKind::Whole && coverage.complete);
    let input = PublishInput {
        store,
        set: &opts.set,
        generation,
        parent,
        force_base: opts.force_base,
        message: opts.message.clone(),
        owner: attempt.token,
        coverage,
        metadata,
        staging: &staging.dir,
        budget: opts.budget,
        leases: &[attempt.writer, staging.owner()],
    };
    let (changes, published) = publish(&input, journal_path)?;
    summary.publish_ms = started.elapsed().as_millis() as u64 - summary.observe_ms;
    summary.changes = changes;
    summary.new_bytes = progress
        .stored_bytes
        .load(std::sync::atomic::Ordering::Relaxed);
    if let Some(p) = published {
        fill_published(summary, p);
    }
    Ok(())
}

/// The observed scope the manifest records.
fn coverage(opts: &CommitOptions, skipped: u64) -> Coverage {
    match &opts.scope {
        Scope::Whole => Coverage::whole(skipped),
        Scope::Paths(p) => Coverage::of_paths(p, opts.listed, skipped),
    }
}

fn fill_published(summary: &mut CommitSummary, p: Published) {
    summary.published = true;
    summary.generation = Some(p.generation);
    summary.representation = Some(p.representation.label().to_string());
    summary.identity = Some(p.identity);
    summary.warnings.extend(p.warnings);
}

fn record_walk(
    summary: &mut CommitSummary,
    walk: WalkStats,
    progress: &Progress,
    skip_unreadable: bool,
) -> Result<()> {
    use std::sync::atomic::Ordering::Relaxed;
    summary.walked = walk.entries;
    summary.hashed_files = progress.hashed_files.load(Relaxed);
    summary.hashed_bytes = progress.hashed_bytes.load(Relaxed);
    summary.new_bytes = progress.stored_bytes.load(Relaxed);
    summary.special = walk.special;
    if walk.problems.is_empty() {
        return Ok(());
    }
    if !skip_unreadable {
        return Err(Error::Unreadable(walk.problems));
    }
    summary.skipped_unreadable = walk.problems;
    Ok(())
}

/// Walk and ingest; returns the walk's stats and the unsealed journal.
fn observe(
    store: &Store,
    opts: &CommitOptions,
    parent: Option<&GenView>,
    attempt: &Attempt,
    journal: JournalWriter,
    progress: &Arc<Progress>,
) -> Result<(WalkStats, JournalWriter)> {
    let (staging, generation) = (attempt.staging, attempt.header.generation);
    let beneath = beneath::Beneath::open(&opts.dir).map_err(|e| Error::io("open", &opts.dir, e))?;
    let beneath = Arc::new(beneath);
    let (tx, sink) = spawn_sink(store, staging, journal, progress.clone())?;
    let pool = rayon::ThreadPoolBuilder::new()
        .thread_name(|i| format!("strata-hash-{i}"))
        .build()
        .map_err(|e| Error::internal_from("start the hash workers", e))?;
    let (slots, freed) = bounded::<()>(MAX_IN_FLIGHT);
    let dedup: OnceLock<DedupIndex> = OnceLock::new();
    let walked = pool.in_place_scope(|scope| -> Result<WalkStats> {
        let mut emit = |ev: Event| -> Result<()> {
            let job = match ev {
                Event::Row(r) => return tx.send(SinkMsg::Journal(r)).map_err(|_| sink_gone()),
                Event::Hash(job) => job,
            };
            if dedup.get().is_none() {
                let _ = dedup.set(build_dedup(parent)?);
            }
            slots.send(()).map_err(|_| sink_gone())?;
            let (tx, freed, dedup) = (tx.clone(), freed.clone(), &dedup);
            let stage = StageDir {
                store,
                dir: &staging.dir,
                admission: &staging.admission,
            };
            scope.spawn(move |_| {
                let dedup = dedup.get().expect("built before the first job");
                let _ = tx.send(hash_job(job, stage, dedup, progress));
                let _ = freed.recv();
            });
            Ok(())
        };
        let mut walker = Walker::new(
            &opts.dir,
            beneath,
            parent,
            generation,
            &mut emit,
            &progress.walked,
        );
        walker.hints = attempt.hints;
        let res = walker.run(&opts.scope);
        let stats = std::mem::take(&mut walker.stats);
        res.map(|()| stats)
    });
    drop(tx);
    let out = sink
        .join()
        .map_err(|_| Error::internal("sink thread panicked"))??;
    let mut stats = walked?;
    stats.problems.extend(out.problems);
    Ok((stats, out.journal))
}

fn sink_gone() -> Error {
    Error::internal("ingest sink stopped early")
}

/// Content index of the parent for deduplication, bounded in entries.
/// Base rows a delta overrides still name blobs the base keeps reachable.
fn build_dedup(parent: Option<&GenView>) -> Result<DedupIndex> {
    let mut idx = DedupIndex::new();
    let Some(p) = parent else { return Ok(idx) };
    for rep in std::iter::once(&p.base).chain(p.delta.as_ref()) {
        rep.blob_refs(|d, loc| {
            idx.insert(d, loc);
            idx.len() < DEDUP_MAX_ENTRIES
        })?;
    }
    Ok(idx)
}
