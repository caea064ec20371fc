//! The control socket: newline-delimited JSON requests and responses
//! (docs/CONTROL.md). Owns the listener, the per-connection handlers and the
//! peer check.
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
use serde::{Deserialize, Serialize};
use serde_json::{json, Value};
use std::io::{BufRead, BufReader, Read, Write};
use std::os::unix::fs::{DirBuilderExt, PermissionsExt};
use std::os::unix::io::AsRawFd;
use std::os::unix::net::{UnixListener, UnixStream};
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, OnceLock};
use std::time::{Duration, Instant};

/// Protocol version spoken by this daemon (docs/CONTROL.md).
pub(crate) const PROTOCOL_VERSION: u32 = 1;
/// Largest request line accepted.
pub(crate) const MAX_REQUEST_BYTES: u64 = 1 << 20;
/// Connections served at once; more are told `busy` and closed.
const MAX_CONNECTIONS: usize = 16;
/// A client that sends nothing for this long is disconnected.
const READ_TIMEOUT: Duration = Duration::from_secs(30);

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct Request {
    version: u32,
    command: String,
    /// `materialize`: the set, optional generation (latest) and whether to
    /// wait for a busy task instead of answering `conflict`.
    #[serde(default)]
    set: Option<String>,
    #[serde(default)]
    generation: Option<u64>,
    #[serde(default)]
    wait: bool,
    /// `sweep`: grace in milliseconds (default: the daemon's
    /// `--sweep-grace-s`), plan only, and recount pack live ratios.
    #[serde(default)]
    grace_ms: Option<u64>,
    #[serde(default)]
    dry_run: bool,
    #[serde(default)]
    recount: bool,
}

#[derive(Serialize)]
struct ErrorBody<'a> {
    kind: &'a str,
    message: String,
}

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
            let _ = reply_error(
                &mut &stream,
                "busy",
                "too many control connections; retry".into(),
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
        let _ = reply_error(
            &mut &*stream,
            "forbidden",
            "only the daemon's user or root may use this socket".into(),
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
            let _ = reply_error(
                &mut &*stream,
                "too-large",
                format!("request over {MAX_REQUEST_BYTES} bytes"),
            );
            return;
        }
        let response = catch_unwind(AssertUnwindSafe(|| answer(&line, ctx)))
            .unwrap_or_else(|_| error_value("internal", "handler panicked".into()));
        if write_line(&mut &*stream, &response).is_err() {
            return;
        }
    }
}

fn error_value(kind: &str, message: String) -> Value {
    json!({ "version": PROTOCOL_VERSION, "ok": false, "error": ErrorBody { kind, message } })
}

fn write_line(out: &mut impl Write, v: &Value) -> std::io::Result<()> {
    let mut bytes = serde_json::to_vec(v).map_err(std::io::Error::other)?;
    bytes.push(b'\n');
    out.write_all(&bytes)
}

fn reply_error(out: &mut impl Write, kind: &str, message: String) -> std::io::Result<()> {
    write_line(out, &error_value(kind, message))
}

/// Parse one request line and run it.
fn answer(line: &[u8], ctx: &Context) -> Value {
    let req: Request = match serde_json::from_slice(line) {
        Ok(r) => r,
        Err(e) => return error_value("invalid-request", format!("not a request: {e}")),
    };
    if req.version != PROTOCOL_VERSION {
        return error_value(
            "unsupported-version",
            format!(
                "protocol version {} is not supported; this daemon speaks {PROTOCOL_VERSION}",
                req.version
            ),
        );
    }
    let result = match req.command.as_str() {
        "status" => status(ctx),
        "sets" => Ok(json!(sets(ctx))),
        "pins" => pins(ctx),
        "refresh" => refresh(ctx),
        "unmount" => unmount(ctx),
        "materialize" => materialize(ctx, &req),
        "tasks" => tasks(ctx),
        "sweep" => sweep(ctx, &req),
        "metrics" => Ok(json!({ "text": crate::metrics::render(ctx, rss_bytes()) })),
        other => return error_value("unknown-command", format!("unknown command `{other}`")),
    };
    match result {
        Ok(v) => json!({ "version": PROTOCOL_VERSION, "ok": true, "result": v }),
        Err((kind, message)) => error_value(kind, message),
    }
}

type Answer = Result<Value, (&'static str, String)>;

fn served_sets(ctx: &Context) -> Vec<String> {
    let all = ctx.gens.store().sets().unwrap_or_default();
    all.into_iter()
        .filter(|s| ctx.only.is_empty() || ctx.only.contains(s))
        .collect()
}

pub(crate) fn sets(ctx: &Context) -> Vec<Value> {
    served_sets(ctx)
        .into_iter()
        .map(|s| {
            let latest = ctx.gens.latest(&s).ok().flatten().map(|g| g.generation);
            json!({ "set": s, "latest": latest })
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
    Ok(json!({
        "pid": std::process::id(),
        "mountpoint": ctx.mountpoint,
        "fuse_connection": ctx.connection.get(),
        "uptime_s": ctx.started.elapsed().as_secs(),
        "sets": sets(ctx),
        "pinned_generations": ctx.gens.pinned(),
        "inodes": ctx.stats.inodes.load(Ordering::Relaxed),
        "open_handles": ctx.stats.handles.load(Ordering::Relaxed),
        "verified_blobs": ctx.stats.verified.load(Ordering::Relaxed),
        "verify_failures": ctx.stats.verify_failures.load(Ordering::Relaxed),
        "lookups": ctx.stats.lookups.load(Ordering::Relaxed),
        "bare_entries": ctx.stats.bare_entries.load(Ordering::Relaxed),
        "dir_reads": ctx.stats.dir_reads.load(Ordering::Relaxed),
        "rss_bytes": rss_bytes(),
        "last_sweep": ctx.last_sweep.get(),
        "remote_requests": ctx.gens.store().storage().request_counts(),
    }))
}

fn pins(ctx: &Context) -> Answer {
    let mine = format!("pid={}", std::process::id());
    let all =
        strata::pin::list(ctx.gens.store()).map_err(|e| ("internal", strata::cli_chain(&e)))?;
    Ok(json!(all
        .into_iter()
        .filter(|p| p.holder.ends_with(&mine))
        .collect::<Vec<_>>()))
}

fn refresh(ctx: &Context) -> Answer {
    for s in served_sets(ctx) {
        ctx.gens
            .refresh(&s)
            .map_err(|e| ("internal", strata::cli_chain(&e)))?;
    }
    Ok(json!(sets(ctx)))
}

fn materialize(ctx: &Context, req: &Request) -> Answer {
    let set = req
        .set
        .as_deref()
        .ok_or(("invalid-request", "`materialize` needs `set`".to_string()))?;
    strata::store::check_set_name(set).map_err(|e| ("invalid-request", e.to_string()))?;
    let outcome = ctx
        .materializer
        .request(set, req.generation, req.wait)
        .map_err(|e| ("failed", e))?;
    Ok(json!(outcome))
}

fn sweep(ctx: &Context, req: &Request) -> Answer {
    let grace = req
        .grace_ms
        .map_or(ctx.last_sweep.grace, Duration::from_millis);
    let report = ctx
        .last_sweep
        .run(grace, req.dry_run, req.recount)
        .map_err(|e| ("failed", e))?;
    Ok(json!(report))
}

fn tasks(ctx: &Context) -> Answer {
    let all = strata::task::Tasks::new(ctx.gens.store())
        .list()
        .map_err(|e| ("internal", strata::cli_chain(&e)))?;
    Ok(json!(all))
}

fn unmount(ctx: &Context) -> Answer {
    match strata::mounttab::unmount(&ctx.mountpoint, false) {
        Ok(()) => Ok(json!({ "unmounted": true })),
        Err(e) if e.raw_os_error() == Some(libc::EBUSY) => {
            Err(("busy", "mount is busy; use `strata unmount --lazy`".into()))
        }
        Err(e) => Err(("internal", format!("umount: {e}"))),
    }
}
