//! Named durability steps and the failpoint registry that tests switch on.
//!
//! Every step a commit, a materialization or a sweep makes durable is a [`Step`]. Production code calls
//! [`FailPoints::hit`] after each; it does nothing unless a test configured
//! that step to kill the process or to fail with an injected errno. The CLI
//! builds the registry from `STRATA_FAILPOINTS` (e.g.
//! `prepared=kill,segments-written=eio`); library users pass one in.

use crate::error::{Error, Result};
use std::collections::HashMap;
use std::fmt;
use std::io;

/// One durability step of commit/publish, in the order they happen.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Step {
    /// Packs and standalone blobs of this commit are fsynced in their final names.
    BlobsDurable,
    /// The journal footer (record count + digest) is written and fsynced.
    JournalSealed,
    /// The new representation's segments are fsynced in their final names.
    SegmentsWritten,
    /// The manifest is fsynced under its SHA-256 name.
    ManifestWritten,
    /// The PREPARED index record exists.
    Prepared,
    /// The COMMITTED index record exists: the generation is visible.
    Committed,
    /// The `latest` hint pointer names the new generation.
    LatestAdvanced,
    /// Staging and the published journal are removed.
    Cleaned,
    /// Materialization: the attempt's CLAIMED task record exists.
    TaskClaimed,
    /// Materialization: the fold's segments are written to staging.
    Folded,
    /// Materialization: the verified output is recorded (OUTPUT_READY).
    OutputReady,
    /// Materialization: the PREPARED representation is in the index.
    RepPrepared,
    /// Materialization: the new representation is COMMITTED (readers switch).
    RepCommitted,
    /// Materialization: the task's pins are released (the committed record protects).
    ProtectionTransferred,
    /// Sweep: retention's RETIRED records exist.
    Retired,
    /// Sweep: unheld pins and dead staging are removed.
    ResidueReclaimed,
    /// Sweep: this epoch's condemned list exists.
    Condemned,
    /// Sweep: a deletion batch holds the DELETING lease.
    Deleting,
    /// Sweep: a deletion batch is done and its lease released.
    BatchDeleted,
    /// Sweep: the epoch's report exists.
    Swept,
    /// Restore: half of the generation's files are written (a test stops
    /// or kills the restore here, midway).
    RestoreHalfway,
    /// Copy: a generation's objects are on the target, its index records
    /// not yet written.
    CopySent,
}

impl Step {
    /// The steps of a commit, in order.
    pub const COMMIT: [Step; 8] = [
        Step::BlobsDurable,
        Step::JournalSealed,
        Step::SegmentsWritten,
        Step::ManifestWritten,
        Step::Prepared,
        Step::Committed,
        Step::LatestAdvanced,
        Step::Cleaned,
    ];

    /// The steps of a materialization, in order.
    pub const MATERIALIZE: [Step; 6] = [
        Step::TaskClaimed,
        Step::Folded,
        Step::OutputReady,
        Step::RepPrepared,
        Step::RepCommitted,
        Step::ProtectionTransferred,
    ];

    /// The steps of a sweep, in order.
    pub const SWEEP: [Step; 6] = [
        Step::Retired,
        Step::ResidueReclaimed,
        Step::Condemned,
        Step::Deleting,
        Step::BatchDeleted,
        Step::Swept,
    ];

    pub fn name(self) -> &'static str {
        match self {
            Step::BlobsDurable => "blobs-durable",
            Step::JournalSealed => "journal-sealed",
            Step::SegmentsWritten => "segments-written",
            Step::ManifestWritten => "manifest-written",
            Step::Prepared => "prepared",
            Step::Committed => "committed",
            Step::LatestAdvanced => "latest-advanced",
            Step::Cleaned => "cleaned",
            Step::TaskClaimed => "task-claimed",
            Step::Folded => "folded",
            Step::OutputReady => "output-ready",
            Step::RepPrepared => "rep-prepared",
            Step::RepCommitted => "rep-committed",
            Step::ProtectionTransferred => "protection-transferred",
            Step::Retired => "retired",
            Step::ResidueReclaimed => "residue-reclaimed",
            Step::Condemned => "condemned",
            Step::Deleting => "deleting",
            Step::BatchDeleted => "batch-deleted",
            Step::Swept => "swept",
            Step::RestoreHalfway => "restore-halfway",
            Step::CopySent => "copy-sent",
        }
    }

    fn parse(s: &str) -> Option<Step> {
        Step::COMMIT
            .into_iter()
            .chain(Step::MATERIALIZE)
            .chain(Step::SWEEP)
            .chain([Step::RestoreHalfway, Step::CopySent])
            .find(|st| st.name() == s)
    }
}

impl fmt::Display for Step {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// What happens when a configured step is reached.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Action {
    /// SIGKILL the current process (a crash with no cleanup).
    Kill,
    /// Fail the step with this errno (EIO, ENOSPC, EXDEV, ...).
    Errno(i32),
    /// SIGSTOP the current process (a pause: it goes on after SIGCONT).
    Stop,
}

/// Registry of armed failpoints; empty in production.
#[derive(Debug, Clone, Default)]
pub struct FailPoints {
    armed: HashMap<Step, Action>,
}

impl FailPoints {
    pub fn none() -> FailPoints {
        FailPoints::default()
    }

    pub fn arm(mut self, step: Step, action: Action) -> FailPoints {
        self.armed.insert(step, action);
        self
    }

    /// Parse `step=action[,step=action...]`; actions: kill, stop, eio, enospc, exdev.
    pub fn parse(spec: &str) -> Result<FailPoints> {
        let mut fp = FailPoints::none();
        for item in spec.split(',').filter(|s| !s.is_empty()) {
            let (step, action) = item.split_once('=').ok_or_else(|| {
                Error::Invalid(format!("failpoint needs step=action: item=`{item}`"))
            })?;
            let step = Step::parse(step)
                .ok_or_else(|| Error::Invalid(format!("unknown failpoint step: step=`{step}`")))?;
            fp = fp.arm(step, parse_action(action)?);
        }
        Ok(fp)
    }

    /// Called right after `step` became durable.
    pub fn hit(&self, step: Step) -> Result<()> {
        match self.armed.get(&step) {
            None => Ok(()),
            Some(Action::Kill) => {
                // SAFETY: raising a signal on our own pid has no memory effects.
                unsafe { libc::kill(libc::getpid(), libc::SIGKILL) };
                Err(Error::internal(format!("survived SIGKILL at step={step}")))
            }
            Some(Action::Stop) => {
                // SAFETY: raising a signal on our own pid has no memory effects.
                unsafe { libc::kill(libc::getpid(), libc::SIGSTOP) };
                Ok(())
            }
            Some(Action::Errno(code)) => Err(Error::io(
                "failpoint",
                step.name(),
                io::Error::from_raw_os_error(*code),
            )),
        }
    }
}

fn parse_action(s: &str) -> Result<Action> {
    Ok(match s {
        "kill" => Action::Kill,
        "stop" => Action::Stop,
        "eio" => Action::Errno(libc::EIO),
        "enospc" => Action::Errno(libc::ENOSPC),
        "exdev" => Action::Errno(libc::EXDEV),
        _ => {
            return Err(Error::Invalid(format!(
                "unknown failpoint action: action=`{s}`"
            )))
        }
    })
}
