//! Readiness and stop notices for a service manager (systemd's
//! `Type=notify`): one datagram to `$NOTIFY_SOCKET` when the mount and the
//! control socket are ready, and one when a stop signal starts the drain.
//! Without `$NOTIFY_SOCKET` (not started by a service manager) nothing is
//! sent. The protocol is sd_notify(3)'s; no library is needed for it.

use std::os::linux::net::SocketAddrExt;
use std::os::unix::net::{SocketAddr, UnixDatagram};
use tracing::warn;

/// Tell the service manager `state` (e.g. `READY=1`), if one listens.
pub(crate) fn notify(state: &str) {
    let Some(path) = std::env::var_os("NOTIFY_SOCKET") else {
        return;
    };
    let path = path.to_string_lossy().into_owned();
    let addr = match path.strip_prefix('@') {
        Some(name) => SocketAddr::from_abstract_name(name.as_bytes()),
        None => SocketAddr::from_pathname(&path),
    };
    let sent = addr.and_then(|addr| {
        let socket = UnixDatagram::unbound()?;
        socket.send_to_addr(state.as_bytes(), &addr)
    });
    if let Err(e) = sent {
        warn!("cannot notify the service manager at {path}: {e}");
    }
}
