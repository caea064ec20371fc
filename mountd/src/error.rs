//! The daemon's own failures: starting up, serving the session, and
//! answering a materialization request. Each names what it was doing and
//! keeps the underlying error as its source (printed as a chain by
//! [`chain`]), following the core's conventions (src/error.rs): lowercase
//! messages, values last.

use std::path::PathBuf;

#[derive(Debug, thiserror::Error)]
pub(crate) enum DaemonError {
    #[error("cannot open the store")]
    Store(#[source] strata::Error),
    #[error("invalid --set: set=`{set}`")]
    SetName {
        set: String,
        #[source]
        source: strata::Error,
    },
    #[error("cannot use the mount point: path=`{}`", .path.display())]
    MountPoint {
        path: PathBuf,
        #[source]
        source: strata::Error,
    },
    #[error("cannot start the {what} thread")]
    Thread {
        what: &'static str,
        #[source]
        source: std::io::Error,
    },
    #[error("cannot bind the control socket: store=`{}`", .store.display())]
    ControlSocket {
        store: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("mount failed{hint}: mountpoint=`{}`", .path.display())]
    Mount {
        path: PathBuf,
        /// Why a user's mount may have failed (empty when nothing applies).
        hint: String,
        #[source]
        source: std::io::Error,
    },
    #[error("the FUSE session failed")]
    Session(#[source] std::io::Error),
    #[error("the daemon is shutting down")]
    ShuttingDown,
    #[error("the materialization worker stopped before answering: set=`{set}`")]
    WorkerGone { set: String },
    #[error("materialization failed: set=`{set}`")]
    Materialize {
        set: String,
        #[source]
        source: strata::Error,
    },
}

/// `e` and all of its sources, `: `-separated (as the CLI prints errors).
pub(crate) fn chain(e: &dyn std::error::Error) -> String {
    let mut s = e.to_string();
    let mut source = e.source();
    while let Some(x) = source {
        s.push_str(": ");
        s.push_str(&x.to_string());
        source = x.source();
    }
    s
}
