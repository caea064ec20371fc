//! How the host schedules a round trip, read once at start: its idle
//! policy, whether the kernel offers FUSE over io_uring, and whether it
//! schedules each session as a group. Every FUSE request is a
//! round trip between the caller's thread and a worker of this daemon; when
//! the side it wakes has gone idle, the wake-up costs what the CPU's idle
//! state costs to leave. On a KVM guest whose cpuidle driver is `haltpoll`
//! with `guest_halt_poll_ns` at 0, an idle virtual CPU halts at once, and
//! leaving a halt goes through the host: about 20 µs a round trip on the
//! development machine, where a cold `ls -lR` of the mixed tree (one ACL
//! request per inode) took 1.9-2.2x native with the poll off and
//! 1.25-1.36x with it at 200 µs (`scripts/bench/halt-poll.sh`,
//! docs/BENCHMARKS.md, docs/OPERATIONS.md).
//!
//! FUSE over io_uring answers each request on the CPU that asked, so a
//! caller waiting on one round trip after another stays on its CPU and
//! wakes nothing idle (a cold `ls -lR` at native speed), but only while
//! the scheduler keeps the caller there. With session autogroups
//! (`kernel.sched_autogroup_enabled`, on in Debian's kernels), a daemon
//! started in its own session (`strata mount`, a service) and a reader in
//! another are scheduled as separate groups, and the woken reader is moved
//! to the other, idle CPU at every answer: the walk then costs what it
//! costs through `/dev/fuse` (measured in docs/BENCHMARKS.md).
//!
//! So the daemon takes the ring only where sessions are not grouped
//! (`take_uring`), and otherwise says which setting would change that.
//!
//! These settings belong to the machine's operator, not to a file system
//! daemon: this module only reads them, and `main` logs the advice once.

use std::path::Path;

/// The cpuidle driver in use, under `/sys`.
const DRIVER: &str = "devices/system/cpu/cpuidle/current_driver";
/// How long the `haltpoll` driver polls before it halts, under `/sys`.
const POLL_NS: &str = "module/haltpoll/parameters/guest_halt_poll_ns";
/// Whether the kernel offers FUSE over io_uring to new mounts, under `/sys`.
const URING: &str = "module/fuse/parameters/enable_uring";
/// Whether each session's tasks are scheduled as a group, under `/proc`.
const AUTOGROUP: &str = "sys/kernel/sched_autogroup_enabled";

/// The advice to log when the host under `sys` (normally `/sys`) halts its
/// idle CPUs without polling first; `None` when it polls or is not such a
/// guest.
pub(crate) fn halt_polling_advice(sys: &Path) -> Option<String> {
    let driver = std::fs::read_to_string(sys.join(DRIVER)).ok()?;
    let poll_ns = std::fs::read_to_string(sys.join(POLL_NS)).ok()?;
    if driver.trim() != "haltpoll" || poll_ns.trim() != "0" {
        return None;
    }
    Some(format!(
        "this virtual machine halts idle CPUs without polling ({} is 0), so a \
         FUSE round trip that wakes an idle CPU waits for the host: cold \
         metadata walks (`ls -lR`) can take up to twice as long. \
         Writing 200000 there (as root) lets an idle CPU poll for 200 µs \
         first; see docs/OPERATIONS.md",
        sys.join(POLL_NS).display()
    ))
}

/// Whether the kernel under `sys` offers FUSE over io_uring to new mounts.
fn uring_offered(sys: &Path) -> bool {
    std::fs::read_to_string(sys.join(URING)).is_ok_and(|v| matches!(v.trim(), "Y" | "1"))
}

/// Whether the kernel under `proc` schedules each session as a group
/// (`None`: it cannot, having no autogroups).
fn sessions_grouped(proc: &Path) -> Option<bool> {
    let v = std::fs::read_to_string(proc.join(AUTOGROUP)).ok()?;
    Some(v.trim() != "0")
}

/// Whether to ask the kernel for FUSE over io_uring: unless declined
/// (`--no-io-uring`), when the kernel under `proc` does not schedule
/// sessions as groups. With groups, a reader in another session is moved
/// off its CPU at every answer, and the ring's queues gain nothing while
/// large reads through the daemon cost a copy more (docs/BENCHMARKS.md).
pub(crate) fn take_uring(proc: &Path, declined: bool) -> bool {
    !declined && sessions_grouped(proc) != Some(true)
}

/// The advice to log when the kernel under `sys` offers FUSE over io_uring
/// but the one under `proc` schedules each session as a group, so the
/// daemon (unless `declined`) keeps to `/dev/fuse`; `None` otherwise.
pub(crate) fn autogroup_advice(sys: &Path, proc: &Path, declined: bool) -> Option<String> {
    if declined || !uring_offered(sys) || sessions_grouped(proc) != Some(true) {
        return None;
    }
    Some(format!(
        "the kernel offers FUSE over io_uring, but schedules each session as \
         a group ({} is 1): a reader in another session than this daemon's \
         would be moved to another CPU at every answer, so requests keep \
         coming through /dev/fuse. Writing 0 there (as root) lets them come \
         over io_uring and be answered on the CPU that asked; see \
         docs/OPERATIONS.md",
        proc.join(AUTOGROUP).display()
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn host(driver: Option<&str>, poll_ns: Option<&str>) -> tempfile::TempDir {
        files(&[(DRIVER, driver), (POLL_NS, poll_ns)])
    }

    /// A directory holding each named file with its value, if any.
    fn files(values: &[(&str, Option<&str>)]) -> tempfile::TempDir {
        let sys = tempfile::tempdir().unwrap();
        for &(file, value) in values {
            if let Some(v) = value {
                let path = sys.path().join(file);
                std::fs::create_dir_all(path.parent().unwrap()).unwrap();
                std::fs::write(path, format!("{v}\n")).unwrap();
            }
        }
        sys
    }

    #[test]
    fn a_guest_that_halts_without_polling_is_told_which_setting_to_change() {
        let sys = host(Some("haltpoll"), Some("0"));
        let advice = halt_polling_advice(sys.path()).expect("advice");
        assert!(advice.contains(&sys.path().join(POLL_NS).display().to_string()));
        assert!(advice.contains("200000"));
    }

    #[test]
    fn a_guest_that_polls_or_another_idle_driver_gets_no_advice() {
        for (driver, poll_ns) in [
            (Some("haltpoll"), Some("200000")),
            (Some("intel_idle"), Some("0")),
            (Some("acpi_idle"), None),
            (None, None),
        ] {
            let sys = host(driver, poll_ns);
            assert_eq!(
                halt_polling_advice(sys.path()),
                None,
                "{driver:?} {poll_ns:?}"
            );
        }
    }

    #[test]
    fn a_ring_with_session_groups_is_told_which_setting_to_change() {
        let sys = files(&[(URING, Some("Y")), (AUTOGROUP, Some("1"))]);
        let advice = autogroup_advice(sys.path(), sys.path(), false).expect("advice");
        assert!(advice.contains(&sys.path().join(AUTOGROUP).display().to_string()));
        assert!(!take_uring(sys.path(), false), "requests keep to /dev/fuse");
    }

    #[test]
    fn no_ring_or_no_session_groups_gets_no_advice() {
        for (declined, offered, grouped) in [
            (true, Some("Y"), Some("1")),
            (false, Some("N"), Some("1")),
            (false, Some("Y"), Some("0")),
            (false, None, Some("1")),
            (false, Some("Y"), None),
        ] {
            let sys = files(&[(URING, offered), (AUTOGROUP, grouped)]);
            assert_eq!(
                autogroup_advice(sys.path(), sys.path(), declined),
                None,
                "{declined} {offered:?} {grouped:?}"
            );
        }
    }
}
