//! The host's idle policy, read once at start. Every FUSE request is a
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
//! The setting belongs to the machine's operator, not to a file system
//! daemon: this module only reads it, and `main` logs the advice once.

use std::path::Path;

/// The cpuidle driver in use, under `/sys`.
const DRIVER: &str = "devices/system/cpu/cpuidle/current_driver";
/// How long the `haltpoll` driver polls before it halts, under `/sys`.
const POLL_NS: &str = "module/haltpoll/parameters/guest_halt_poll_ns";

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

#[cfg(test)]
mod tests {
    use super::*;

    fn host(driver: Option<&str>, poll_ns: Option<&str>) -> tempfile::TempDir {
        let sys = tempfile::tempdir().unwrap();
        for (file, value) in [(DRIVER, driver), (POLL_NS, poll_ns)] {
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
}
