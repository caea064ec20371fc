//! `strata metrics`: the running daemons' metrics through their control
//! sockets (the client itself is `strata::control`).

use std::io::Write;
use std::path::Path;
use strata::control::protocol::MetricsText;
use strata::control::{ask_as, sockets, Command, TIMEOUT};
use strata::error::{Error, Result};

/// `strata metrics`: each running daemon's metrics, as Prometheus text,
/// each block headed by a comment naming its socket.
pub(crate) fn metrics(store: &Path) -> Result<i32> {
    let mut out = std::io::stdout().lock();
    let mut answered = 0;
    for socket in sockets(store) {
        let Some(MetricsText { text }) = ask_as(&socket, &Command::Metrics, Some(TIMEOUT))? else {
            continue;
        };
        let _ = writeln!(out, "# strata-mountd {}\n{text}", socket.display());
        answered += 1;
    }
    if answered == 0 {
        return Err(Error::NotFound {
            what: "running mount daemon of the store",
            name: store.display().to_string(),
        });
    }
    Ok(0)
}
