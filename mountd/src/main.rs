//! strata-mountd: serves every generation of a store as a read-only FUSE
//! directory (see fs.rs for the layout).
//!
//! Lifecycle: mount, then serve until unmounted. SIGTERM/SIGINT detach the
//! mount lazily (`umount2(MNT_DETACH)`): open files keep working until their
//! last close, then the session ends, every pin is released, and the process
//! exits 0. A background refresher keeps each set's latest generation pinned
//! and current.

mod control;
mod error;
mod fs;
mod gen;
mod host_sched;
mod inode_reads;
mod inode_set;
mod listing_cache;
mod metrics;
mod node;
mod notify;
mod push_ahead;
mod read_ahead;
mod stat_habits;
mod sweeper;
mod synthetic_listing;
mod worker;

use clap::Parser;
use error::DaemonError;
use fuser::{Config, INodeNo, MountOption, Notifier, Session};
use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::atomic::Ordering;
use std::sync::{mpsc, Arc, OnceLock};
use std::time::Duration;
use strata::format::record::State;
use strata::index::GenIndex;
use strata::storage::StoreArgs;
use strata::store::Store;
use tracing::{error, info, warn};

#[derive(Parser)]
#[command(
    name = "strata-mountd",
    version,
    about = "Serve a strata store as a read-only FUSE directory"
)]
struct Args {
    #[command(flatten)]
    store: StoreArgs,
    /// Serve only these sets (repeatable); default: every set
    #[arg(long)]
    set: Vec<String>,
    /// FUSE worker threads; more than cores, so cold reads overlap their
    /// disk waits (docs/BENCHMARKS.md, issue 26)
    #[arg(long, default_value_t = 8)]
    threads: usize,
    /// When standalone blobs are hashed in full before being served
    #[arg(long, value_enum, default_value = "first-open")]
    verify: fs::VerifyMode,
    /// How files are opened: `none`, the kernel opens them itself and keeps
    /// their pages, reads reach the daemon by inode (no round trip per
    /// open; large files are read through the daemon); `each`, every open
    /// reaches the daemon and large local files are served by kernel
    /// passthrough. `--verify always` implies `each`.
    #[arg(long, value_enum, default_value = "none")]
    opens: fs::OpenMode,
    /// Budget of assembled copies of chunked files served by passthrough,
    /// e.g. 2G (0: serve chunked files by FUSE reads only)
    #[arg(long, value_parser = strata::storage::parse_size,
          default_value_t = strata::mount_tree::assembled::DEFAULT_BUDGET)]
    assembled_size: u64,
    /// Serve each entry's stored owner instead of the mounting user
    #[arg(long)]
    preserve_owner: bool,
    /// Neither serve nor enforce POSIX ACLs, as ext4's `noacl`: access
    /// follows the mode bits, their attributes are not listed and asking
    /// for one is ENOTSUP, so `ls -l` stops asking after the first file
    /// (a cold `ls -lR` then costs no round trip per file; docs/BENCHMARKS.md)
    #[arg(long)]
    no_acl: bool,
    /// Take every request through `/dev/fuse`. By default the daemon takes
    /// FUSE over io_uring when the kernel offers it (Linux 6.14+ with the
    /// `fuse` module's `enable_uring` set) and does not schedule sessions
    /// as groups: each request is then answered on the CPU that asked
    /// (docs/OPERATIONS.md)
    #[arg(long)]
    no_io_uring: bool,
    /// Do not fold deltas into new bases on the daemon's own initiative
    #[arg(long)]
    no_materialize: bool,
    /// Materialize when a delta has at least this fraction of its base's rows
    #[arg(long, default_value_t = 0.5)]
    materialize_ratio: f64,
    /// ... and at least this many rows
    #[arg(long, default_value_t = 10_000)]
    materialize_min_rows: u64,
    /// Or materialize when a delta's segments take at least this many bytes
    #[arg(long, default_value_t = 256 << 20)]
    materialize_delta_bytes: u64,
    /// Or when the base under a delta is older than this many seconds (0: never)
    #[arg(long, default_value_t = 0)]
    materialize_max_age_s: u64,
    /// How often each set's latest generation is re-read, milliseconds
    /// (raise it for a remote store to save requests)
    #[arg(long, default_value_t = 500)]
    poll_ms: u64,
    /// Run the task recovery scanner (every task of every set to a final
    /// state, final ones compacted) at start and every this many seconds
    #[arg(long, default_value_t = 60, value_parser = clap::value_parser!(u64).range(1..))]
    task_scan_s: u64,
    /// Sweep the store every this many seconds (0: only on request)
    #[arg(long, default_value_t = 3600)]
    sweep_every_s: u64,
    /// Grace of scheduled sweeps, seconds
    #[arg(long, default_value_t = strata::sweep::DEFAULT_GRACE.as_secs())]
    sweep_grace_s: u64,
    /// Give back the memory of caches after this many milliseconds without
    /// a FUSE request
    #[arg(long, default_value_t = 30_000, value_parser = clap::value_parser!(u64).range(1..))]
    idle_shed_ms: u64,
    mountpoint: PathBuf,
}

/// How often the latest generation of every set is re-read and pinned.
/// Every how many refreshes held generations are checked against the index.
const HELD_CHECK_EVERY: u64 = 4;
/// How long shutdown waits for an active materialization.
const SHUTDOWN_DEADLINE: Duration = Duration::from_secs(10);

fn main() {
    tune_malloc();
    let args = Args::parse();
    init_logging();
    match run(args) {
        Ok(()) => {}
        Err(e) => {
            error!("{}", error::chain(&e));
            std::process::exit(1);
        }
    }
}

/// Keep glibc's allocator to two arenas. Every FUSE thread otherwise gets
/// its own, and row groups decoded on one thread and freed on another
/// leave each arena holding tens of MiB: after repeated cold walks of a
/// 1M-entry generation the daemon's RSS grew to 234 MiB with the default
/// (six arenas) and stays near 160 MiB with two, at the same walk times.
///
/// And fix the size from which allocations are mapped on their own
/// ([`MMAP_THRESHOLD`]): glibc otherwise raises it to the size of every
/// mapped block freed, so after the first cached segment (about 4 MiB)
/// is dropped, every later one is carved from an arena, where what is
/// freed stays held. With it fixed, a dropped segment goes back to the
/// system at once. After a `grep -r` and 8 parallel greps of a 1M-entry
/// generation: 115-122 MiB before, 89-107 MiB with this alone, 53-61 MiB
/// with the smaller caches of `compose::representation` as well.
fn tune_malloc() {
    // SAFETY: mallopt only tunes the allocator; called before any thread
    // starts.
    unsafe {
        libc::mallopt(libc::M_ARENA_MAX, 2);
        libc::mallopt(libc::M_MMAP_THRESHOLD, MMAP_THRESHOLD);
    }
}

/// Blocks at least this large are mapped on their own: cached segments
/// are; read replies (at most 1 MiB) stay in the arenas and are reused.
const MMAP_THRESHOLD: i32 = 2 << 20;

/// Log to stderr (the log file when daemonized) at `RUST_LOG`'s levels,
/// `info` by default.
fn init_logging() {
    use std::io::IsTerminal;
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info"));
    tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .with_ansi(std::io::stderr().is_terminal())
        .init();
}

fn run(args: Args) -> Result<(), DaemonError> {
    block_stop_signals();
    let location = args.store.location().map_err(DaemonError::Store)?;
    let root = location.local_dir().to_path_buf();
    let storage = location.open().map_err(DaemonError::Store)?;
    let store = Store::open(storage)
        .and_then(|s| Ok(s.with_failpoints(failpoints()?)))
        .map_err(DaemonError::Store)?;
    for s in &args.set {
        strata::store::check_set_name(s).map_err(|source| DaemonError::SetName {
            set: s.clone(),
            source,
        })?;
    }
    let bad_mountpoint = |source| DaemonError::MountPoint {
        path: args.mountpoint.clone(),
        source,
    };
    let mountpoint = strata::mounttab::resolve(&args.mountpoint).map_err(bad_mountpoint)?;
    if let Some(r) = strata::mounttab::prepare(&mountpoint).map_err(bad_mountpoint)? {
        warn!(
            "recovered a stale mount at {} (its daemon is gone; connection aborted: {})",
            mountpoint.display(),
            r.aborted
        );
    }
    let gens = Arc::new(gen::Gens::new(store, gen::LATEST_FRESH));
    let stats = Arc::new(fs::Stats::default());
    let notifier = Arc::new(OnceLock::new());
    let assembled = match args.assembled_size {
        0 => None,
        budget => Some(
            strata::mount_tree::assembled::Assembled::open(&root, budget)
                .map_err(DaemonError::Store)?,
        ),
    };
    let fs = fs::StrataFs::new(
        gens.clone(),
        args.set.clone(),
        stats.clone(),
        fs::Serving {
            verify: args.verify,
            opens: args.opens,
            preserve_owner: args.preserve_owner,
            acls: !args.no_acl,
        },
        notifier.clone(),
        assembled,
    );
    let mut config = Config::default();
    config.mount_options = vec![
        MountOption::RO,
        MountOption::FSName(format!("strata:{}", root.display())),
        MountOption::Subtype("strata".into()),
        MountOption::DefaultPermissions,
    ];
    config.n_threads = Some(args.threads.max(1));
    config.clone_fd = true;
    config.io_uring = host_sched::take_uring(Path::new("/proc"), args.no_io_uring);
    let policy = worker::Policy {
        enabled: !args.no_materialize,
        ratio: args.materialize_ratio,
        min_rows: args.materialize_min_rows,
        max_bytes: args.materialize_delta_bytes,
        max_age: (args.materialize_max_age_s > 0)
            .then(|| Duration::from_secs(args.materialize_max_age_s)),
    };
    let materializer = Arc::new(
        worker::Materializer::start(gens.store().clone(), policy).map_err(|source| {
            DaemonError::Thread {
                what: "materialization",
                source,
            }
        })?,
    );
    let last_sweep = Arc::new(sweeper::LastSweep::new(
        Duration::from_secs(args.sweep_grace_s),
        args.store.to_args(),
    ));
    let ctx = control::Context::new(
        gens.clone(),
        stats.clone(),
        args.set.clone(),
        mountpoint.clone(),
        materializer.clone(),
        last_sweep.clone(),
    );
    let connection = ctx.connection.clone();
    // The socket is bound before the mount is made, so no mount of this
    // daemon ever exists without a daemon that answers for it: that is how
    // `strata::mounttab` tells a served mount from a stale one.
    let socket = control::start(&root, ctx).map_err(|source| DaemonError::ControlSocket {
        store: root.clone(),
        source,
    })?;
    info!("control socket {}", socket.display());
    let session = match Session::new(fs, &mountpoint, &config) {
        Ok(s) => s,
        Err(e) => {
            let _ = std::fs::remove_file(&socket);
            materializer.shutdown(SHUTDOWN_DEADLINE);
            return Err(DaemonError::Mount {
                path: mountpoint,
                hint: mount_hint(&e),
                source: e,
            });
        }
    };
    let _ = notifier.set(session.notifier());
    if let Ok(Some(m)) = strata::mounttab::find(&mountpoint) {
        let _ = connection.set(m.minor);
    }
    spawn_signal_waiter(mountpoint.clone(), materializer.clone());
    let (stop, refresher) = spawn_refresher(
        gens.clone(),
        Idle::new(stats.clone(), Duration::from_millis(args.idle_shed_ms)),
        args.set,
        session.notifier(),
        materializer.clone(),
        Duration::from_millis(args.poll_ms.max(10)),
        Duration::from_secs(args.task_scan_s),
    );
    let sweeps = (args.sweep_every_s > 0)
        .then(|| sweeper::spawn(last_sweep, Duration::from_secs(args.sweep_every_s)))
        .transpose()
        .map_err(|source| DaemonError::Thread {
            what: "sweep",
            source,
        })?;
    info!("serving {} at {}", root.display(), mountpoint.display());
    if let Some(advice) = host_sched::halt_polling_advice(Path::new("/sys")) {
        info!("{advice}");
    }
    if let Some(advice) =
        host_sched::autogroup_advice(Path::new("/sys"), Path::new("/proc"), args.no_io_uring)
    {
        info!("{advice}");
    }
    notify::notify(&format!("READY=1\nMAINPID={}", std::process::id()));
    let served = session_ended(session.run());
    let _ = std::fs::remove_file(&socket);
    drop(stop);
    let _ = refresher.join();
    if let Some((stop, handle)) = sweeps {
        drop(stop);
        // A sweep in progress runs in a child process and finishes on its
        // own; the daemon does not wait for it past the deadline (a sweep
        // is safe to stop at every step).
        let deadline = std::time::Instant::now() + SHUTDOWN_DEADLINE;
        while !handle.is_finished() && std::time::Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(20));
        }
        if handle.is_finished() {
            let _ = handle.join();
        }
    }
    materializer.shutdown(SHUTDOWN_DEADLINE);
    gens.release();
    served?;
    info!("unmounted; pins released");
    Ok(())
}

/// Durability-step failpoints from `STRATA_FAILPOINTS` (tests only; see
/// `strata::failpoint`), as the CLI reads them.
fn failpoints() -> strata::Result<strata::failpoint::FailPoints> {
    match std::env::var("STRATA_FAILPOINTS") {
        Ok(spec) => strata::failpoint::FailPoints::parse(&spec),
        Err(_) => Ok(strata::failpoint::FailPoints::none()),
    }
}

fn stop_signals() -> libc::sigset_t {
    // SAFETY: sigset_t is plain data initialised by sigemptyset before use.
    unsafe {
        let mut set: libc::sigset_t = std::mem::zeroed();
        libc::sigemptyset(&mut set);
        libc::sigaddset(&mut set, libc::SIGTERM);
        libc::sigaddset(&mut set, libc::SIGINT);
        set
    }
}

/// Block SIGTERM/SIGINT in every thread; one thread receives them with sigwait.
fn block_stop_signals() {
    let set = stop_signals();
    // SAFETY: the set is initialised; called before any other thread starts.
    unsafe { libc::pthread_sigmask(libc::SIG_BLOCK, &set, std::ptr::null_mut()) };
}

fn spawn_signal_waiter(mountpoint: PathBuf, materializer: Arc<worker::Materializer>) {
    std::thread::spawn(move || {
        let set = stop_signals();
        let mut sig = 0;
        // SAFETY: waiting on an initialised set of signals blocked in this thread.
        unsafe { libc::sigwait(&set, &mut sig) };
        info!("signal {sig}: detaching; open files are served until closed");
        materializer.cancel();
        notify::notify("STOPPING=1");
        detach(&mountpoint);
    });
}

/// The session's result once the kernel is done with the mount. When the
/// last user of a detached mount goes, the kernel tears the connection down
/// and a worker reading `/dev/fuse` may see ECONNABORTED instead of ENODEV;
/// either way the mount is gone and the daemon ends normally.
fn session_ended(result: std::io::Result<()>) -> Result<(), DaemonError> {
    match result {
        Ok(()) => Ok(()),
        Err(e) if e.raw_os_error() == Some(libc::ECONNABORTED) => {
            info!("the kernel closed the FUSE connection");
            Ok(())
        }
        Err(e) => Err(DaemonError::Session(e)),
    }
}

/// Why a user's mount may have failed: the kernel's `/dev/fuse` must be
/// open to them (Debian's udev rule makes it 0666; some containers leave
/// it 0600), and `fusermount3` (Debian's fuse3) must be installed.
fn mount_hint(e: &std::io::Error) -> String {
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } == 0 {
        return String::new();
    }
    match e.kind() {
        std::io::ErrorKind::PermissionDenied => {
            "; a user's mount needs /dev/fuse readable and writable by them (mode 0666)".into()
        }
        std::io::ErrorKind::NotFound => "; a user's mount needs fusermount3 (Debian: fuse3)".into(),
        _ => String::new(),
    }
}

/// Lazily detach the mount: new lookups fail, open files keep working.
fn detach(mountpoint: &Path) {
    if let Err(e) = strata::mounttab::unmount(mountpoint, true) {
        error!("detach {}: {e}", mountpoint.display());
    }
}

/// Tell the kernel what changed about a set's latest: a new generation
/// moves the `latest` symlink and changes the generation list (its kept
/// listing is checked again at its next reading); a new representation of
/// the same generation (materialized) drops the cached `gens/<N>` entry, so
/// new path walks look it up again and get the new view (users of the old
/// one keep it).
fn announce(notifier: &Notifier, set: &str, prev: &(u64, String), now: &(u64, String)) {
    if prev.0 != now.0 {
        // The list first: whoever sees the new `latest` finds it listed.
        for n in [node::Node::Gens(set.into()), node::Node::Latest(set.into())] {
            let _ = notifier.inval_inode(INodeNo(node::ino_of(&n)), 0, 0);
        }
    } else if prev.1 != now.1 {
        let gens = node::ino_of(&node::Node::Gens(set.to_string()));
        let name = now.0.to_string();
        let _ = notifier.inval_entry(INodeNo(gens), std::ffi::OsStr::new(&name));
    }
}

/// Follow the index for every generation this daemon holds. One that got a
/// new representation (a materialization of a generation that is not
/// latest) is forgotten, so new users open the new view, and its cached
/// `gens/<N>` entry is dropped so new path walks reach it; current users
/// keep theirs. One that retention retired has its cached entry and the
/// kept generation list dropped, so it leaves `gens/`, the kernel forgets
/// its inodes once no cwd or open file uses them and its pin is released
/// (a sweep may then reclaim it).
fn follow_held(gens: &gen::Gens, notifier: &Notifier) {
    for (set, g, manifest) in gens.held_views() {
        let Ok(Some(r)) = GenIndex::new(gens.store(), &set).newest(g) else {
            continue;
        };
        let moved =
            r.state == State::Committed && r.read_rep().is_some_and(|rep| rep.manifest != manifest);
        if moved {
            gens.forget_view(&set, g);
        }
        if moved || r.state == State::Retired {
            let dir = node::ino_of(&node::Node::Gens(set.clone()));
            let _ = notifier.inval_entry(INodeNo(dir), std::ffi::OsStr::new(&g.to_string()));
            let _ = notifier.inval_inode(INodeNo(dir), 0, 0);
        }
    }
}

/// Re-read and pin each set's latest generation every `every`
/// until the returned sender is dropped; join the handle to release it.
/// After `after` without a FUSE request (`--idle-shed-ms`, 30 s) the
/// daemon gives back the memory of its caches: the served views' segments
/// and row groups, then whatever the allocator holds free (`malloc_trim`).
/// Readers load what they need again.
struct Idle {
    stats: Arc<fs::Stats>,
    after: Duration,
    seen: u64,
    since: std::time::Instant,
    shed: bool,
}

impl Idle {
    fn new(stats: Arc<fs::Stats>, after: Duration) -> Idle {
        Idle {
            stats,
            after,
            seen: 0,
            since: std::time::Instant::now(),
            shed: false,
        }
    }

    /// Shed once per stretch of `after` in which the request count stood
    /// still.
    fn shed_when_idle(&mut self, gens: &gen::Gens) {
        let requests = self.stats.requests.load(Ordering::Relaxed);
        if requests != self.seen {
            (self.seen, self.since, self.shed) = (requests, std::time::Instant::now(), false);
            return;
        }
        if self.shed || self.since.elapsed() < self.after {
            return;
        }
        gens.shed();
        // SAFETY: malloc_trim only returns free memory to the system.
        unsafe { libc::malloc_trim(0) };
        self.shed = true;
        info!("idle for {} ms: caches shed", self.after.as_millis());
    }
}

/// When a set's latest moves, the kernel's cached `latest` symlink is
/// invalidated (symlink targets are cached, so reads through `latest` do not
/// pay a readlink round trip per path resolution). Each latest generation is
/// offered to the materialization policy. A task recovery scan is queued
/// at start and every `scan_every`.
fn spawn_refresher(
    gens: Arc<gen::Gens>,
    mut idle: Idle,
    only: Vec<String>,
    notifier: Notifier,
    materializer: Arc<worker::Materializer>,
    every: Duration,
    scan_every: Duration,
) -> (mpsc::Sender<()>, std::thread::JoinHandle<()>) {
    let (stop, stopped) = mpsc::channel::<()>();
    let handle = std::thread::spawn(move || {
        // Per set: the latest generation and the manifest it reads.
        let mut seen: HashMap<String, (u64, String)> = HashMap::new();
        let mut cycle = 0u64;
        let mut scanned: Option<std::time::Instant> = None;
        loop {
            if scanned.is_none_or(|at| at.elapsed() >= scan_every) {
                materializer.scan();
                scanned = Some(std::time::Instant::now());
            }
            let sets = if only.is_empty() {
                gens.store().sets().unwrap_or_default()
            } else {
                only.clone()
            };
            for s in &sets {
                match gens.refresh(s) {
                    Ok(Some(g)) => {
                        materializer.consider(&g);
                        let now = (g.generation, g.view.top().manifest_name.clone());
                        if let Some(prev) = seen.insert(s.clone(), now.clone()) {
                            announce(&notifier, s, &prev, &now);
                        }
                    }
                    Ok(None) => {}
                    Err(e) => error!("refresh latest of {s}: {}", strata::cli_chain(&e)),
                }
            }
            gen::keep_pins(&gens);
            idle.shed_when_idle(&gens);
            cycle += 1;
            if cycle % HELD_CHECK_EVERY == 0 {
                follow_held(&gens, &notifier);
            }
            if stopped.recv_timeout(every) != Err(mpsc::RecvTimeoutError::Timeout) {
                return;
            }
        }
    });
    (stop, handle)
}
