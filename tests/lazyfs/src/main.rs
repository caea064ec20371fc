//! lazyfs: a FUSE filesystem for crash tests that loses, at a simulated
//! power cut, everything the program above it did not make durable.
//!
//! ```text
//! lazyfs --image DIR --mount MNT [--seed N] [--mode strict|prefix] [--trace FILE]
//! ```
//!
//! Serves the tree in DIR at MNT (all in memory) and prints `ready` once
//! mounted. SIGUSR1 is a power cut: the durable state, plus what the crash
//! mode lets survive of what was pending (see `model`), replaces DIR; the
//! mount is detached and the process exits. SIGTERM or SIGINT is a clean
//! shutdown: everything is written to DIR first. Remounting DIR afterwards
//! is the machine coming back up.

mod fs;
mod image;
mod model;

use model::{CrashMode, Rng};
use std::ffi::CString;
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

struct Args {
    image: PathBuf,
    mount: PathBuf,
    seed: u64,
    mode: CrashMode,
    trace: Option<PathBuf>,
}

fn parse() -> Result<Args, String> {
    let mut it = std::env::args().skip(1);
    let (mut image, mut mount, mut seed, mut mode, mut trace) =
        (None, None, 0, CrashMode::Strict, None);
    while let Some(flag) = it.next() {
        let value = it.next().ok_or_else(|| format!("{flag} needs a value"))?;
        match flag.as_str() {
            "--image" => image = Some(PathBuf::from(value)),
            "--mount" => mount = Some(PathBuf::from(value)),
            "--seed" => seed = value.parse().map_err(|_| format!("bad seed `{value}`"))?,
            "--mode" => {
                mode = match value.as_str() {
                    "strict" => CrashMode::Strict,
                    "prefix" => CrashMode::Prefix,
                    _ => return Err(format!("bad mode `{value}` (strict or prefix)")),
                }
            }
            "--trace" => trace = Some(PathBuf::from(value)),
            _ => return Err(format!("unknown flag `{flag}`")),
        }
    }
    Ok(Args {
        image: image.ok_or("--image is required")?,
        mount: mount.ok_or("--mount is required")?,
        seed,
        mode,
        trace,
    })
}

fn main() {
    if let Err(e) = run() {
        eprintln!("lazyfs: {e}");
        std::process::exit(1);
    }
}

fn run() -> Result<(), String> {
    let args = parse()?;
    let signals = block_signals();
    std::fs::create_dir_all(&args.image)
        .map_err(|e| format!("image {}: {e}", args.image.display()))?;
    let tree =
        image::load(&args.image).map_err(|e| format!("load {}: {e}", args.image.display()))?;
    let trace = match &args.trace {
        Some(p) => Some(
            std::fs::OpenOptions::new()
                .create(true)
                .append(true)
                .open(p)
                .map_err(|e| format!("trace {}: {e}", p.display()))?,
        ),
        None => None,
    };
    let shared = Arc::new(Mutex::new(fs::Shared { tree, trace }));
    let mut config = fuser::Config::default();
    config.mount_options = vec![
        fuser::MountOption::FSName("lazyfs".into()),
        fuser::MountOption::Subtype("lazyfs".into()),
    ];
    let session = fuser::Session::new(fs::LazyFs(shared.clone()), &args.mount, &config)
        .map_err(|e| format!("mount {}: {e}", args.mount.display()))?;
    let waiter = std::thread::spawn(move || on_signal(signals, shared, args));
    println!("ready");
    let _ = std::io::Write::flush(&mut std::io::stdout());
    let served = session.run();
    // The session ends when someone else unmounted us: keep nothing.
    drop(waiter);
    served.map_err(|e| format!("serve: {e}"))
}

/// Block the signals the waiter thread takes (before any thread starts,
/// so every thread inherits the mask).
fn block_signals() -> libc::sigset_t {
    // SAFETY: plain signal-set manipulation on a local set.
    unsafe {
        let mut set: libc::sigset_t = std::mem::zeroed();
        libc::sigemptyset(&mut set);
        for s in [libc::SIGUSR1, libc::SIGTERM, libc::SIGINT] {
            libc::sigaddset(&mut set, s);
        }
        libc::pthread_sigmask(libc::SIG_BLOCK, &set, std::ptr::null_mut());
        set
    }
}

/// Wait for a power cut (SIGUSR1) or a shutdown; write the image, detach
/// the mount and exit while still holding the tree, so no request is
/// served after the image is taken.
fn on_signal(set: libc::sigset_t, shared: Arc<Mutex<fs::Shared>>, args: Args) {
    let mut sig = 0;
    // SAFETY: `set` is a valid signal set; `sig` a valid out pointer.
    unsafe { libc::sigwait(&set, &mut sig) };
    let mut s = shared
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner);
    if sig == libc::SIGUSR1 {
        let r = s.tree.crash(args.mode, &mut Rng::new(args.seed));
        eprintln!(
            "lazyfs: power cut (mode {:?}, seed {}): kept {} of {} pending entry operations; {} files had unsynced data, {} torn",
            args.mode, args.seed, r.entry_ops_kept, r.entry_ops_pending, r.files_pending, r.files_torn
        );
    } else {
        s.tree.sync_all();
    }
    let code = match image::save(&s.tree, &args.image) {
        Ok(()) => 0,
        Err(e) => {
            eprintln!("lazyfs: write image {}: {e}", args.image.display());
            1
        }
    };
    detach(&args.mount);
    std::process::exit(code);
}

fn detach(mount: &Path) {
    let Ok(c) = CString::new(mount.as_os_str().as_bytes()) else {
        return;
    };
    // SAFETY: a valid NUL-terminated path.
    unsafe { libc::umount2(c.as_ptr(), libc::MNT_DETACH) };
}
