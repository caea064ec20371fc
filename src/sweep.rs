//! Sweep: two-phase garbage collection that runs while mounts, commits and
//! materializations go on, and never deletes what a reader or writer can
//! still reach (invariants 4 and 5).
//!
//! One sweep, under the `sweep/SWEEPER.lease` (one sweeper at a time):
//! 1. **retire** — apply each set's retention policy (RETIRED index records);
//! 2. **residue** — probe pins and staging owners; reclaim the unheld ones
//!    and journals whose owner is gone;
//! 3. **mark** — from the index (every non-retired representation of every
//!    generation, COMMITTED or PREPARED, with the base manifests they bind),
//!    then held pins (read *after* the index: a pin taken later re-reads the
//!    index and fails on anything retired), then live tasks' sources and
//!    outputs; manifests name their segments, packs and standalone blobs.
//!    Any unreadable root aborts the sweep: nothing is deleted;
//! 4. **condemn** — every listed manifest, segment, pack and blob not marked
//!    is recorded in `sweep/epochs/<epoch>.condemned`, carrying the epoch and
//!    time it was first condemned;
//! 5. **delete** — objects condemned since an *earlier* epoch, at least the
//!    grace period ago, and still unmarked, are deleted in batches bounded by
//!    count and time. Each batch holds `sweep/DELETING.lease`, first checks
//!    that no writer (a held staging owner) is live — otherwise deletion is
//!    deferred to a later sweep — and re-marks incrementally (index records,
//!    pins and tasks that appeared since the mark). Writers take their owner
//!    lease and then wait while `DELETING` is held, so a writer either is
//!    seen by the batch or starts after it: nothing a writer deduplicated
//!    against, created or published can be deleted under it.
//!
//! A sweep that would only repeat the newest epoch's report and condemned
//! list writes nothing (`SweepReport::unchanged`).
//!
//! Readers are never blocked: the mark only reads, condemning writes one
//! list, and a batch is a few hundred unlinks of objects nobody can reach.

use crate::compose::Representation;
use crate::error::{Error, Result};
use crate::failpoint::Step;
use crate::format::manifest::{Manifest, RepKind, MAX_MANIFEST_BYTES};
use crate::format::record::{IndexRecord, State, MAX_RECORD_BYTES};
use crate::liveness::FrameUse;
use crate::residue::LeaseInfo;
use crate::storage::fence;
use crate::storage::{PutOutcome, TryLease};
use crate::store::{keys, Store};
use serde::Serialize;
use std::collections::{BTreeMap, HashMap, HashSet};
use std::time::{Duration, Instant};

/// 1: initial layout.
pub const CONDEMNED_VERSION: u32 = 1;
const CONDEMNED_TAG: &str = "strata-condemned";
const REPORT_TAG: &str = "strata-sweep-report";
/// 1: initial layout.
pub const REPORT_VERSION: u32 = 1;
const MAX_CONDEMNED_BYTES: u64 = 1 << 30;
const MAX_REPORT_BYTES: u64 = 64 << 20;
/// Least grace on a remote store, in lease ttls (see `effective_grace`).
pub const REMOTE_GRACE_TTLS: u32 = 3;
/// Default grace: an object is deleted only after it stayed condemned this long.
pub const DEFAULT_GRACE: Duration = Duration::from_secs(15 * 60);
/// Objects deleted per batch, at most.
pub const BATCH_COUNT: usize = 512;
/// Time one batch may spend deleting (writers wait at most this plus a re-mark).
pub const BATCH_TIME: Duration = Duration::from_millis(50);
/// Pause between batches so waiting writers get in.
const BATCH_PAUSE: Duration = Duration::from_millis(5);
/// Names how pack live ratios are computed; changing it makes the ratios in
/// older reports stale (they are not reused).
const LIVENESS_KEY_TAG: &str = "strata-pack-liveness-2";
/// Epoch files (condemned lists and reports) kept besides the newest.
const KEEP_EPOCHS: u64 = 4;

#[derive(Debug, Clone)]
pub struct SweepOptions {
    pub grace: Duration,
    pub dry_run: bool,
    /// Who sweeps (for lease holders and retirement records).
    pub holder: String,
    /// Recompute pack live ratios from every reachable row even when the
    /// previous report's apply (`liveness_key`).
    pub recount: bool,
}

/// A count of objects and their bytes.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, serde::Deserialize)]
pub struct Tally {
    pub count: u64,
    pub bytes: u64,
}

impl Tally {
    fn add(&mut self, bytes: u64) {
        self.count += 1;
        self.bytes += bytes;
    }
}

/// Where the store's space goes.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, serde::Deserialize)]
pub struct Space {
    /// Objects reachable from base representations.
    pub live_base: Tally,
    /// Objects reachable only from delta representations.
    pub live_delta: Tally,
    /// Bytes of live frames inside reachable packs.
    pub packs_live_bytes: u64,
    /// Bytes of frames in reachable packs that no reachable row references
    /// (headers and trailers count as neither).
    pub packs_dead_bytes: u64,
    pub condemned: Tally,
    pub staging: Tally,
}

/// One reachable pack that is sparse ([`crate::liveness`]): a fold of the
/// rows using it rewrites its live frames.
#[derive(Debug, Clone, Serialize, serde::Deserialize)]
pub struct SparsePack {
    pub name: String,
    pub size: u64,
    pub live_bytes: u64,
}

/// What a sweep found and did.
#[derive(Debug, Clone, Default, Serialize, serde::Deserialize)]
pub struct SweepReport {
    #[serde(rename = "type")]
    pub tag: String,
    pub version: u32,
    pub epoch: u64,
    pub dry_run: bool,
    pub grace_ms: u64,
    pub started_ns: i64,
    pub duration_ms: u64,
    pub mark_ms: u64,
    /// Rows read by the mark for pack live ratios (0: reused, see `liveness_key`).
    #[serde(default)]
    pub mark_rows: u64,
    /// Digest of the reachable manifests the pack live ratios were computed
    /// from; the next sweep reuses them when it reaches the same manifests.
    #[serde(default)]
    pub liveness_key: String,
    /// (set, generation) retired by retention in this sweep.
    pub retired: Vec<(String, u64)>,
    pub roots: Roots,
    /// Objects listed in the store.
    pub objects: u64,
    /// Objects marked reachable.
    pub marked: u64,
    pub space: Space,
    pub sparse_packs: Vec<SparsePack>,
    /// Unreachable now (all, and those first condemned by this sweep).
    pub condemned: Tally,
    pub newly_condemned: Tally,
    /// Condemned earlier and past the grace: what deletion attempts.
    pub deletable: Tally,
    pub deleted: Tally,
    /// Why deletion stopped before the end, if it did.
    pub deferred: Option<String>,
    /// Problems that did not stop the sweep.
    #[serde(default)]
    pub warnings: Vec<String>,
    /// Pins and staging reclaimed (or, dry run, that would be).
    pub reclaimed: Vec<LeaseInfo>,
    /// Markers kept for an operator (invalid bodies).
    pub invalid: Vec<LeaseInfo>,
    /// Nothing changed since the report of `epoch` (same reachable
    /// manifests, condemned objects, space and roots; nothing retired,
    /// reclaimed, condemned anew or deletable), so nothing was written.
    #[serde(default)]
    pub unchanged: bool,
}

/// What the mark started from.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, serde::Deserialize)]
pub struct Roots {
    pub generations: u64,
    pub representations: u64,
    pub pins: u64,
    pub tasks: u64,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
enum Kind {
    Manifest,
    Segment,
    Pack,
    Blob,
}

impl Kind {
    fn key(self, hex: &str) -> String {
        match self {
            Kind::Manifest => keys::manifest(hex),
            Kind::Segment => keys::segment(hex),
            Kind::Pack => keys::pack(hex),
            Kind::Blob => keys::blob(hex),
        }
    }

    fn code(self) -> char {
        match self {
            Kind::Manifest => 'm',
            Kind::Segment => 's',
            Kind::Pack => 'p',
            Kind::Blob => 'b',
        }
    }

    fn from_code(c: &str) -> Option<Kind> {
        Some(match c {
            "m" => Kind::Manifest,
            "s" => Kind::Segment,
            "p" => Kind::Pack,
            "b" => Kind::Blob,
            _ => return None,
        })
    }
}

fn digest(what: &'static str, name: &str) -> Result<[u8; 32]> {
    let mut d = [0u8; 32];
    match hex::decode_to_slice(name, &mut d) {
        Ok(()) => Ok(d),
        Err(_) => Err(Error::corrupt(
            what,
            name,
            "name is not a SHA-256/BLAKE3 hex digest",
        )),
    }
}

/// Epoch and time each condemned object was first condemned.
type FirstCondemned = HashMap<(Kind, [u8; 32]), (u64, i64)>;

/// A marked object: its size and whether a base representation reaches it.
#[derive(Clone, Copy)]
struct Obj {
    size: u64,
    base: bool,
}

/// The reachable set, built by the mark and grown by each batch's re-mark.
#[derive(Default)]
struct Marks {
    objects: HashMap<(Kind, [u8; 32]), Obj>,
    /// Root sources already read: newest index record keys, pin keys, task record keys.
    seen: HashSet<String>,
    /// Generations planned for retirement (a dry run marks as if retired).
    skip: HashSet<(String, u64)>,
    roots: Roots,
}

impl Marks {
    fn contains(&self, kind: Kind, d: &[u8; 32]) -> bool {
        self.objects.contains_key(&(kind, *d))
    }

    fn mark(&mut self, kind: Kind, d: [u8; 32], size: u64, base: bool) {
        let o = self.objects.entry((kind, d)).or_insert(Obj { size, base });
        o.base |= base;
    }

    /// Mark a manifest, what it names and the base manifest it binds. The
    /// manifest itself is marked last, so one that failed to load (or whose
    /// base failed) is expanded again by the next root that names it.
    fn manifest(&mut self, store: &Store, name: &str) -> Result<()> {
        let d = digest("manifest", name)?;
        if self.contains(Kind::Manifest, &d) {
            return Ok(());
        }
        let bytes = store
            .storage()
            .get(&keys::manifest(name), MAX_MANIFEST_BYTES)?;
        let m = Manifest::decode(name, &bytes)?;
        let base = m.representation == RepKind::Base;
        for s in &m.segments {
            self.mark(Kind::Segment, digest("segment", &s.name)?, s.size, base);
        }
        for p in &m.packs {
            self.mark(Kind::Pack, digest("pack", &p.name)?, p.size, base);
        }
        for b in &m.blobs {
            self.mark(Kind::Blob, digest("blob", &b.name)?, b.size, base);
        }
        if let Some(b) = &m.base {
            self.manifest(store, &b.manifest)?;
        }
        self.mark(Kind::Manifest, d, bytes.len() as u64, base);
        Ok(())
    }

    /// Mark from the index: every generation's newest record not yet read.
    fn index(&mut self, store: &Store) -> Result<()> {
        for set in store.sets()? {
            let mut newest: BTreeMap<u64, u32> = BTreeMap::new();
            for name in store.storage().list(&keys::index_dir(&set))? {
                if let Some((g, v)) = IndexRecord::parse_name(&name) {
                    let e = newest.entry(g).or_insert(v);
                    *e = (*e).max(v);
                }
            }
            for (g, v) in newest {
                let key = keys::index_record(&set, g, v);
                if self.seen.insert(key.clone()) {
                    self.record(store, &set, &key)?;
                }
            }
        }
        Ok(())
    }

    fn record(&mut self, store: &Store, set: &str, key: &str) -> Result<()> {
        let bytes = store.storage().get(key, MAX_RECORD_BYTES)?;
        let r = IndexRecord::decode(key, &bytes)?;
        if r.state == State::Retired || self.skip.contains(&(set.to_string(), r.generation)) {
            return Ok(());
        }
        self.roots.generations += 1;
        for rep in r
            .representations
            .iter()
            .filter(|x| x.state != State::Retired)
        {
            self.roots.representations += 1;
            self.manifest(store, &rep.manifest)?;
        }
        Ok(())
    }

    /// Mark from pins not yet read. A held pin whose manifest cannot be
    /// read, or whose body does not parse, is an unreadable root.
    fn pins(&mut self, store: &Store) -> Result<()> {
        for p in crate::pin::list(store)? {
            if !self.seen.insert(p.key.clone()) {
                continue;
            }
            match p.state {
                crate::pin::PinState::Invalid if p.held => {
                    return Err(Error::corrupt(
                        "pin",
                        &p.key,
                        "held pin with an unreadable body",
                    ))
                }
                crate::pin::PinState::Invalid => {}
                _ => {
                    self.roots.pins += u64::from(p.held);
                    if let Err(e) = self.manifest(store, &p.manifest) {
                        if p.state == crate::pin::PinState::Held {
                            return Err(e);
                        }
                    }
                }
            }
        }
        Ok(())
    }

    /// Mark sources and outputs of tasks that are not final. A source or
    /// output already gone is the task's to discover (SOURCE_RETIRED or a
    /// refold), not a reason to stop the sweep.
    fn tasks(&mut self, store: &Store) -> Result<()> {
        for t in crate::task::Tasks::new(store).list()? {
            let key = keys::task_record(&t.id, t.record);
            if t.state.is_final() || !self.seen.insert(key) {
                continue;
            }
            self.roots.tasks += 1;
            let names = t.sources.iter().map(|s| s.manifest.clone());
            for name in names.chain(t.output.clone()) {
                match self.manifest(store, &name) {
                    Err(e) if e.is_not_found() => {}
                    other => other?,
                }
            }
        }
        Ok(())
    }

    /// Every root, index first, then pins, then tasks.
    fn roots(&mut self, store: &Store) -> Result<()> {
        self.index(store)?;
        self.pins(store)?;
        self.tasks(store)
    }

    /// Live bytes by category (reached from a base, or only from deltas).
    fn space(&self) -> Space {
        let mut space = Space::default();
        for o in self.objects.values() {
            match o.base {
                true => space.live_base.add(o.size),
                false => space.live_delta.add(o.size),
            }
        }
        space
    }

    /// Names of the marked manifests, sorted.
    fn manifest_names(&self) -> Vec<String> {
        let mut names: Vec<String> = self
            .objects
            .keys()
            .filter(|(k, _)| *k == Kind::Manifest)
            .map(|(_, d)| hex::encode(d))
            .collect();
        names.sort();
        names
    }

    /// Live and dead bytes of every reachable pack, from the location
    /// columns of every reachable row; reused from `previous` when the
    /// reachable manifests are the same (their rows are immutable).
    fn pack_liveness(&self, store: &Store, previous: Option<&SweepReport>) -> Result<Liveness> {
        let names = self.manifest_names();
        let mut h = blake3::Hasher::new();
        h.update(LIVENESS_KEY_TAG.as_bytes());
        for n in &names {
            h.update(b"\n");
            h.update(n.as_bytes());
        }
        let key = hex::encode(h.finalize().as_bytes());
        if let Some(p) = previous.filter(|p| p.liveness_key == key) {
            return Ok(Liveness {
                key,
                live: p.space.packs_live_bytes,
                dead: p.space.packs_dead_bytes,
                sparse: p.sparse_packs.clone(),
                rows: 0,
            });
        }
        let mut used = FrameUse::default();
        let mut rows = 0;
        for name in &names {
            let rep = Representation::open(store, name)?;
            if rep.manifest.packs.is_empty() {
                continue;
            }
            rep.blob_locs(|loc| {
                rows += 1;
                used.add(loc);
            })?;
        }
        Ok(self.tally_packs(store, key, &mut used, rows))
    }

    fn tally_packs(&self, store: &Store, key: String, used: &mut FrameUse, rows: u64) -> Liveness {
        let mut out = Liveness {
            key,
            rows,
            ..Liveness::default()
        };
        for (&(kind, d), o) in &self.objects {
            if kind != Kind::Pack {
                continue;
            }
            let pack = used.pack_use(store, d, o.size);
            out.live += pack.live;
            out.dead += pack.dead();
            if pack.is_sparse() {
                out.sparse.push(SparsePack {
                    name: hex::encode(d),
                    size: o.size,
                    live_bytes: pack.live,
                });
            }
        }
        out.sparse.sort_by(|a, b| a.name.cmp(&b.name));
        out
    }
}

/// Pack live ratios of one set of reachable manifests.
#[derive(Default)]
struct Liveness {
    key: String,
    live: u64,
    dead: u64,
    sparse: Vec<SparsePack>,
    rows: u64,
}

/// One unreachable object.
#[derive(Debug, Clone)]
struct Condemned {
    kind: Kind,
    digest: [u8; 32],
    size: u64,
    first_epoch: u64,
    first_ns: i64,
}

impl Condemned {
    fn key(&self) -> String {
        self.kind.key(&hex::encode(self.digest))
    }

    fn line(&self) -> String {
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
fn epochs(store: &Store) -> Result<Vec<u64>> {
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
fn load_condemned(store: &Store, epoch: u64) -> Result<FirstCondemned> {
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

/// Every stored object that is not marked.
fn unreachable(
    store: &Store,
    marks: &Marks,
    prev: &FirstCondemned,
    epoch: u64,
    now: i64,
) -> Result<(Vec<Condemned>, u64)> {
    let storage = store.storage();
    let mut dirs = vec![(Kind::Manifest, "manifests".to_string(), ".json")];
    for (kind, top, ext) in [
        (Kind::Segment, "segments", ".parquet"),
        (Kind::Pack, "packs", ".pack"),
        (Kind::Blob, "blobs", ""),
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
    Ok((out, listed))
}

fn write_condemned(store: &Store, epoch: u64, list: &[Condemned], now: i64) -> Result<()> {
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

/// Take the sweeper lease or report who holds it.
fn take_sweeper(store: &Store, holder: &str) -> Result<Box<dyn crate::storage::Lease>> {
    match store.storage().lease(keys::SWEEPER_LEASE, holder, false)? {
        TryLease::Acquired(l) => Ok(l),
        TryLease::Busy { holder } => Err(Error::Conflict(format!(
            "another sweep is running: holder=`{holder}`"
        ))),
    }
}

/// Make the calling thread a background thread, so a sweep's mark and
/// deletions yield to the mount's readers on a busy machine: nice 19, the
/// idle I/O class and a short scheduling slice ([`SWEEP_SLICE_NS`]). Not
/// SCHED_IDLE: the scheduler counts a CPU that runs only SCHED_IDLE work as
/// idle and wakes readers there, where they must preempt the sweep first;
/// on 2 cores a SCHED_IDLE busy loop widened the mount's cat p99 by 75%, a
/// nice-19 one by 10% (docs/BENCHMARKS.md, "Sweep"). Callers that run
/// sweeps on their own thread or process call this once.
pub fn yield_cpu() {
    const IOPRIO_WHO_PROCESS: libc::c_long = 1;
    const IOPRIO_IDLE: libc::c_long = 3 << 13;
    // SAFETY: plain syscalls on the calling thread's own id.
    unsafe {
        let tid = libc::syscall(libc::SYS_gettid);
        libc::setpriority(libc::PRIO_PROCESS, tid as libc::id_t, 19);
        libc::syscall(libc::SYS_ioprio_set, IOPRIO_WHO_PROCESS, tid, IOPRIO_IDLE);
    }
    short_slice();
}

/// The scheduling slice a sweeping thread asks for: the shortest Linux
/// accepts. The scheduler (EEVDF, Linux 6.12 on) lets a running thread
/// finish its slice before a woken one takes its CPU; a short slice makes
/// the sweep give way to a reader's FUSE thread sooner. Under back-to-back
/// full sweeps of a 1M-row store the mount's cat p99 was 0.57–0.69 ms with
/// the default slice and 0.50–0.54 ms with this one, idle 0.32–0.43 ms
/// (docs/BENCHMARKS.md, "Sweep").
const SWEEP_SLICE_NS: u64 = 100_000;

/// `struct sched_attr` as `sched_setattr(2)` takes it (first version, 48 bytes).
#[repr(C)]
struct SchedAttr {
    size: u32,
    policy: u32,
    flags: u64,
    nice: i32,
    priority: u32,
    runtime: u64,
    deadline: u64,
    period: u64,
}

/// Ask for [`SWEEP_SLICE_NS`] (keeping nice 19). Best effort: a kernel
/// without custom slices ignores or refuses it, and the thread keeps the
/// nice value `setpriority` gave it.
fn short_slice() {
    let attr = SchedAttr {
        size: std::mem::size_of::<SchedAttr>() as u32,
        policy: libc::SCHED_OTHER as u32,
        flags: 0,
        nice: 19,
        priority: 0,
        runtime: SWEEP_SLICE_NS,
        deadline: 0,
        period: 0,
    };
    // SAFETY: `attr` is a valid sched_attr of the size it declares; pid 0
    // is the calling thread.
    unsafe { libc::syscall(libc::SYS_sched_setattr, 0, &attr as *const SchedAttr, 0) };
}

/// Move the calling process into a session of its own, so a scheduling
/// autogroup of its own, and give that group the lowest weight (nice 19):
/// then the whole sweep process, not just one thread, counts for less than
/// any reader's session. For processes that only sweep (`strata sweep
/// --background`, which the mount daemon runs for its sweeps); the caller
/// leaves its terminal's session, so its signals no longer reach it.
/// Best effort: a kernel without autogroups keeps the nice-19 thread.
pub fn background_process() {
    // SAFETY: setsid has no preconditions; a process that already leads a
    // group keeps its session.
    unsafe { libc::setsid() };
    let _ = std::fs::write("/proc/self/autogroup", b"19");
}

/// On a store whose leases expire by observation, the grace is at least
/// [`REMOTE_GRACE_TTLS`] lease ttls: one for a dead holder to be recognised,
/// one for a publication (fenced within a ttl), one as a margin for
/// clock-rate skew between hosts.
fn effective_grace(store: &Store, asked: Duration, report: &mut SweepReport) -> Duration {
    let Some(ttl) = store.storage().lease_ttl() else {
        return asked;
    };
    let floor = ttl * REMOTE_GRACE_TTLS;
    if asked >= floor {
        return asked;
    }
    report.warnings.push(format!(
        "grace raised from {asked:?} to {floor:?} ({REMOTE_GRACE_TTLS} lease ttls on a remote store)"
    ));
    report.grace_ms = floor.as_millis() as u64;
    floor
}

/// Run one sweep (see the module docs for the steps).
pub fn sweep(store: &Store, opts: &SweepOptions) -> Result<SweepReport> {
    let started = Instant::now();
    let now = crate::token::now_ns();
    let sweeper = take_sweeper(store, &opts.holder)?;
    let mut report = SweepReport {
        tag: REPORT_TAG.into(),
        version: REPORT_VERSION,
        dry_run: opts.dry_run,
        grace_ms: opts.grace.as_millis() as u64,
        started_ns: now,
        ..SweepReport::default()
    };
    let mut marks = Marks::default();
    retire(store, opts, &mut report, &mut marks)?;
    residue(store, opts, &mut report)?;
    let mark_start = Instant::now();
    marks.roots(store).map_err(|e| root_unreadable(e, "mark"))?;
    let previous = last_report(store).unwrap_or(None);
    let liveness = marks
        .pack_liveness(store, previous.as_ref().filter(|_| !opts.recount))
        .map_err(|e| root_unreadable(e, "pack live ratios"))?;
    let mut space = marks.space();
    space.packs_live_bytes = liveness.live;
    space.packs_dead_bytes = liveness.dead;
    report.sparse_packs = liveness.sparse;
    report.liveness_key = liveness.key;
    report.mark_ms = mark_start.elapsed().as_millis() as u64;
    report.marked = marks.objects.len() as u64;
    report.mark_rows = liveness.rows;
    report.roots = marks.roots;
    let known = epochs(store)?;
    let epoch = match known.last() {
        None => 1,
        Some(e) => e.checked_add(1).ok_or_else(|| {
            Error::corrupt(
                "sweep epoch",
                keys::EPOCH_DIR,
                "the newest epoch cannot be followed",
            )
        })?,
    };
    report.epoch = epoch;
    let prev = previous_condemned(store, known.last().copied(), &mut report);
    let (condemned, listed) = unreachable(store, &marks, &prev, epoch, now)?;
    report.objects = listed;
    let grace = effective_grace(store, opts.grace, &mut report);
    let grace_ns = grace.as_nanos().min(i64::MAX as u128) as i64;
    let mut deletable = Vec::new();
    for c in &condemned {
        report.condemned.add(c.size);
        if c.first_epoch == epoch {
            report.newly_condemned.add(c.size);
        } else if now.saturating_sub(c.first_ns) >= grace_ns {
            report.deletable.add(c.size);
            deletable.push(c.clone());
        }
    }
    report.space = space;
    report.space.condemned = report.condemned;
    report.space.staging = staging_space(store)?;
    if let Some(p) = previous.filter(|p| known.last() == Some(&p.epoch)) {
        report.unchanged = unchanged(&report, &p, prev.len(), condemned.len());
        report.epoch = if report.unchanged { p.epoch } else { epoch };
    }
    if opts.dry_run || report.unchanged {
        report.duration_ms = started.elapsed().as_millis() as u64;
        return Ok(report);
    }
    write_condemned(store, epoch, &condemned, now)?;
    store.failpoints().hit(Step::Condemned)?;
    delete(store, opts, &*sweeper, &mut marks, &deletable, &mut report)?;
    report.space.condemned.count -= report.deleted.count;
    report.space.condemned.bytes -= report.deleted.bytes;
    report.duration_ms = started.elapsed().as_millis() as u64;
    finish(store, epoch, &known, &report)?;
    Ok(report)
}

/// Whether a sweep would only write again what the newest epoch's report
/// `p` and condemned list (`prev_len` objects) already say. Quiet sweeps
/// then write nothing: on a daemon sweeping an idle store every few
/// seconds, two fsynced files per sweep widened the mount's cat p99 by a
/// third (docs/BENCHMARKS.md, "Sweep"). Every condemned object was found in
/// the list (none is new), so equal counts mean equal sets, and each keeps
/// the epoch and time it was first condemned.
fn unchanged(r: &SweepReport, p: &SweepReport, prev_len: usize, condemned: usize) -> bool {
    r.retired.is_empty()
        && r.reclaimed.is_empty()
        && r.invalid.is_empty()
        && r.warnings.is_empty()
        && r.newly_condemned.count == 0
        && r.deletable.count == 0
        && prev_len == condemned
        && p.invalid.is_empty()
        && p.deferred.is_none()
        && r.liveness_key == p.liveness_key
        && r.objects == p.objects
        && r.marked == p.marked
        && r.roots == p.roots
        && r.space == p.space
}

/// The previous epoch's condemned list; an unreadable one only restarts the
/// grace of every object (they all count as newly condemned), so it is
/// reported and the sweep goes on.
fn previous_condemned(
    store: &Store,
    epoch: Option<u64>,
    report: &mut SweepReport,
) -> FirstCondemned {
    let Some(e) = epoch else {
        return HashMap::new();
    };
    load_condemned(store, e).unwrap_or_else(|err| {
        report.warnings.push(format!(
            "previous condemned list unreadable, grace restarts: {}",
            crate::cli_chain(&err)
        ));
        HashMap::new()
    })
}

fn root_unreadable(e: Error, during: &'static str) -> Error {
    Error::RootUnreadable {
        during,
        source: Box::new(e),
    }
}

/// Step 1: retention. A dry run only plans (and marks as if retired).
fn retire(
    store: &Store,
    opts: &SweepOptions,
    report: &mut SweepReport,
    marks: &mut Marks,
) -> Result<()> {
    for set in store.sets()? {
        // A set whose policy or tags cannot be read retires nothing this
        // time (what it keeps stays marked); the other sets go on.
        if let Err(e) = retire_set(store, opts, report, marks, &set) {
            report.warnings.push(format!(
                "retention of set `{set}` skipped: {}",
                crate::cli_chain(&e)
            ));
        }
    }
    if !opts.dry_run {
        store.failpoints().hit(Step::Retired)?;
    }
    Ok(())
}

fn retire_set(
    store: &Store,
    opts: &SweepOptions,
    report: &mut SweepReport,
    marks: &mut Marks,
    set: &str,
) -> Result<()> {
    let plan = crate::retain::plan(store, set, crate::token::now_ns())?;
    if opts.dry_run {
        for &g in &plan.retire {
            marks.skip.insert((set.to_string(), g));
            report.retired.push((set.to_string(), g));
        }
        return Ok(());
    }
    for g in crate::retain::apply(store, &plan, &opts.holder)? {
        report.retired.push((set.to_string(), g));
    }
    Ok(())
}

/// Step 2: probe and reclaim residue.
fn residue(store: &Store, opts: &SweepOptions, report: &mut SweepReport) -> Result<()> {
    let items = crate::residue::scan(store)?;
    report.invalid = items
        .iter()
        .filter(|i| i.verdict == crate::residue::Verdict::Invalid)
        .cloned()
        .collect();
    report.reclaimed = match opts.dry_run {
        true => items
            .into_iter()
            .filter(|i| i.action == crate::residue::RECLAIM)
            .collect(),
        false => crate::residue::reclaim(store, &items)?,
    };
    if !opts.dry_run {
        store.failpoints().hit(Step::ResidueReclaimed)?;
    }
    Ok(())
}

/// Bytes in staging directories (live or not yet reclaimed).
fn staging_space(store: &Store) -> Result<Tally> {
    let mut t = Tally::default();
    let mut dirs = vec![keys::STAGING.to_string()];
    while let Some(dir) = dirs.pop() {
        // Live attempts create and remove entries meanwhile: a name that
        // turned out to be a file, or vanished, is only not counted.
        let files = match store.storage().list_sizes(&dir) {
            Ok(f) => f,
            Err(_) if dir != keys::STAGING => continue,
            Err(e) => return Err(e),
        };
        for (name, size) in &files {
            if !name.ends_with(".owner") {
                t.add(*size);
            }
        }
        for name in store.storage().list(&dir)? {
            if files.binary_search_by(|(n, _)| n.cmp(&name)).is_err() {
                dirs.push(format!("{dir}/{name}"));
            }
        }
    }
    Ok(t)
}

/// Step 5: delete in batches, each under the DELETING lease, with no live
/// writer, after an incremental re-mark.
fn delete(
    store: &Store,
    opts: &SweepOptions,
    sweeper: &dyn crate::storage::Lease,
    marks: &mut Marks,
    deletable: &[Condemned],
    report: &mut SweepReport,
) -> Result<()> {
    let mut next = 0;
    while next < deletable.len() {
        let _deleting = match store
            .storage()
            .lease(keys::DELETING_LEASE, &opts.holder, true)?
        {
            TryLease::Acquired(l) => l,
            TryLease::Busy { holder } => {
                return Err(Error::internal(format!(
                    "waited for the deleting lease but did not get it: holder=`{holder}`"
                )))
            }
        };
        store.failpoints().hit(Step::Deleting)?;
        if let Some(holder) = crate::residue::live_writer(store)? {
            report.deferred = Some(format!(
                "{} object(s) left for a later sweep: a writer is live ({holder})",
                deletable.len() - next
            ));
            return Ok(());
        }
        marks
            .roots(store)
            .map_err(|e| root_unreadable(e, "re-mark before deleting"))?;
        let fence = fence::enter(&[sweeper, &*_deleting])?;
        next = delete_batch(store, marks, deletable, next, report)?;
        drop(fence);
        drop(_deleting);
        store.failpoints().hit(Step::BatchDeleted)?;
        std::thread::sleep(BATCH_PAUSE);
    }
    Ok(())
}

/// Delete from `deletable[next..]` up to the batch bounds; returns the next index.
fn delete_batch(
    store: &Store,
    marks: &Marks,
    deletable: &[Condemned],
    mut next: usize,
    report: &mut SweepReport,
) -> Result<usize> {
    let start = Instant::now();
    let mut n = 0;
    while next < deletable.len() && n < BATCH_COUNT && start.elapsed() < BATCH_TIME {
        let c = &deletable[next];
        next += 1;
        if marks.contains(c.kind, &c.digest) {
            continue;
        }
        store.storage().delete(&c.key())?;
        report.deleted.add(c.size);
        n += 1;
    }
    Ok(next)
}

/// Write the report, forget old epochs.
fn finish(store: &Store, epoch: u64, known: &[u64], report: &SweepReport) -> Result<()> {
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

/// The newest sweep report, if any sweep finished.
pub fn last_report(store: &Store) -> Result<Option<SweepReport>> {
    let mut names: Vec<String> = store
        .storage()
        .list(keys::EPOCH_DIR)?
        .into_iter()
        .filter(|n| n.ends_with(".report.json"))
        .collect();
    names.sort();
    let Some(name) = names.pop() else {
        return Ok(None);
    };
    let key = keys::epoch_file(&name);
    let bytes = store.storage().get(&key, MAX_REPORT_BYTES)?;
    let r: SweepReport = serde_json::from_slice(&bytes)
        .map_err(|e| Error::corrupt("sweep report", &key, e.to_string()))?;
    if r.tag != REPORT_TAG {
        return Err(Error::corrupt("sweep report", &key, "wrong type tag"));
    }
    if r.version > REPORT_VERSION {
        return Err(Error::NewerFormat {
            what: "sweep report",
            found: r.version,
            supported: REPORT_VERSION,
        });
    }
    Ok(Some(r))
}

#[cfg(test)]
mod tests {
    /// (major, minor) of the running kernel.
    fn kernel() -> (u32, u32) {
        let release = std::fs::read_to_string("/proc/sys/kernel/osrelease").unwrap();
        let mut parts = release.split(|c: char| !c.is_ascii_digit());
        let mut next = || parts.next().and_then(|p| p.parse().ok()).unwrap_or(0);
        (next(), next())
    }

    #[test]
    fn a_sweeping_thread_runs_at_nice_19_with_a_short_slice() {
        let (nice, sched) = std::thread::spawn(|| {
            super::yield_cpu();
            // SAFETY: plain syscalls about the calling thread.
            let nice = unsafe {
                let tid = libc::syscall(libc::SYS_gettid);
                libc::getpriority(libc::PRIO_PROCESS, tid as libc::id_t)
            };
            (
                nice,
                std::fs::read_to_string("/proc/thread-self/sched").unwrap(),
            )
        })
        .join()
        .unwrap();
        assert_eq!(nice, 19);
        if kernel() >= (6, 12) {
            let slice = sched
                .lines()
                .find(|l| l.starts_with("se.slice"))
                .and_then(|l| l.split(':').nth(1))
                .map(|v| v.trim().parse::<u64>().unwrap());
            assert_eq!(slice, Some(super::SWEEP_SLICE_NS), "{sched}");
        }
    }
}
