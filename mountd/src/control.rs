//! The control socket: newline-delimited JSON requests and responses
//! (docs/CONTROL.md; the types are `strata::control::protocol`). Owns the
//! listener, the per-connection handlers and the peer check; a request is
//! parsed into a `Command` and dispatched with a `match`.
//!
//! Each connection has its own thread with a read timeout, so a slow or
//! malformed client only ever blocks itself; at most [`MAX_CONNECTIONS`] are
//! served at once. A request over [`MAX_REQUEST_BYTES`], malformed JSON, an
//! unknown command or a newer protocol version gets a JSON error; nothing a
//! client sends can panic the loop (handlers run under `catch_unwind`).

use crate::fs::Stats;
use crate::gen::Gens;
use crate::sweeper::LastSweep;
use crate::worker::Materializer;
use serde::Serialize;
use serde_json::Value;
use std::io::{BufRead, BufReader, Read, Write};
use std::os::unix::fs::{DirBuilderExt, PermissionsExt};
use std::os::unix::io::AsRawFd;
use std::os::unix::net::{UnixListener, UnixStream};
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, OnceLock};
use std::time::{Duration, Instant};
use strata::control::protocol::{
    Command, ErrorKind, Failure, MetricsText, Response, SetLatest, Status, Unmounted,
    MAX_REQUEST_BYTES,
};
use strata::materialize::MAX_WAIT;
/// Connections served at once; more are told `busy` and closed.
const MAX_CONNECTIONS: usize = 16;
/// A client that sends nothing for this long is disconnected.
const READ_TIMEOUT: Duration = Duration::from_secs(30);

/// What the handlers need to answer.
pub(crate) struct Context {
    pub(crate) gens: Arc<Gens>,
    pub(crate) stats: Arc<Stats>,
    pub(crate) only: Vec<String>,
    pub(crate) mountpoint: PathBuf,
    /// The FUSE connection number of the mount (its device minor), by which
    /// a client tells a served mount from a stale one (strata::mounttab);
    /// set once the mount is made (the socket is bound before).
    pub(crate) connection: Arc<OnceLock<u32>>,
    pub(crate) started: Instant,
    pub(crate) materializer: Arc<Materializer>,
    pub(crate) last_sweep: Arc<LastSweep>,
    active: AtomicUsize,
}

/// Socket path of this daemon inside `store/run/`.
pub(crate) fn socket_path(store: &Path) -> PathBuf {
    store
        .join("run")
        .join(format!("mountd-{}.sock", std::process::id()))
}

/// Bind the socket (0600 in a 0700 directory) and serve it on a thread.
pub(crate) fn start(store: &Path, ctx: Context) -> std::io::Result<PathBuf> {
    let dir = store.join("run");
    std::fs::DirBuilder::new()
        .recursive(true)
        .mode(0o700)
        .create(&dir)?;
    std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o700))?;
    let path = socket_path(store);
    let _ = std::fs::remove_file(&path);
    let listener = UnixListener::bind(&path)?;
    std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o600))?;
    let ctx = Arc::new(Context {
        active: AtomicUsize::new(0),
        ..ctx
    });
    std::thread::Builder::new()
        .name("control".into())
        .spawn(move || accept_loop(listener, ctx))?;
    Ok(path)
}

impl Context {
    pub(crate) fn new(
        gens: Arc<Gens>,
        stats: Arc<Stats>,
        only: Vec<String>,
        mountpoint: PathBuf,
        materializer: Arc<Materializer>,
        last_sweep: Arc<LastSweep>,
    ) -> Context {
        Context {
            gens,
            stats,
            only,
            mountpoint,
            connection: Arc::default(),
            started: Instant::now(),
            materializer,
            last_sweep,
            active: AtomicUsize::new(0),
        }
    }
}

fn accept_loop(listener: UnixListener, ctx: Arc<Context>) {
    for conn in listener.incoming() {
        let Ok(stream) = conn else { continue };
        if ctx.active.fetch_add(1, Ordering::SeqCst) >= MAX_CONNECTIONS {
            ctx.active.fetch_sub(1, Ordering::SeqCst);
            let _ = reply(
                &mut &stream,
                &Response::error(ErrorKind::Busy, "too many control connections; retry"),
            );
            continue;
        }
        let ctx = ctx.clone();
        let spawned = std::thread::Builder::new()
            .name("control-conn".into())
            .spawn(move || {
                let _ = catch_unwind(AssertUnwindSafe(|| serve(&stream, &ctx)));
                ctx.active.fetch_sub(1, Ordering::SeqCst);
            });
        if spawned.is_err() {
            tracing::error!("control: cannot spawn a connection thread");
        }
    }
}

/// Uid of the connected peer (SO_PEERCRED).
fn peer_uid(stream: &UnixStream) -> Option<u32> {
    let mut cred = libc::ucred {
        pid: 0,
        uid: 0,
        gid: 0,
    };
    let mut len = std::mem::size_of::<libc::ucred>() as libc::socklen_t;
    // SAFETY: getsockopt writes at most `len` bytes into `cred`.
    let rc = unsafe {
        libc::getsockopt(
            stream.as_raw_fd(),
            libc::SOL_SOCKET,
            libc::SO_PEERCRED,
            &mut cred as *mut _ as *mut libc::c_void,
            &mut len,
        )
    };
    (rc == 0).then_some(cred.uid)
}

fn serve(stream: &UnixStream, ctx: &Context) {
    // SAFETY: geteuid has no preconditions.
    let me = unsafe { libc::geteuid() };
    if !matches!(peer_uid(stream), Some(uid) if uid == me || uid == 0) {
        let _ = reply(
            &mut &*stream,
            &Response::error(
                ErrorKind::Forbidden,
                "only the daemon's user or root may use this socket",
            ),
        );
        return;
    }
    let _ = stream.set_read_timeout(Some(READ_TIMEOUT));
    let mut reader = BufReader::new(stream);
    loop {
        let mut line = Vec::new();
        let n = match reader
            .by_ref()
            .take(MAX_REQUEST_BYTES + 1)
            .read_until(b'\n', &mut line)
        {
            Ok(n) => n,
            Err(_) => return,
        };
        let complete = line.last() == Some(&b'\n');
        if n == 0 || (!complete && line.len() as u64 <= MAX_REQUEST_BYTES) {
            return;
        }
        if line.len() as u64 > MAX_REQUEST_BYTES {
            let _ = reply(
                &mut &*stream,
                &Response::error(
                    ErrorKind::TooLarge,
                    format!("request over {MAX_REQUEST_BYTES} bytes"),
                ),
            );
            return;
        }
        let response = catch_unwind(AssertUnwindSafe(|| answer(&line, ctx)))
            .unwrap_or_else(|_| Response::error(ErrorKind::Internal, "handler panicked"));
        if reply(&mut &*stream, &response).is_err() {
            return;
        }
    }
}

fn reply(out: &mut impl Write, response: &Response) -> std::io::Result<()> {
    let mut line = response.to_line();
    line.push('\n');
    out.write_all(line.as_bytes())
}

/// Parse one request line and run it.
fn answer(line: &[u8], ctx: &Context) -> Response {
    let command = match Command::parse(line) {
        Ok(c) => c,
        Err(e) => return Response::Err(e.into()),
    };
    let result = match command {
        Command::Status => status(ctx),
        Command::Sets => to_value(sets(ctx)),
        Command::Pins => pins(ctx),
        Command::Refresh => refresh(ctx),
        Command::Unmount => unmount(ctx),
        Command::Materialize {
            set,
            generation,
            wait,
            wait_ms,
        } => {
            let bound = wait.then(|| wait_ms.map_or(MAX_WAIT, Duration::from_millis));
            materialize(ctx, &set, generation, bound)
        }
        Command::Tasks => tasks(ctx),
        Command::Metrics => to_value(MetricsText {
            text: crate::metrics::render(ctx, rss_bytes()),
        }),
        Command::Sweep {
            grace_ms,
            dry_run,
            recount,
        } => sweep(ctx, grace_ms, dry_run, recount),
    };
    match result {
        Ok(v) => Response::Ok(v),
        Err(f) => Response::Err(f),
    }
}

type Answer = Result<Value, Failure>;

/// A result as the response's JSON.
fn to_value(result: impl Serialize) -> Answer {
    serde_json::to_value(result).map_err(|e| Failure::new(ErrorKind::Internal, e.to_string()))
}

fn internal(e: &strata::Error) -> Failure {
    Failure::new(ErrorKind::Internal, strata::cli_chain(e))
}

fn served_sets(ctx: &Context) -> Vec<String> {
    let all = ctx.gens.store().sets().unwrap_or_default();
    all.into_iter()
        .filter(|s| ctx.only.is_empty() || ctx.only.contains(s))
        .collect()
}

pub(crate) fn sets(ctx: &Context) -> Vec<SetLatest> {
    served_sets(ctx)
        .into_iter()
        .map(|set| {
            let latest = ctx.gens.latest(&set).ok().flatten().map(|g| g.generation);
            SetLatest { latest, set }
        })
        .collect()
}

fn rss_bytes() -> u64 {
    let statm = std::fs::read_to_string("/proc/self/statm").unwrap_or_default();
    let pages: u64 = statm
        .split_whitespace()
        .nth(1)
        .and_then(|v| v.parse().ok())
        .unwrap_or(0);
    // SAFETY: sysconf has no preconditions.
    pages * unsafe { libc::sysconf(libc::_SC_PAGESIZE) } as u64
}

fn status(ctx: &Context) -> Answer {
    let load = |v: &std::sync::atomic::AtomicU64| v.load(Ordering::Relaxed);
    let remote = ctx.gens.store().storage().request_counts();
    to_value(Status {
        bare_entries: load(&ctx.stats.bare_entries),
        dir_reads: load(&ctx.stats.dir_reads),
        fuse_connection: ctx.connection.get().copied(),
        inodes: load(&ctx.stats.inodes),
        last_sweep: ctx.last_sweep.get(),
        lookups: load(&ctx.stats.lookups),
        mountpoint: ctx.mountpoint.clone(),
        open_handles: load(&ctx.stats.handles),
        pid: std::process::id(),
        pinned_generations: ctx.gens.pinned() as u64,
        pushed_files: load(&ctx.stats.pushed_files),
        remote_requests: remote.map(|c| c.into_iter().map(|(k, n)| (k.to_string(), n)).collect()),
        rss_bytes: rss_bytes(),
        sets: sets(ctx),
        spliced_reads: load(&ctx.stats.spliced_reads),
        uptime_s: ctx.started.elapsed().as_secs(),
        verified_blobs: load(&ctx.stats.verify.verified),
        verify_failures: load(&ctx.stats.verify.failures),
    })
}

fn pins(ctx: &Context) -> Answer {
    let mine = format!("pid={}", std::process::id());
    let all = strata::pin::list(ctx.gens.store()).map_err(|e| internal(&e))?;
    to_value(
        all.into_iter()
            .filter(|p| p.holder.ends_with(&mine))
            .collect::<Vec<_>>(),
    )
}

fn refresh(ctx: &Context) -> Answer {
    for s in served_sets(ctx) {
        ctx.gens.refresh(&s).map_err(|e| internal(&e))?;
    }
    to_value(sets(ctx))
}

/// `set` is a valid set name (checked by the parser).
fn materialize(
    ctx: &Context,
    set: &str,
    generation: Option<u64>,
    wait: Option<Duration>,
) -> Answer {
    let outcome = ctx
        .materializer
        .materialize(set, generation, wait)
        .map_err(|e| Failure::new(ErrorKind::Failed, crate::error::chain(&e)))?;
    to_value(outcome)
}

fn sweep(ctx: &Context, grace_ms: Option<u64>, dry_run: bool, recount: bool) -> Answer {
    let grace = grace_ms.map_or(ctx.last_sweep.grace, Duration::from_millis);
    let report = ctx
        .last_sweep
        .run(grace, dry_run, recount)
        .map_err(|e| Failure::new(ErrorKind::Failed, e.to_string()))?;
    to_value(report)
}

fn tasks(ctx: &Context) -> Answer {
    let all = strata::task::Tasks::new(ctx.gens.store())
        .list()
        .map_err(|e| internal(&e))?;
    to_value(all.tasks)
}

fn unmount(ctx: &Context) -> Answer {
    match strata::mounttab::unmount(&ctx.mountpoint, false) {
        Ok(()) => to_value(Unmounted { unmounted: true }),
        Err(e) if e.raw_os_error() == Some(libc::EBUSY) => Err(Failure::new(
            ErrorKind::Busy,
            "mount is busy; use `strata unmount --lazy`",
        )),
        Err(e) => Err(Failure::new(ErrorKind::Internal, format!("umount: {e}"))),
    }
}
