//! `strata mount` / `strata unmount`: start the mount daemon and wait until
//! the mount is ready; unmount cleanly, reporting who keeps a busy mount.

use super::args::MountCmd;
use std::fs::OpenOptions;
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt};
use std::os::unix::process::CommandExt;
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};
use strata::error::{Error, Result};
use strata::mounttab;
use strata::storage::{Location, StoreArgs};

/// How long `strata mount` waits for the daemon to mount.
const READY_TIMEOUT: Duration = Duration::from_secs(15);

/// True when `point` is a mount point in this namespace.
fn is_mounted(point: &Path) -> bool {
    mounttab::find(point).is_ok_and(|m| m.is_some())
}

/// Say what recovering a stale mount did.
fn report_recovered(point: &Path, r: mounttab::Recovered) {
    eprintln!(
        "strata: the daemon of the mount at {} is gone; {}detached the stale mount",
        point.display(),
        if r.aborted {
            "aborted its FUSE connection and "
        } else {
            ""
        }
    );
}

struct MountArgs<'a> {
    store: &'a Location,
    store_args: &'a StoreArgs,
    mountpoint: &'a Path,
    sets: &'a [String],
    foreground: bool,
    verify: &'a str,
    opens: &'a str,
    preserve_owner: bool,
    no_acl: bool,
    no_io_uring: bool,
    /// Budget of assembled copies (`None`: the daemon's default).
    assembled_size: Option<u64>,
    no_materialize: bool,
    /// Scheduled sweeps: every, and their grace (`None`: the daemon's defaults).
    sweep_every: Option<std::time::Duration>,
    sweep_grace: Option<std::time::Duration>,
    /// How often latest is re-read (`None`: the daemon's default).
    poll: Option<std::time::Duration>,
    /// FUSE worker threads (`None`: the daemon's default).
    threads: Option<u16>,
}

/// `strata mount`, from its arguments.
pub(crate) fn mount_cmd(store_args: &StoreArgs, a: &MountCmd) -> Result<i32> {
    mount(&MountArgs {
        store: &store_args.location()?,
        store_args,
        mountpoint: &a.mountpoint,
        sets: &a.set,
        foreground: a.foreground,
        verify: &a.verify,
        opens: &a.opens,
        preserve_owner: a.preserve_owner,
        no_acl: a.no_acl,
        no_io_uring: a.no_io_uring,
        assembled_size: a.assembled_size,
        no_materialize: a.no_materialize,
        sweep_every: a.sweep_every,
        sweep_grace: a.sweep_grace,
        poll: a.poll,
        threads: a.threads,
    })
}

fn mount(a: &MountArgs<'_>) -> Result<i32> {
    let point = mounttab::resolve(a.mountpoint)?;
    if let Some(r) = mounttab::prepare(&point)? {
        report_recovered(&point, r);
    }
    let mut cmd = Command::new(strata::sibling_binary("strata-mountd"));
    match a.store {
        Location::Local(p) => cmd.arg("--store").arg(p),
        Location::S3(_) => cmd.args(a.store_args.to_args()),
    };
    cmd.arg("--verify")
        .arg(a.verify)
        .arg("--opens")
        .arg(a.opens);
    cmd.arg(&point);
    if a.preserve_owner {
        cmd.arg("--preserve-owner");
    }
    if a.no_acl {
        cmd.arg("--no-acl");
    }
    if a.no_io_uring {
        cmd.arg("--no-io-uring");
    }
    if a.no_materialize {
        cmd.arg("--no-materialize");
    }
    if let Some(n) = a.assembled_size {
        cmd.arg("--assembled-size").arg(n.to_string());
    }
    for s in a.sets {
        cmd.arg("--set").arg(s);
    }
    if let Some(d) = a.poll {
        cmd.arg("--poll-ms").arg(d.as_millis().to_string());
    }
    if let Some(n) = a.threads {
        cmd.arg("--threads").arg(n.to_string());
    }
    if let Some(d) = a.sweep_every {
        cmd.arg("--sweep-every-s").arg(d.as_secs().to_string());
    }
    if let Some(d) = a.sweep_grace {
        cmd.arg("--sweep-grace-s").arg(d.as_secs().to_string());
    }
    if a.foreground {
        let status = cmd
            .status()
            .map_err(|e| Error::io("spawn", "strata-mountd", e))?;
        return Ok(status.code().unwrap_or(1));
    }
    let shown = match a.store {
        Location::Local(p) => p.display().to_string(),
        Location::S3(o) => format!("s3://{}/{}", o.endpoint.bucket, o.endpoint.prefix),
    };
    daemonize(cmd, a.store.local_dir(), &shown, &point)
}

fn daemonize(mut cmd: Command, store: &Path, shown: &str, point: &Path) -> Result<i32> {
    let logs = store.join("logs");
    std::fs::DirBuilder::new()
        .recursive(true)
        .mode(0o700)
        .create(&logs)
        .map_err(|e| Error::io("mkdir", &logs, e))?;
    let log_path = logs.join("mountd.log");
    let log = OpenOptions::new()
        .create(true)
        .append(true)
        .mode(0o600)
        .open(&log_path)
        .map_err(|e| Error::io("open", &log_path, e))?;
    let err = log
        .try_clone()
        .map_err(|e| Error::io("dup", &log_path, e))?;
    cmd.stdin(Stdio::null()).stdout(log).stderr(err);
    // SAFETY: setsid is async-signal-safe; it detaches the daemon from our session.
    unsafe {
        cmd.pre_exec(|| {
            libc::setsid();
            Ok(())
        });
    }
    let log_start = std::fs::metadata(&log_path).map_or(0, |m| m.len());
    let mut child = cmd
        .spawn()
        .map_err(|e| Error::io("spawn", "strata-mountd", e))?;
    let start = Instant::now();
    while !is_mounted(point) {
        if let Some(status) = child
            .try_wait()
            .map_err(|e| Error::io("wait", "strata-mountd", e))?
        {
            return Err(Error::Invalid(format!(
                "strata-mountd exited before mounting ({status}){}; see {}",
                last_error(&log_path, log_start),
                log_path.display()
            )));
        }
        if start.elapsed() > READY_TIMEOUT {
            return Err(Error::internal(format!(
                "mount not ready after {READY_TIMEOUT:?}; see {}",
                log_path.display()
            )));
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    let socket = strata::control::wait_for_socket(store, child.id(), READY_TIMEOUT);
    let socket = socket.map_or("not bound; see the log".to_string(), |s| {
        s.display().to_string()
    });
    println!(
        "mounted {shown} at {} (strata-mountd pid {}, log {})",
        point.display(),
        child.id(),
        log_path.display()
    );
    println!("control socket {socket}");
    Ok(0)
}

/// The last error line this daemon run wrote to its log (past `from`), as
/// `: <message>`, or nothing.
fn last_error(log: &Path, from: u64) -> String {
    let bytes = std::fs::read(log).unwrap_or_default();
    let start = usize::try_from(from).map_or(bytes.len(), |f| f.min(bytes.len()));
    let text = String::from_utf8_lossy(&bytes[start..]);
    let Some(line) = text.lines().rev().find(|l| l.contains(" ERROR ")) else {
        return String::new();
    };
    let message = line.split_once(": ").map_or(line, |(_, m)| m);
    format!(": {}", message.trim())
}

pub(crate) fn unmount(mountpoint: &Path, lazy: bool) -> Result<i32> {
    let point = mounttab::resolve(mountpoint)?;
    match mounttab::occupant(&point)? {
        mounttab::Occupant::Free => {
            return Err(Error::Invalid(format!(
                "not mounted: mountpoint=`{}`",
                point.display()
            )))
        }
        mounttab::Occupant::Stale(entry) => {
            report_recovered(&point, mounttab::recover(&entry)?);
            return Ok(0);
        }
        mounttab::Occupant::Foreign(e) => {
            return Err(Error::Invalid(format!(
                "not a strata mount: fstype=`{}` mountpoint=`{}`",
                e.fstype,
                point.display()
            )))
        }
        _ => {}
    }
    let Err(e) = mounttab::unmount(&point, lazy) else {
        println!(
            "unmounted {}{}",
            point.display(),
            if lazy {
                " (detached; open files are served until closed)"
            } else {
                ""
            }
        );
        return Ok(0);
    };
    if e.raw_os_error() != Some(libc::EBUSY) {
        return Err(Error::io("umount", &point, e));
    }
    let holders = holders(&point);
    eprintln!("strata: mount is busy; not detached (use --lazy to detach and let open files finish): mountpoint=`{}`", point.display());
    for h in &holders {
        eprintln!("  {h}");
    }
    Ok(4)
}

/// Processes with a cwd, root or open file under `point`, as `pid comm: path`.
fn holders(point: &Path) -> Vec<String> {
    let mut out = Vec::new();
    let Ok(procs) = std::fs::read_dir("/proc") else {
        return out;
    };
    for p in procs.flatten() {
        let pid = p.file_name();
        let own = pid.to_str().and_then(|s| s.parse::<u32>().ok()) == Some(std::process::id());
        if own || !pid.as_bytes().iter().all(u8::is_ascii_digit) {
            continue;
        }
        let dir = p.path();
        let comm = std::fs::read_to_string(dir.join("comm")).unwrap_or_default();
        let mut links = vec![dir.join("cwd"), dir.join("root")];
        if let Ok(fds) = std::fs::read_dir(dir.join("fd")) {
            links.extend(fds.flatten().map(|f| f.path()));
        }
        if let Some(hit) = links
            .iter()
            .filter_map(|l| std::fs::read_link(l).ok())
            .find(|t| t.starts_with(point))
        {
            out.push(format!(
                "pid {} {}: {}",
                pid.to_string_lossy(),
                comm.trim(),
                hit.display()
            ));
        }
    }
    out
}
