//! strata: a named, versioned file tree kept as immutable, verifiable
//! generations. See docs/ARCHITECTURE.md for the map.

#![warn(unreachable_pub)]

pub mod blob;
pub mod browse;
pub mod budget;
pub mod cas;
pub mod chunking;
pub mod chunks;
pub mod commit;
pub mod compose;
pub mod control;
pub mod copy;
pub mod diff;
pub mod error;
pub mod export;
pub mod failpoint;
pub mod format;
pub mod history;
pub mod identity;
pub mod index;
pub mod lineage;
pub mod liveness;
pub mod log;
pub mod materialize;
pub mod mount_tree;
pub mod mounttab;
pub mod os;
pub mod pack_writer;
pub mod pin;
pub mod publish;
pub mod redact;
pub mod rep_writer;
pub mod restore;
pub mod resumable;
pub mod retain;
pub mod row;
pub mod spill;
pub mod staging;
pub mod status;
pub mod storage;
pub mod store;
pub mod sweep;
pub mod tag;
pub mod task;
pub mod token;
pub mod verify;
pub mod xattr;

pub use error::{Error, ErrorKind, Result};
pub use store::Store;

/// strata's binaries are installed side by side: `name` next to the running
/// binary, else `name` to be found on `PATH`.
pub fn sibling_binary(name: &str) -> std::path::PathBuf {
    std::env::current_exe()
        .ok()
        .map(|p| p.with_file_name(name))
        .filter(|p| p.exists())
        .unwrap_or_else(|| std::path::PathBuf::from(name))
}

/// An error and its sources as one line, for reports.
pub fn cli_chain(e: &Error) -> String {
    let mut s = e.to_string();
    let mut src = std::error::Error::source(e);
    while let Some(x) = src {
        s.push_str(": ");
        s.push_str(&x.to_string());
        src = x.source();
    }
    s
}
