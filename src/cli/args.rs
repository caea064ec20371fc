//! The command line's definition (clap): every command, flag and argument
//! with the help text that `--help`, the man pages and the completions show.

use clap::{Args, Parser, Subcommand};
use std::ffi::OsString;
use std::path::PathBuf;
use std::time::Duration;
use strata::storage::StoreArgs;

#[derive(Parser)]
#[command(
    name = "strata",
    version,
    about = "Versioned, verifiable file-tree generations"
)]
pub(crate) struct Cli {
    #[command(flatten)]
    pub(crate) store: StoreArgs,
    #[command(subcommand)]
    pub(crate) cmd: Cmd,
}

#[derive(Subcommand)]
pub(crate) enum Cmd {
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
    /// Write a generation (or paths of it) into a directory with every
    /// stored attribute: owners, modes, ns mtimes, hard links, xattrs and
    /// ACLs, special files, holes. Verified as read; a rerun resumes
    Restore(RestoreArgs),
    /// Write a generation (or paths of it) to stdout as a POSIX tar stream
    /// (pax: ns mtimes, xattrs and ACLs, long names, hard links, sparse files)
    Export(ExportArgs),
    /// Replicate committed generations and their tags to another store
    /// (local or s3://, either direction), keeping numbers and identities;
    /// sends only what the target lacks
    Copy(CopyArgs),
    /// The generations in which a path changed, one line per distinct version
    History(HistoryArgs),
    /// Re-hash everything reachable; exit 1 listing each problem
    Verify(VerifyArgs),
    /// Walk a generation's ancestry down its parent bindings (exit 0
    /// complete or parent retired, 1 broken binding, 4 budget exceeded)
    Lineage(LineageArgs),
    /// Print a generation's manifest as JSON (--redacted: safe to hand out)
    Manifest(ManifestArgs),
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
    Retain(RetainArgs),
    /// Collect garbage: retire, reclaim residue, mark, condemn, delete after a grace
    Sweep(SweepArgs),
    /// List pins, staging owners and leases with a liveness verdict
    Leases(JsonArg),
    /// Sets, space by category, last sweep and the mount daemons' status
    Status(JsonArg),
    /// The mount daemons' metrics, in the Prometheus text format
    Metrics,
    /// Show or change the disk budget: free-space floor and store size limit
    Budget(BudgetArgs),
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
pub(crate) struct MountCmd {
    /// Serve only these sets (repeatable)
    #[arg(long)]
    pub(crate) set: Vec<String>,
    /// Stay in the foreground (for systemd and tests)
    #[arg(long)]
    pub(crate) foreground: bool,
    /// When standalone blobs are hashed in full before being served
    #[arg(long, value_name = "WHEN", default_value = "first-open",
          value_parser = ["first-open", "always", "off"])]
    pub(crate) verify: String,
    /// How files are opened: none (the kernel opens files itself and keeps
    /// their pages; fastest for many small files) or each (every open
    /// reaches the daemon; large files by kernel passthrough). --verify
    /// always implies each
    #[arg(long, value_name = "MODE", default_value = "none",
          value_parser = ["none", "each"])]
    pub(crate) opens: String,
    /// Serve each entry's stored owner instead of the mounting user
    #[arg(long)]
    pub(crate) preserve_owner: bool,
    /// Neither serve nor enforce POSIX ACLs (as ext4's noacl): access
    /// follows the mode bits, and `ls -l` of a cold tree costs no round
    /// trip per file
    #[arg(long)]
    pub(crate) no_acl: bool,
    /// Take every request through /dev/fuse. By default the daemon takes
    /// FUSE over io_uring where the kernel offers it (Linux 6.14+ with the
    /// fuse module's enable_uring set) and does not schedule sessions as
    /// groups (kernel.sched_autogroup_enabled=0)
    #[arg(long)]
    pub(crate) no_io_uring: bool,
    /// Budget of assembled copies of chunked files, served at native speed
    /// by passthrough (default 8G; 0: chunk reads only)
    #[arg(long, value_name = "SIZE", value_parser = strata::storage::parse_size)]
    pub(crate) assembled_size: Option<u64>,
    /// Do not fold deltas into new bases on the daemon's own initiative
    #[arg(long)]
    pub(crate) no_materialize: bool,
    /// Sweep the store on this schedule (0s: only on request; default 1h)
    #[arg(long, value_name = "D", value_parser = strata::storage::parse_duration)]
    pub(crate) sweep_every: Option<Duration>,
    /// Grace of scheduled sweeps (default 15m)
    #[arg(long, value_name = "D", value_parser = strata::storage::parse_duration)]
    pub(crate) sweep_grace: Option<Duration>,
    /// How often the daemon re-reads each set's latest (default 500ms; raise
    /// it on a remote store to save requests)
    #[arg(long, value_name = "D", value_parser = strata::storage::parse_duration)]
    pub(crate) poll: Option<Duration>,
    /// FUSE worker threads of the daemon (default 8)
    #[arg(long, value_name = "N", value_parser = clap::value_parser!(u16).range(1..=256))]
    pub(crate) threads: Option<u16>,
    /// An existing empty directory to mount the store on
    pub(crate) mountpoint: PathBuf,
}

#[derive(Args)]
pub(crate) struct UnmountCmd {
    /// Detach even if busy; open files are served until closed
    #[arg(long)]
    pub(crate) lazy: bool,
    /// Where the store is mounted
    pub(crate) mountpoint: PathBuf,
}

#[derive(Args)]
pub(crate) struct TagArgs {
    /// The set (one of `strata sets`)
    #[arg(long)]
    pub(crate) set: String,
    /// Generation number (default: latest)
    #[arg(long)]
    pub(crate) gen: Option<u64>,
    /// Tag name (letters, digits, `.`, `_`, `-`)
    pub(crate) name: String,
}

#[derive(Args)]
pub(crate) struct UntagArgs {
    /// The set (one of `strata sets`)
    #[arg(long)]
    pub(crate) set: String,
    /// Tag name
    pub(crate) name: String,
}

#[derive(Args)]
pub(crate) struct TagsArgs {
    /// The set (one of `strata sets`)
    #[arg(long)]
    pub(crate) set: String,
    /// Print JSON instead of a table
    #[arg(long)]
    pub(crate) json: bool,
}

#[derive(Args)]
pub(crate) struct MaterializeArgs {
    /// The set (one of `strata sets`)
    #[arg(long)]
    pub(crate) set: String,
    /// Generation to fold (default: latest)
    #[arg(long)]
    pub(crate) gen: Option<u64>,
    /// Wait up to DURATION (default and longest: 10m) for another worker's
    /// attempt or a retry delay instead of failing; running out exits 4
    #[arg(long, value_name = "DURATION", num_args = 0..=1, default_missing_value = "10m",
          require_equals = true, value_parser = strata::storage::parse_duration)]
    pub(crate) wait: Option<Duration>,
    /// Only plan the task (PLANNED), do not run it
    #[arg(long)]
    pub(crate) plan: bool,
    /// Run in this process even when a mount daemon of the store runs
    #[arg(long)]
    pub(crate) in_process: bool,
    /// Print JSON instead of a table
    #[arg(long)]
    pub(crate) json: bool,
}

#[derive(Args)]
pub(crate) struct TasksArgs {
    /// Cancel this task (refused while an attempt works on it)
    #[arg(long, value_name = "ID", conflicts_with_all = ["recover", "quarantine"])]
    pub(crate) cancel: Option<String>,
    /// Drive every task that is not final to a final state and compact
    /// final ones (what a mount daemon does periodically)
    #[arg(long, conflicts_with = "quarantine")]
    pub(crate) recover: bool,
    /// With --recover: only tasks of this set (repeatable)
    #[arg(long, requires = "recover")]
    pub(crate) set: Vec<String>,
    /// Move the records of a task whose newest record does not parse to
    /// tasks-quarantine/, after checking nothing it protects is at risk
    #[arg(long, value_name = "ID")]
    pub(crate) quarantine: Option<String>,
    /// Also list compacted (finished) tasks
    #[arg(long)]
    pub(crate) all: bool,
    /// Print JSON instead of a table
    #[arg(long)]
    pub(crate) json: bool,
}

#[derive(Args)]
pub(crate) struct JsonArg {
    /// Print JSON instead of a table
    #[arg(long)]
    pub(crate) json: bool,
}

#[derive(Args)]
pub(crate) struct CommitArgs {
    /// The set (one of `strata sets`)
    #[arg(long)]
    pub(crate) set: String,
    /// A message kept with the generation (shown by `strata log`)
    #[arg(long, short)]
    pub(crate) message: Option<String>,
    /// Observe only this subtree (repeatable); everything else is inherited
    #[arg(long, value_name = "P")]
    pub(crate) prefix: Vec<OsString>,
    /// Observe only the paths listed in FILE (newline- or NUL-separated)
    #[arg(long, value_name = "FILE")]
    pub(crate) paths_from: Option<PathBuf>,
    /// Write a full base instead of a delta
    #[arg(long)]
    pub(crate) base: bool,
    /// Wait for a concurrent commit to the same set instead of failing
    #[arg(long)]
    pub(crate) wait: bool,
    /// Record unreadable or vanishing paths as skipped instead of failing
    #[arg(long)]
    pub(crate) skip_unreadable: bool,
    /// Start fresh even if an interrupted commit of this set left a
    /// journal to resume from
    #[arg(long)]
    pub(crate) no_resume: bool,
    /// Memory for sorting observed rows before they spill to disk
    /// (default 64M; 0 is refused)
    #[arg(long, value_name = "SIZE", value_parser = strata::storage::parse_size)]
    pub(crate) sort_memory: Option<u64>,
    /// Sorted runs merged at once (default 16; under 2 is refused)
    #[arg(long, value_name = "N")]
    pub(crate) sort_fan_in: Option<usize>,
    /// Print JSON instead of a table
    #[arg(long)]
    pub(crate) json: bool,
    /// The directory to commit
    pub(crate) dir: PathBuf,
}

#[derive(Args)]
pub(crate) struct LogArgs {
    /// The set (one of `strata sets`)
    #[arg(long)]
    pub(crate) set: String,
    /// Include PREPARED (never committed) and RETIRED generations
    #[arg(long)]
    pub(crate) all: bool,
    /// Print JSON instead of a table
    #[arg(long)]
    pub(crate) json: bool,
}

#[derive(Args)]
pub(crate) struct LsArgs {
    /// The set (one of `strata sets`)
    #[arg(long)]
    pub(crate) set: String,
    /// Generation number (default: latest)
    #[arg(long)]
    pub(crate) gen: Option<u64>,
    /// Print JSON instead of a table
    #[arg(long)]
    pub(crate) json: bool,
    /// A path of the generation (default: its root)
    pub(crate) path: Option<OsString>,
}

#[derive(Args)]
pub(crate) struct CatArgs {
    /// The set (one of `strata sets`)
    #[arg(long)]
    pub(crate) set: String,
    /// Generation number (default: latest)
    #[arg(long)]
    pub(crate) gen: Option<u64>,
    /// A file of the generation
    pub(crate) path: OsString,
}

#[derive(Args)]
pub(crate) struct RestoreArgs {
    /// The set (one of `strata sets`)
    #[arg(long)]
    pub(crate) set: String,
    /// Generation number (default: latest)
    #[arg(long, conflicts_with = "tag")]
    pub(crate) gen: Option<u64>,
    /// Restore the generation this tag names
    #[arg(long)]
    pub(crate) tag: Option<String>,
    /// Restore only this path and what is below it (repeatable)
    #[arg(long)]
    pub(crate) path: Vec<OsString>,
    /// Write into a non-empty directory, replacing what differs (entries
    /// the generation does not have are left alone)
    #[arg(long)]
    pub(crate) overwrite: bool,
    /// Files written at once (default: 4 per core)
    #[arg(long, value_name = "N", value_parser = clap::value_parser!(u16).range(1..=256))]
    pub(crate) jobs: Option<u16>,
    /// Print the summary as JSON
    #[arg(long)]
    pub(crate) json: bool,
    /// Where to write (created if missing; must be empty unless --overwrite
    /// or resuming an interrupted restore of the same generation)
    pub(crate) dest: PathBuf,
}

#[derive(Args)]
pub(crate) struct CopyArgs {
    /// The target store: a directory or s3://bucket[/prefix] (created if
    /// missing; the --s3-* options apply to both stores)
    #[arg(long, value_name = "STORE")]
    pub(crate) to: String,
    /// Copy only this set (repeatable; default: every set)
    #[arg(long)]
    pub(crate) set: Vec<String>,
    /// Copy only this generation's content (repeatable; earlier ones the
    /// target lacks are recorded there as retired; default: all)
    #[arg(long)]
    pub(crate) gen: Vec<u64>,
    /// Print the summary as JSON
    #[arg(long)]
    pub(crate) json: bool,
}

#[derive(Args)]
pub(crate) struct ExportArgs {
    /// The set (one of `strata sets`)
    #[arg(long)]
    pub(crate) set: String,
    /// Generation number (default: latest)
    #[arg(long, conflicts_with = "tag")]
    pub(crate) gen: Option<u64>,
    /// Export the generation this tag names
    #[arg(long)]
    pub(crate) tag: Option<String>,
    /// Export only this path and what is below it (repeatable)
    #[arg(long)]
    pub(crate) path: Vec<OsString>,
}

#[derive(Args)]
pub(crate) struct DiffArgs {
    /// The set (one of `strata sets`)
    #[arg(long)]
    pub(crate) set: String,
    /// The older generation
    pub(crate) a: u64,
    /// The newer generation
    pub(crate) b: u64,
    /// Print JSON instead of a table
    #[arg(long)]
    pub(crate) json: bool,
}

#[derive(Args)]
pub(crate) struct VerifyArgs {
    /// Only this set
    #[arg(long)]
    pub(crate) set: Option<String>,
    /// Only this generation (default: the latest of each set)
    #[arg(long, conflicts_with = "all")]
    pub(crate) gen: Option<u64>,
    /// Every retained generation
    #[arg(long)]
    pub(crate) all: bool,
    /// Print JSON instead of a table
    #[arg(long)]
    pub(crate) json: bool,
}

#[derive(Args)]
pub(crate) struct LineageArgs {
    /// The set (one of `strata sets`)
    #[arg(long)]
    pub(crate) set: String,
    /// Start from this generation (default: latest)
    #[arg(long)]
    pub(crate) gen: Option<u64>,
    /// Examine at most K generations (at most 100000)
    #[arg(long, value_name = "K", default_value_t = strata::lineage::DEFAULT_BUDGET)]
    pub(crate) budget: u64,
    /// Print JSON instead of a table
    #[arg(long)]
    pub(crate) json: bool,
}

#[derive(Args)]
pub(crate) struct ManifestArgs {
    /// The set (one of `strata sets`)
    #[arg(long)]
    pub(crate) set: String,
    /// Generation number (default: latest)
    #[arg(long)]
    pub(crate) gen: Option<u64>,
    /// Only digests, counts, sizes, lineage and a coverage summary: no
    /// path, key, prefix, set name or message
    #[arg(long)]
    pub(crate) redacted: bool,
}

#[derive(Args)]
pub(crate) struct HistoryArgs {
    /// The set (one of `strata sets`)
    #[arg(long)]
    pub(crate) set: String,
    /// A path of the set (a file, symlink or directory)
    pub(crate) path: OsString,
    /// Print JSON instead of a table
    #[arg(long)]
    pub(crate) json: bool,
}

#[derive(Args)]
pub(crate) struct BudgetArgs {
    /// Keep this much free on the store's filesystem: bytes (10G) or a
    /// percent of the filesystem (2%); default 1%
    #[arg(long, value_name = "SIZE|PCT%")]
    pub(crate) min_free: Option<String>,
    /// Refuse work that would grow the store's objects past this size
    /// (e.g. 500G; `none` removes the limit)
    #[arg(long, value_name = "SIZE|none")]
    pub(crate) max_store: Option<String>,
    /// Print JSON instead of a table
    #[arg(long)]
    pub(crate) json: bool,
}

#[derive(Args)]
pub(crate) struct RetainArgs {
    /// The set (one of `strata sets`)
    #[arg(long)]
    pub(crate) set: String,
    /// Keep the newest N generations
    #[arg(long, value_name = "N")]
    pub(crate) keep_last: Option<u64>,
    /// Keep generations committed within this duration (90s, 15m, 12h, 7d, 2w)
    #[arg(long, value_name = "D", value_parser = strata::storage::parse_duration)]
    pub(crate) keep_within: Option<Duration>,
    /// Keep everything again (forget the policy's limits)
    #[arg(long, conflicts_with_all = ["keep_last", "keep_within"])]
    pub(crate) keep_all: bool,
    /// Show what the policy keeps and would retire; change nothing
    #[arg(long)]
    pub(crate) dry_run: bool,
    /// Print JSON instead of a table
    #[arg(long)]
    pub(crate) json: bool,
}

#[derive(Args)]
pub(crate) struct SweepArgs {
    /// Plan only: report what is reachable, condemned and deletable
    #[arg(long)]
    pub(crate) dry_run: bool,
    /// Delete only objects condemned at least this long ago (0s for tests)
    #[arg(long, value_name = "D", value_parser = strata::storage::parse_duration)]
    pub(crate) grace: Option<Duration>,
    /// Run in this process even when a mount daemon of the store runs
    #[arg(long)]
    pub(crate) in_process: bool,
    /// Recount pack live ratios from every reachable row, even when the
    /// previous sweep's still apply
    #[arg(long)]
    pub(crate) recount: bool,
    /// With --in-process: run in a session and scheduling group of its own
    /// at the lowest weight, as the mount daemon's sweeps do (the
    /// terminal's Ctrl-C no longer reaches it)
    #[arg(long, requires = "in_process")]
    pub(crate) background: bool,
    /// Memory for the sweep's marks, listings and condemned lists before
    /// they spill to disk (default 64M; 0 is refused); a sweep given a
    /// budget runs in this process
    #[arg(long, value_name = "SIZE", value_parser = strata::storage::parse_size)]
    pub(crate) sort_memory: Option<u64>,
    /// Sorted runs merged at once (default 16; under 2 is refused); a
    /// sweep given a fan-in runs in this process
    #[arg(long, value_name = "N")]
    pub(crate) sort_fan_in: Option<usize>,
    /// On an S3 store: abort incomplete multipart uploads begun at least
    /// this long ago (default 24h; a writer that died mid-upload left
    /// them); a sweep given an age runs in this process
    #[arg(long, value_name = "D", value_parser = strata::storage::parse_duration)]
    pub(crate) upload_age: Option<Duration>,
    /// For the mount daemon: serve sweeps until stdin closes, in the
    /// background as --background does; one JSON request per line in
    /// (`grace_ms`, `dry_run`, `recount`), one JSON answer per line out
    #[arg(long, hide = true, requires = "in_process",
        conflicts_with_all = ["dry_run", "grace", "recount", "json", "sort_memory", "sort_fan_in", "upload_age"])]
    pub(crate) serve: bool,
    /// Print JSON instead of a table
    #[arg(long)]
    pub(crate) json: bool,
}
