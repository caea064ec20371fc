//! OS shims: the few Linux calls strata makes beyond std, each with its
//! reason. Scheduling of background work (nice, I/O class, EEVDF slice,
//! autogroup) and filesystem space (statvfs).

use crate::error::{Error, Result};
use std::ffi::CString;
use std::os::unix::ffi::OsStrExt;
use std::path::Path;

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

/// Free and total bytes of the filesystem holding `dir`.
pub fn filesystem_space(dir: &Path) -> Result<(u64, u64)> {
    let path = CString::new(dir.as_os_str().as_bytes())
        .map_err(|_| Error::Invalid(format!("path with NUL: {}", dir.display())))?;
    // SAFETY: statvfs writes into the zeroed struct we pass; `path` is a
    // valid NUL-terminated string.
    let mut st: libc::statvfs = unsafe { std::mem::zeroed() };
    if unsafe { libc::statvfs(path.as_ptr(), &mut st) } != 0 {
        return Err(Error::io("statvfs", dir, std::io::Error::last_os_error()));
    }
    let unit = st.f_frsize as u64;
    Ok((st.f_bavail as u64 * unit, st.f_blocks as u64 * unit))
}

/// The data extents of `file` (`size` bytes long) as `[start, end)` ranges in
/// order, found with `SEEK_DATA`/`SEEK_HOLE`; holes shorter than `min_hole`
/// are folded into the data around them. Where the filesystem cannot tell,
/// the whole file is one extent.
pub fn data_extents(file: &std::fs::File, size: u64, min_hole: u64) -> Vec<(u64, u64)> {
    use std::os::fd::AsRawFd;
    let fd = file.as_raw_fd();
    let seek = |off: u64, whence: libc::c_int| -> std::io::Result<u64> {
        // SAFETY: lseek on a descriptor `file` keeps open; it only moves
        // the file offset, which every read here overrides (pread).
        let r = unsafe { libc::lseek(fd, off as libc::off_t, whence) };
        match r {
            r if r >= 0 => Ok(r as u64),
            _ => Err(std::io::Error::last_os_error()),
        }
    };
    let mut out: Vec<(u64, u64)> = Vec::new();
    let mut at = 0;
    while at < size {
        let start = match seek(at, libc::SEEK_DATA) {
            Ok(s) => s,
            // No data past `at`.
            Err(e) if e.raw_os_error() == Some(libc::ENXIO) => break,
            Err(_) => return vec![(0, size)],
        };
        let end = seek(start, libc::SEEK_HOLE).unwrap_or(size).min(size);
        if start >= end {
            break;
        }
        let prev_end = out.last().map_or(0, |l| l.1);
        match out.last_mut() {
            Some(last) if start - prev_end < min_hole => last.1 = end,
            None if start < min_hole => out.push((0, end)),
            _ => out.push((start, end)),
        }
        at = end;
    }
    if let Some(last) = out.last_mut() {
        if size - last.1 < min_hole {
            last.1 = size;
        }
    }
    out
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
