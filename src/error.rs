//! Errors: one precise internal enum and a small public [`ErrorKind`].
//!
//! Messages are lowercase and put values last as ``key=`value` ``; a wrapped
//! source's text is never repeated in the outer message (the CLI prints the
//! chain).

use std::io;
use std::path::Path;

/// Coarse classification callers (and the CLI's exit code) act on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ErrorKind {
    /// The caller asked for something malformed or impossible.
    InvalidInput,
    /// Stored bytes failed a check; nothing was served from them.
    Corrupt,
    /// Someone else won a race or holds a lease; re-read and retry.
    Conflict,
    /// An I/O failure or a missing object (`Error::MissingObject`): the
    /// store cannot serve something that should be there.
    Unavailable,
    /// A bug: an internal expectation did not hold.
    Internal,
}

/// Everything that can fail inside strata.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("i/o failed: op=`{op}` path=`{path}`")]
    Io {
        op: &'static str,
        path: String,
        #[source]
        source: io::Error,
    },
    #[error("corrupt {what}: check=`{check}` file=`{file}`")]
    Corrupt {
        what: &'static str,
        file: String,
        check: String,
    },
    #[error("{what} is too large: size={size} limit={limit}")]
    TooLarge {
        what: &'static str,
        size: u64,
        limit: u64,
    },
    #[error("{what} has a newer format than this strata understands; upgrade strata: found={found} supported={supported}")]
    NewerFormat {
        what: &'static str,
        found: u32,
        supported: u32,
    },
    #[error("invalid input: {0}")]
    Invalid(String),
    /// An external sort's budget that could not bound memory or finish a
    /// merge (`spill::SortBudget::check`); refused, never adjusted.
    #[error("invalid sort budget: {problem}: memory_bytes={memory_bytes} fan_in={fan_in}")]
    SortBudget {
        problem: &'static str,
        memory_bytes: usize,
        fan_in: usize,
    },
    /// A name the caller asked for does not exist: a generation the index
    /// has no committed record of, a tag, a set, a path. Never a stored
    /// object that is missing: that is [`Error::MissingObject`].
    #[error("{what} not found: name=`{name}`")]
    NotFound { what: &'static str, name: String },
    /// A stored object is absent (a missing file or key). A caller that asks
    /// whether a name exists (index records, tags, pointers) turns this into
    /// `Ok(None)` or a [`Error::NotFound`] of what it looked for; anywhere
    /// else (a pack, blob, segment or manifest a generation names) the store
    /// lost something it should hold.
    #[error("stored object is missing: key=`{key}`")]
    MissingObject { key: String },
    #[error("conflict: {0}")]
    Conflict(String),
    /// Work stopped at a cancellation checkpoint (daemon shutdown); what
    /// it had done is recorded and a later attempt resumes it.
    #[error("cancelled: {0}")]
    Cancelled(String),
    /// A bounded wait ran out before the awaited work ended.
    #[error("gave up waiting after {waited_ms} ms: {what}")]
    WaitTimeout { what: String, waited_ms: u64 },
    #[error("set is being written by another commit (use --wait to queue): set=`{set}` holder=`{holder}`")]
    Busy { set: String, holder: String },
    #[error("{} path(s) could not be read; nothing was published (use --skip-unreadable to record and skip them):\n  {}", .0.len(), .0.join("\n  "))]
    Unreadable(Vec<String>),
    /// A sweep root could not be read; the sweep stopped before deleting.
    #[error("sweep deleted nothing: a root could not be read during {during}")]
    RootUnreadable {
        during: &'static str,
        #[source]
        source: Box<Error>,
    },
    /// A restore stopped at one entry (its temporary file removed); every
    /// file already under its own name is complete.
    #[error("restore stopped at path=`{path}`")]
    Restore {
        path: String,
        #[source]
        source: Box<Error>,
    },
    /// A request to a remote store failed (after the client's own retries).
    #[error("remote store request failed: op=`{op}` key=`{key}`")]
    Remote {
        op: &'static str,
        key: String,
        /// A transport failure or server overload, worth another attempt.
        transient: bool,
        #[source]
        source: Box<dyn std::error::Error + Send + Sync>,
    },
    /// A remote lease was not renewed in time and may have been taken over;
    /// nothing more is published under it.
    #[error("lease lost (not renewed within its ttl; another party may hold it now): key=`{key}`")]
    Fenced { key: String },
    /// A content-named object already stored under the name of a writer's
    /// bytes failed the adoption check (rotted, or left short by a crash)
    /// and could not be replaced; nothing refers to it.
    #[error("stored object failed its check and was not replaced: check=`{check}` key=`{key}`")]
    NotAdopted {
        key: String,
        check: String,
        #[source]
        source: Box<Error>,
    },
    /// A segment or manifest re-read before anything refers to it does not
    /// hold what was written; nothing was committed.
    #[error("stored object does not hold what was written: check=`{check}` key=`{key}`")]
    StoredMismatch { key: String, check: String },
    /// The disk budget refused work before it wrote (docs/OPERATIONS.md).
    #[error("storage gap: {what} needs {need} more bytes, {available} are available under the {limit} (make room, or change the budget with `strata budget`)")]
    NoSpace {
        what: &'static str,
        need: u64,
        available: u64,
        limit: &'static str,
    },
    /// A bug: an internal expectation did not hold. Built with
    /// [`Error::internal`] or [`Error::internal_from`].
    #[error("internal error: {message}")]
    Internal {
        message: String,
        #[source]
        source: Option<Box<dyn std::error::Error + Send + Sync>>,
    },
}

pub type Result<T, E = Error> = std::result::Result<T, E>;

impl Error {
    pub fn kind(&self) -> ErrorKind {
        match self {
            Error::Io { .. }
            | Error::NotFound { .. }
            | Error::MissingObject { .. }
            | Error::Unreadable(_)
            | Error::NoSpace { .. }
            | Error::Remote { .. } => ErrorKind::Unavailable,
            Error::Corrupt { .. } | Error::StoredMismatch { .. } => ErrorKind::Corrupt,
            Error::TooLarge { .. }
            | Error::Invalid(_)
            | Error::SortBudget { .. }
            | Error::NewerFormat { .. } => ErrorKind::InvalidInput,
            Error::Conflict(_)
            | Error::Busy { .. }
            | Error::Fenced { .. }
            | Error::Cancelled(_)
            | Error::WaitTimeout { .. } => ErrorKind::Conflict,
            Error::Internal { .. } => ErrorKind::Internal,
            Error::RootUnreadable { source, .. }
            | Error::NotAdopted { source, .. }
            | Error::Restore { source, .. } => source.kind(),
        }
    }

    pub fn io(op: &'static str, path: impl AsRef<Path>, source: io::Error) -> Error {
        Error::Io {
            op,
            path: path.as_ref().display().to_string(),
            source,
        }
    }

    pub fn corrupt(what: &'static str, file: impl Into<String>, check: impl Into<String>) -> Error {
        Error::Corrupt {
            what,
            file: file.into(),
            check: check.into(),
        }
    }

    /// A missing stored object (`key` as the storage names it).
    pub fn missing_object(key: impl Into<String>) -> Error {
        Error::MissingObject { key: key.into() }
    }

    /// An internal error with nothing underneath.
    pub fn internal(message: impl Into<String>) -> Error {
        Error::Internal {
            message: message.into(),
            source: None,
        }
    }

    /// An internal error caused by `source` (kept for the chain).
    pub fn internal_from(
        message: impl Into<String>,
        source: impl Into<Box<dyn std::error::Error + Send + Sync>>,
    ) -> Error {
        Error::Internal {
            message: message.into(),
            source: Some(source.into()),
        }
    }

    /// The stored object (key, file or path) whose failure this is, when
    /// the error names one: what a log line should point an operator at.
    pub fn object(&self) -> Option<&str> {
        match self {
            Error::MissingObject { key }
            | Error::Remote { key, .. }
            | Error::Fenced { key }
            | Error::NotAdopted { key, .. }
            | Error::StoredMismatch { key, .. } => Some(key),
            Error::Io { path, .. } => Some(path),
            Error::Corrupt { file, .. } => Some(file),
            Error::RootUnreadable { source, .. } => source.object(),
            _ => None,
        }
    }

    /// True when the underlying failure is a missing file or object, or a
    /// name that does not exist.
    pub fn is_not_found(&self) -> bool {
        match self {
            Error::NotFound { .. } | Error::MissingObject { .. } => true,
            Error::Io { source, .. } => source.kind() == io::ErrorKind::NotFound,
            _ => false,
        }
    }
}

/// Attach an operation and a path to an `io::Result`.
pub(crate) trait IoContext<T> {
    fn ctx(self, op: &'static str, path: impl AsRef<Path>) -> Result<T>;
}

impl<T> IoContext<T> for io::Result<T> {
    fn ctx(self, op: &'static str, path: impl AsRef<Path>) -> Result<T> {
        self.map_err(|e| Error::io(op, path, e))
    }
}
