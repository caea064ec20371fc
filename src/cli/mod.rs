//! Argument parsing and command dispatch for `strata`.

mod budget;
mod gc;
mod generate;
mod history;
mod metrics;
mod mount;
mod render;
mod status;

use clap::{Args, Parser, Subcommand};
use serde::Serialize;
use std::ffi::OsString;
use std::io::{IsTerminal, Write};
use std::os::unix::ffi::OsStrExt;
use std::path::PathBuf;
use std::sync::Arc;
use strata::commit::{commit, CommitOptions, CommitSummary, Progress, Scope};
use strata::compose::GenView;
use strata::control;
use strata::error::{Error, ErrorKind, Result};
use strata::failpoint::FailPoints;
use strata::format::record::State;
use strata::index::GenIndex;
use strata::row::{normalize, Kind, Row};
use strata::storage::StoreArgs;
use strata::store::Store;
use strata::verify::{verify, Selection};

#[derive(Parser)]
#[command(
    name = "strata",
    version,
    about = "Versioned, verifiable file-tree generations"
)]
struct Cli {
    #[command(flatten)]
    store: StoreArgs,
    #[command(subcommand)]
    cmd: Cmd,
}

#[derive(Subcommand)]
enum Cmd {
    /// Create a store (idempotent)
    Init,
    /// Commit a directory as the next generation of a set
    Commit(CommitArgs),
    /// List the generations of a set
    Log(LogArgs),
    /// List a directory (or show one entry) of a generation
    Ls(LsArgs),
    /// Write a file of a generation to stdout, verified
    Cat(CatArgs),
    /// Paths added, removed and changed between two generations
    Diff(DiffArgs),
    /// The generations in which a path changed, one line per distinct version
    History(history::HistoryArgs),
    /// Re-hash everything reachable; exit 1 listing each problem
    Verify(VerifyArgs),
    /// List the sets of the store
    Sets(JsonArg),
    /// List read pins with holder and liveness (held, unheld, invalid)
    Pins(JsonArg),
    /// Name a committed generation (latest unless --gen); tagged generations are kept
    Tag(TagArgs),
    /// Remove a tag
    Untag(UntagArgs),
    /// List the tags of a set
    Tags(TagsArgs),
    /// Fold a generation's delta into a new base (a durable, resumable task)
    Materialize(MaterializeArgs),
    /// List materialization tasks with state, attempt, owner, progress, last error
    Tasks(TasksArgs),
    /// Store a set's retention policy and retire what it does not keep
    Retain(gc::RetainArgs),
    /// Collect garbage: retire, reclaim residue, mark, condemn, delete after a grace
    Sweep(gc::SweepArgs),
    /// List pins, staging owners and leases with a liveness verdict
    Leases(JsonArg),
    /// Sets, space by category, last sweep and the mount daemons' status
    Status(JsonArg),
    /// The mount daemons' metrics, in the Prometheus text format
    Metrics,
    /// Show or change the disk budget: free-space floor and store size limit
    Budget(budget::BudgetArgs),
    /// Print shell completions (bash, zsh, fish, elvish, powershell)
    Completions {
        /// bash, zsh, fish, elvish or powershell
        shell: clap_complete::Shell,
    },
    /// Write man pages (strata.1 and one per command) into DIR
    Manpages {
        /// Where to write them (created if missing)
        dir: PathBuf,
    },
    /// Mount every generation read-only at MOUNTPOINT (starts strata-mountd)
    Mount(MountCmd),
    /// Unmount: releases pins; a busy mount is reported unless --lazy
    Unmount(UnmountCmd),
}

#[derive(Args)]
struct MountCmd {
    /// Serve only these sets (repeatable)
    #[arg(long)]
    set: Vec<String>,
    /// Stay in the foreground (for systemd and tests)
    #[arg(long)]
    foreground: bool,
    /// When standalone blobs are hashed in full before being served
    #[arg(long, value_name = "WHEN", default_value = "first-open",
          value_parser = ["first-open", "always", "off"])]
    verify: String,
    /// Serve each entry's stored owner instead of the mounting user
    #[arg(long)]
    preserve_owner: bool,
    /// Do not fold deltas into new bases on the daemon's own initiative
    #[arg(long)]
    no_materialize: bool,
    /// Sweep the store on this schedule (0s: only on request; default 1h)
    #[arg(long, value_name = "D", value_parser = strata::storage::parse_duration)]
    sweep_every: Option<std::time::Duration>,
    /// Grace of scheduled sweeps (default 15m)
    #[arg(long, value_name = "D", value_parser = strata::storage::parse_duration)]
    sweep_grace: Option<std::time::Duration>,
    /// How often the daemon re-reads each set's latest (default 500ms; raise
    /// it on a remote store to save requests)
    #[arg(long, value_name = "D", value_parser = strata::storage::parse_duration)]
    poll: Option<std::time::Duration>,
    /// FUSE worker threads of the daemon (default 4)
    #[arg(long, value_name = "N", value_parser = clap::value_parser!(u16).range(1..=256))]
    threads: Option<u16>,
    /// An existing empty directory to mount the store on
    mountpoint: PathBuf,
}

#[derive(Args)]
struct UnmountCmd {
    /// Detach even if busy; open files are served until closed
    #[arg(long)]
    lazy: bool,
    /// Where the store is mounted
    mountpoint: PathBuf,
}

#[derive(Args)]
struct TagArgs {
    /// The set (one of `strata sets`)
    #[arg(long)]
    set: String,
    /// Generation number (default: latest)
    #[arg(long)]
    gen: Option<u64>,
    /// Tag name (letters, digits, `.`, `_`, `-`)
    name: String,
}

#[derive(Args)]
struct UntagArgs {
    /// The set (one of `strata sets`)
    #[arg(long)]
    set: String,
    /// Tag name
    name: String,
}

#[derive(Args)]
struct TagsArgs {
    /// The set (one of `strata sets`)
    #[arg(long)]
    set: String,
    /// Print JSON instead of a table
    #[arg(long)]
    json: bool,
}

#[derive(Args)]
struct MaterializeArgs {
    /// The set (one of `strata sets`)
    #[arg(long)]
    set: String,
    /// Generation to fold (default: latest)
    #[arg(long)]
    gen: Option<u64>,
    /// Wait for another worker's attempt or a retry delay instead of failing
    #[arg(long)]
    wait: bool,
    /// Only plan the task (PLANNED), do not run it
    #[arg(long)]
    plan: bool,
    /// Run in this process even when a mount daemon of the store runs
    #[arg(long)]
    in_process: bool,
    /// Print JSON instead of a table
    #[arg(long)]
    json: bool,
}

#[derive(Args)]
struct TasksArgs {
    /// Cancel this task (refused while an attempt works on it)
    #[arg(long, value_name = "ID")]
    cancel: Option<String>,
    /// Print JSON instead of a table
    #[arg(long)]
    json: bool,
}

#[derive(Args)]
pub(crate) struct JsonArg {
    /// Print JSON instead of a table
    #[arg(long)]
    json: bool,
}

#[derive(Args)]
struct CommitArgs {
    /// The set (one of `strata sets`)
    #[arg(long)]
    set: String,
    /// A message kept with the generation (shown by `strata log`)
    #[arg(long, short)]
    message: Option<String>,
    /// Observe only this subtree (repeatable); everything else is inherited
    #[arg(long, value_name = "P")]
    prefix: Vec<OsString>,
    /// Observe only the paths listed in FILE (newline- or NUL-separated)
    #[arg(long, value_name = "FILE")]
    paths_from: Option<PathBuf>,
    /// Write a full base instead of a delta
    #[arg(long)]
    base: bool,
    /// Wait for a concurrent commit to the same set instead of failing
    #[arg(long)]
    wait: bool,
    /// Record unreadable or vanishing paths as skipped instead of failing
    #[arg(long)]
    skip_unreadable: bool,
    /// Print JSON instead of a table
    #[arg(long)]
    json: bool,
    /// The directory to commit
    dir: PathBuf,
}

#[derive(Args)]
struct LogArgs {
    /// The set (one of `strata sets`)
    #[arg(long)]
    set: String,
    /// Include PREPARED (never committed) and RETIRED generations
    #[arg(long)]
    all: bool,
    /// Print JSON instead of a table
    #[arg(long)]
    json: bool,
}

#[derive(Args)]
struct LsArgs {
    /// The set (one of `strata sets`)
    #[arg(long)]
    set: String,
    /// Generation number (default: latest)
    #[arg(long)]
    gen: Option<u64>,
    /// Print JSON instead of a table
    #[arg(long)]
    json: bool,
    /// A path of the generation (default: its root)
    path: Option<OsString>,
}

#[derive(Args)]
struct CatArgs {
    /// The set (one of `strata sets`)
    #[arg(long)]
    set: String,
    /// Generation number (default: latest)
    #[arg(long)]
    gen: Option<u64>,
    /// A file of the generation
    path: OsString,
}

#[derive(Args)]
struct DiffArgs {
    /// The set (one of `strata sets`)
    #[arg(long)]
    set: String,
    /// The older generation
    a: u64,
    /// The newer generation
    b: u64,
    /// Print JSON instead of a table
    #[arg(long)]
    json: bool,
}

#[derive(Args)]
struct VerifyArgs {
    /// Only this set
    #[arg(long)]
    set: Option<String>,
    /// Only this generation (default: the latest of each set)
    #[arg(long, conflicts_with = "all")]
    gen: Option<u64>,
    /// Every retained generation
    #[arg(long)]
    all: bool,
    /// Print JSON instead of a table
    #[arg(long)]
    json: bool,
}

/// Exit codes (docs/CLI in README): 0 ok, 1 verify found problems,
/// 2 invalid input, 3 corrupt data, 4 conflict/busy, 5 unavailable, 70 internal.
fn exit_code(kind: ErrorKind) -> i32 {
    match kind {
        ErrorKind::InvalidInput => 2,
        ErrorKind::Corrupt => 3,
        ErrorKind::Conflict => 4,
        ErrorKind::Unavailable => 5,
        ErrorKind::Internal => 70,
    }
}

pub(crate) fn run() -> i32 {
    let cli = Cli::parse();
    let code = match dispatch(cli) {
        Ok(code) => code,
        Err(e) => {
            eprintln!("strata: error: {}", strata::cli_chain(&e));
            exit_code(e.kind())
        }
    };
    print_request_counts();
    code
}

/// The storage opened by this command, kept when `STRATA_REQUEST_STATS` is
/// set so its request counts can be printed at exit (for the benchmarks).
static OPENED: std::sync::OnceLock<Arc<dyn strata::storage::Storage>> = std::sync::OnceLock::new();

fn print_request_counts() {
    if let Some(counts) = OPENED.get().and_then(|s| s.request_counts()) {
        let line: Vec<String> = counts.iter().map(|(k, v)| format!("{k}={v}")).collect();
        eprintln!("strata: requests: {}", line.join(" "));
    }
}

fn failpoints() -> Result<FailPoints> {
    match std::env::var("STRATA_FAILPOINTS") {
        Ok(spec) => FailPoints::parse(&spec),
        Err(_) => Ok(FailPoints::none()),
    }
}

/// The local directory of the store (the store itself, or a remote store's
/// cache directory): control sockets and logs live under it.
fn store_path(cli_store: &StoreArgs) -> Result<PathBuf> {
    Ok(cli_store.location()?.local_dir().to_path_buf())
}

fn open(cli_store: &StoreArgs) -> Result<Store> {
    let storage = cli_store.location()?.open()?;
    if std::env::var_os("STRATA_REQUEST_STATS").is_some() {
        let _ = OPENED.set(storage.clone());
    }
    Ok(Store::open(storage)?.with_failpoints(failpoints()?))
}

fn dispatch(cli: Cli) -> Result<i32> {
    match cli.cmd {
        Cmd::Init => init(&cli.store),
        Cmd::Commit(a) => cmd_commit(&open(&cli.store)?, a),
        Cmd::Log(a) => log(&open(&cli.store)?, a),
        Cmd::Ls(a) => ls(&open(&cli.store)?, a),
        Cmd::Cat(a) => cat(&open(&cli.store)?, a),
        Cmd::Diff(a) => diff(&open(&cli.store)?, a),
        Cmd::History(a) => history::history(&open(&cli.store)?, a),
        Cmd::Verify(a) => cmd_verify(&open(&cli.store)?, a),
        Cmd::Sets(a) => sets(&open(&cli.store)?, a),
        Cmd::Pins(a) => pins(&open(&cli.store)?, a),
        Cmd::Tag(a) => {
            let generation = strata::tag::tag(&open(&cli.store)?, &a.set, &a.name, a.gen)?;
            println!("tagged {}@{generation} as {}", a.set, a.name);
            Ok(0)
        }
        Cmd::Untag(a) => {
            strata::tag::untag(&open(&cli.store)?, &a.set, &a.name)?;
            println!("untagged {} of {}", a.name, a.set);
            Ok(0)
        }
        Cmd::Tags(a) => tags(&open(&cli.store)?, a),
        Cmd::Materialize(a) => {
            let store = open(&cli.store)?;
            cmd_materialize(&store, &store_path(&cli.store)?, a)
        }
        Cmd::Tasks(a) => tasks(&open(&cli.store)?, a),
        Cmd::Retain(a) => gc::retain(&open(&cli.store)?, a),
        Cmd::Sweep(a) => {
            let store = open(&cli.store)?;
            gc::sweep(&store, &store_path(&cli.store)?, a)
        }
        Cmd::Leases(a) => gc::leases(&open(&cli.store)?, a),
        Cmd::Status(a) => {
            let store = open(&cli.store)?;
            status::status(&store, &store_path(&cli.store)?, a)
        }
        Cmd::Metrics => metrics::metrics(&store_path(&cli.store)?),
        Cmd::Budget(a) => budget::budget(&open(&cli.store)?, &store_path(&cli.store)?, a),
        Cmd::Completions { shell } => generate::completions(shell),
        Cmd::Manpages { dir } => generate::manpages(&dir),
        Cmd::Mount(a) => {
            open(&cli.store)?;
            mount::mount(&mount::MountArgs {
                store: &cli.store.location()?,
                store_args: &cli.store,
                mountpoint: &a.mountpoint,
                sets: &a.set,
                foreground: a.foreground,
                verify: &a.verify,
                preserve_owner: a.preserve_owner,
                no_materialize: a.no_materialize,
                sweep_every: a.sweep_every,
                sweep_grace: a.sweep_grace,
                poll: a.poll,
                threads: a.threads,
            })
        }
        Cmd::Unmount(a) => mount::unmount(&a.mountpoint, a.lazy),
    }
}

fn print_json<T: Serialize>(v: &T) -> Result<i32> {
    let s = serde_json::to_string_pretty(v)
        .map_err(|e| Error::internal_from("encode the json output", e))?;
    println!("{s}");
    Ok(0)
}

fn init(cli_store: &StoreArgs) -> Result<i32> {
    let location = cli_store.location()?;
    let path = location.local_dir();
    std::os::unix::fs::DirBuilderExt::mode(std::fs::DirBuilder::new().recursive(true), 0o700)
        .create(path)
        .map_err(|e| Error::io("mkdir", path, e))?;
    let storage = location.open()?;
    let described = storage.describe();
    let (_, created) = Store::init(storage)?;
    let verb = if created {
        "initialized"
    } else {
        "already initialized"
    };
    println!("store {verb}: {described}");
    Ok(0)
}

fn read_paths_file(path: &PathBuf) -> Result<Vec<Vec<u8>>> {
    let bytes = std::fs::read(path).map_err(|e| Error::io("read", path, e))?;
    let sep = if bytes.contains(&0) { 0 } else { b'\n' };
    Ok(bytes
        .split(|&b| b == sep)
        .filter(|l| !l.is_empty())
        .map(|l| l.to_vec())
        .collect())
}

fn scope(a: &CommitArgs) -> Result<Scope> {
    if a.prefix.is_empty() && a.paths_from.is_none() {
        return Ok(Scope::Whole);
    }
    let mut paths: Vec<Vec<u8>> = a.prefix.iter().map(|p| p.as_bytes().to_vec()).collect();
    if let Some(f) = &a.paths_from {
        paths.extend(read_paths_file(f)?);
    }
    if paths.is_empty() {
        return Err(Error::Invalid("--paths-from lists no path".into()));
    }
    Scope::from_paths(&paths)
}

fn cmd_commit(store: &Store, a: CommitArgs) -> Result<i32> {
    let mut opts = CommitOptions::new(&a.set, &a.dir);
    opts.scope = scope(&a)?;
    opts.message = a.message.clone();
    opts.force_base = a.base;
    opts.wait = a.wait;
    opts.skip_unreadable = a.skip_unreadable;
    let progress = Arc::new(Progress::default());
    let bar =
        (!a.json && std::io::stderr().is_terminal()).then(|| spawn_progress(progress.clone()));
    let result = commit(store, &opts, progress);
    if let Some((stop, handle)) = bar {
        stop.store(true, std::sync::atomic::Ordering::Relaxed);
        let _ = handle.join();
    }
    let summary = result?;
    if a.json {
        return print_json(&summary);
    }
    print_commit(&summary);
    Ok(0)
}

type ProgressHandle = (
    Arc<std::sync::atomic::AtomicBool>,
    std::thread::JoinHandle<()>,
);

fn spawn_progress(p: Arc<Progress>) -> ProgressHandle {
    use std::sync::atomic::Ordering::Relaxed;
    let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let s = stop.clone();
    let handle = std::thread::spawn(move || {
        let bar = indicatif::ProgressBar::new_spinner();
        while !s.load(Relaxed) {
            bar.set_message(format!(
                "walked {} entries, hashed {} files ({})",
                p.walked.load(Relaxed),
                p.hashed_files.load(Relaxed),
                render::bytes(p.hashed_bytes.load(Relaxed))
            ));
            bar.tick();
            std::thread::sleep(std::time::Duration::from_millis(100));
        }
        bar.finish_and_clear();
    });
    (stop, handle)
}

fn print_commit(s: &CommitSummary) {
    let secs = s.duration_ms as f64 / 1000.0;
    match s.generation {
        Some(g) => println!(
            "set {}: generation {g} committed as {} in {secs:.2} s",
            s.set,
            s.representation.as_deref().unwrap_or("?")
        ),
        None => println!(
            "set {}: no changes since generation {}; nothing published ({secs:.2} s)",
            s.set,
            s.parent.map_or("-".into(), |p| p.to_string())
        ),
    }
    let c = &s.changes;
    println!(
        "  added {}, changed {}, removed {}, unchanged {}",
        c.added, c.changed, c.removed, c.unchanged
    );
    println!(
        "  walked {} entries, hashed {} files ({}), stored {} new",
        s.walked,
        s.hashed_files,
        render::bytes(s.hashed_bytes),
        render::bytes(s.new_bytes)
    );
    if s.skipped_special > 0 {
        eprintln!(
            "strata: warning: skipped {} special file(s) (fifo, socket, device)",
            s.skipped_special
        );
        for w in &s.warnings {
            eprintln!("  {w}");
        }
    }
    for p in &s.skipped_unreadable {
        eprintln!("strata: warning: skipped unreadable: {p}");
    }
}

#[derive(Serialize)]
struct LogEntry {
    generation: u64,
    state: &'static str,
    representation: &'static str,
    base: Option<u64>,
    identity: String,
    files: u64,
    bytes: u64,
    committed_ns: Option<i64>,
    message: Option<String>,
}

fn log(store: &Store, a: LogArgs) -> Result<i32> {
    strata::store::check_set_name(&a.set)?;
    let records = GenIndex::new(store, &a.set).all()?;
    if records.is_empty() {
        return Err(Error::NotFound {
            what: "set",
            name: a.set,
        });
    }
    let entries: Vec<LogEntry> = records
        .into_values()
        .rev()
        .filter(|r| a.all || r.state == State::Committed)
        .map(|r| {
            let rep = r.read_rep().or(r.representations.first()).cloned();
            LogEntry {
                generation: r.generation,
                state: r.state.label(),
                representation: rep.as_ref().map_or("-", |p| p.kind.label()),
                base: rep.as_ref().and_then(|p| p.base).or(Some(r.generation)),
                identity: r.identity,
                files: r.files,
                bytes: r.bytes,
                committed_ns: r.committed_ns,
                message: r.message,
            }
        })
        .collect();
    if a.json {
        return print_json(&entries);
    }
    let rows: Vec<Vec<String>> = entries
        .iter()
        .map(|e| {
            vec![
                e.generation.to_string(),
                e.state.to_string(),
                e.representation.to_string(),
                e.base.map_or("-".into(), |b| b.to_string()),
                e.files.to_string(),
                render::bytes(e.bytes),
                e.committed_ns.map_or("-".into(), render::time),
                e.identity[..12.min(e.identity.len())].to_string(),
                e.message.clone().unwrap_or_default(),
            ]
        })
        .collect();
    println!(
        "{}",
        render::table(
            &[
                "GEN",
                "STATE",
                "REP",
                "BASE",
                "FILES",
                "BYTES",
                "COMMITTED (UTC)",
                "IDENTITY",
                "MESSAGE"
            ],
            &rows
        )
    );
    Ok(0)
}

#[derive(Serialize)]
struct LsEntry {
    name: String,
    name_hex: String,
    kind: &'static str,
    mode: String,
    size: u64,
    mtime_ns: i64,
    digest: Option<String>,
    target: Option<String>,
    changed_gen: u64,
}

fn ls_entry(r: &Row) -> LsEntry {
    LsEntry {
        name: strata::row::show(&r.name),
        name_hex: hex::encode(&r.name),
        kind: r.kind.label(),
        mode: format!("{:04o}", r.mode),
        size: r.size,
        mtime_ns: r.mtime_ns,
        digest: r.digest.map(hex::encode),
        target: r.target.as_deref().map(strata::row::show),
        changed_gen: r.changed_gen,
    }
}

fn ls(store: &Store, a: LsArgs) -> Result<i32> {
    let view = GenView::open(store, &a.set, a.gen, "ls")?;
    let path = normalize(a.path.as_ref().map_or(&b""[..], |p| p.as_bytes()))?;
    let row = view.lookup(&path)?.ok_or_else(|| Error::NotFound {
        what: "path",
        name: strata::row::show(&path),
    })?;
    let rows = if row.kind == Kind::Dir {
        view.list_dir(&path)?
    } else {
        vec![row]
    };
    if a.json {
        return print_json(&rows.iter().map(ls_entry).collect::<Vec<_>>());
    }
    let mut out = std::io::stdout().lock();
    for r in &rows {
        let mut name = strata::row::show(&r.name);
        if let Some(t) = &r.target {
            name = format!("{name} -> {}", strata::row::show(t));
        }
        let _ = writeln!(
            out,
            "{} {:>12} {} {}",
            render::mode(r),
            r.size,
            render::time(r.mtime_ns),
            name
        );
    }
    Ok(0)
}

fn cat(store: &Store, a: CatArgs) -> Result<i32> {
    let view = GenView::open(store, &a.set, a.gen, "cat")?;
    let path = normalize(a.path.as_bytes())?;
    let row = view.lookup(&path)?.ok_or_else(|| Error::NotFound {
        what: "path",
        name: strata::row::show(&path),
    })?;
    if row.kind != Kind::File {
        return Err(Error::Invalid(format!(
            "not a file: path=`{}` kind={}",
            strata::row::show(&path),
            row.kind.label()
        )));
    }
    let mut out = std::io::stdout().lock();
    strata::blob::copy_to(store, &row, &mut out)?;
    out.flush().map_err(|e| Error::io("write", "stdout", e))?;
    Ok(0)
}

fn diff(store: &Store, a: DiffArgs) -> Result<i32> {
    let va = GenView::open(store, &a.set, Some(a.a), "diff")?;
    let vb = GenView::open(store, &a.set, Some(a.b), "diff")?;
    let entries = strata::diff::diff(&va, &vb)?;
    if a.json {
        return print_json(&entries);
    }
    let mut out = std::io::stdout().lock();
    for e in &entries {
        let c = match e.change {
            strata::diff::Change::Added => 'A',
            strata::diff::Change::Removed => 'D',
            strata::diff::Change::Changed => 'M',
        };
        let _ = writeln!(out, "{c} {}", e.path);
    }
    Ok(0)
}

fn cmd_verify(store: &Store, a: VerifyArgs) -> Result<i32> {
    let sets = match a.set {
        Some(s) => vec![s],
        None => store.sets()?,
    };
    let sel = match (a.gen, a.all) {
        (Some(g), _) => Selection::One(g),
        (None, true) => Selection::All,
        (None, false) => Selection::Latest,
    };
    let report = verify(store, &sets, sel)?;
    let code = i32::from(!report.problems.is_empty());
    if a.json {
        print_json(&report)?;
        return Ok(code);
    }
    println!(
        "verified {} generation(s): {} manifests, {} segments, {} packs, {} blobs, {} rows",
        report.generations.len(),
        report.manifests,
        report.segments,
        report.packs,
        report.blobs,
        report.rows
    );
    for p in &report.problems {
        println!("PROBLEM {p}");
    }
    if code == 0 {
        println!("ok");
    }
    Ok(code)
}

fn sets(store: &Store, a: JsonArg) -> Result<i32> {
    let mut rows = Vec::new();
    for s in store.sets()? {
        let latest = GenIndex::new(store, &s).latest()?;
        rows.push((s, latest.map(|r| (r.generation, r.files, r.bytes))));
    }
    if a.json {
        let v: Vec<_> = rows.iter().map(|(s, l)| serde_json::json!({"set": s, "latest": l.map(|x| x.0), "files": l.map(|x| x.1), "bytes": l.map(|x| x.2)})).collect();
        return print_json(&v);
    }
    let table: Vec<Vec<String>> = rows
        .iter()
        .map(|(s, l)| {
            vec![
                s.clone(),
                l.map_or("-".into(), |x| x.0.to_string()),
                l.map_or("-".into(), |x| x.1.to_string()),
                l.map_or("-".into(), |x| render::bytes(x.2)),
            ]
        })
        .collect();
    println!(
        "{}",
        render::table(&["SET", "LATEST", "FILES", "BYTES"], &table)
    );
    Ok(0)
}

/// Through the store's mount daemon when one answers, else in this process.
fn run_materialize(
    store: &Store,
    root: &std::path::Path,
    opts: &strata::materialize::MaterializeOptions,
    in_process: bool,
) -> Result<strata::materialize::Outcome> {
    if !opts.plan_only && !in_process {
        let request = control::Command::Materialize {
            set: opts.set.clone(),
            generation: opts.generation,
            wait: opts.wait,
        };
        for socket in control::sockets(root) {
            if let Some(outcome) = control::ask_as(&socket, &request, None)? {
                return Ok(outcome);
            }
        }
    }
    strata::materialize::materialize(store, opts)
}

fn cmd_materialize(store: &Store, root: &std::path::Path, a: MaterializeArgs) -> Result<i32> {
    let opts = strata::materialize::MaterializeOptions {
        set: a.set,
        generation: a.gen,
        wait: a.wait,
        plan_only: a.plan,
    };
    let o = run_materialize(store, root, &opts, a.in_process)?;
    let failed = matches!(
        o.state,
        Some(strata::task::TaskState::Failed | strata::task::TaskState::SourceRetired)
    );
    let code = if failed { 1 } else { 0 };
    if a.json {
        print_json(&o)?;
        return Ok(code);
    }
    match (&o.task, o.state) {
        (None, _) => println!("{}@{} already reads from a base", o.set, o.generation),
        (Some(task), Some(state)) => println!(
            "{}@{}: task {task} {} (attempt {}, {} rows{})",
            o.set,
            o.generation,
            state.label(),
            o.attempt,
            o.rows,
            o.manifest
                .as_deref()
                .map(|m| format!(", base {}", &m[..m.len().min(16)]))
                .unwrap_or_default()
        ),
        (Some(task), None) => println!("{}@{}: task {task}", o.set, o.generation),
    }
    Ok(code)
}

fn tasks(store: &Store, a: TasksArgs) -> Result<i32> {
    if let Some(id) = &a.cancel {
        let t = strata::task::Tasks::new(store).cancel(id)?;
        println!("task {id} {} (attempt {})", t.state.label(), t.attempt);
        return Ok(0);
    }
    let tasks = strata::task::Tasks::new(store).list()?;
    if a.json {
        return print_json(&tasks);
    }
    let rows: Vec<Vec<String>> = tasks
        .iter()
        .map(|t| {
            vec![
                t.id.clone(),
                t.state.label().to_string(),
                t.attempt.to_string(),
                t.owner
                    .as_deref()
                    .map_or("-".into(), |o| o[..o.len().min(12)].to_string()),
                t.progress_rows.to_string(),
                t.last_error.clone().unwrap_or_else(|| "-".into()),
            ]
        })
        .collect();
    println!(
        "{}",
        render::table(
            &["TASK", "STATE", "ATTEMPT", "OWNER", "ROWS", "LAST ERROR"],
            &rows
        )
    );
    Ok(0)
}

fn tags(store: &Store, a: TagsArgs) -> Result<i32> {
    strata::store::check_set_name(&a.set)?;
    if !store.sets()?.contains(&a.set) {
        return Err(Error::NotFound {
            what: "set",
            name: a.set,
        });
    }
    let tags = strata::tag::list(store, &a.set)?;
    if a.json {
        return print_json(&tags);
    }
    let rows: Vec<Vec<String>> = tags
        .iter()
        .map(|t| {
            vec![
                t.name.clone(),
                t.generation.to_string(),
                render::time(t.created_ns),
            ]
        })
        .collect();
    println!("{}", render::table(&["TAG", "GEN", "CREATED (UTC)"], &rows));
    Ok(0)
}

fn pins(store: &Store, a: JsonArg) -> Result<i32> {
    let pins = strata::pin::list(store)?;
    if a.json {
        return print_json(&pins);
    }
    let rows: Vec<Vec<String>> = pins
        .iter()
        .map(|p| {
            let state = serde_json::to_value(p.state)
                .ok()
                .and_then(|v| v.as_str().map(str::to_string))
                .unwrap_or_default();
            vec![
                state,
                p.set.clone(),
                p.generation.to_string(),
                p.representation.clone(),
                render::time(p.since_ns),
                p.holder.clone(),
            ]
        })
        .collect();
    println!(
        "{}",
        render::table(
            &["STATE", "SET", "GEN", "REP", "SINCE (UTC)", "HOLDER"],
            &rows
        )
    );
    Ok(0)
}
