//! Client side of the control socket (docs/CONTROL.md): find the daemons of
//! a store without flags and send them [`Command`]s. Used by the CLI and by
//! the mount table's check of whether a daemon still serves a mount.

use super::protocol::{Command, Response};
use crate::error::{Error, Result};
use serde::de::DeserializeOwned;
use serde_json::Value;
use std::io::{BufRead, BufReader, Write};
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::time::Duration;

/// How long [`ask`] waits for a reply.
pub const TIMEOUT: Duration = Duration::from_secs(10);

/// Control sockets of daemons serving `store` (`<store>/run/mountd-*.sock`).
pub fn sockets(store: &Path) -> Vec<PathBuf> {
    let Ok(rd) = std::fs::read_dir(store.join("run")) else {
        return Vec::new();
    };
    let mut out: Vec<PathBuf> = rd
        .flatten()
        .map(|e| e.path())
        .filter(|p| {
            p.extension().is_some_and(|x| x == "sock")
                && p.file_name()
                    .is_some_and(|n| n.to_string_lossy().starts_with("mountd-"))
        })
        .collect();
    out.sort();
    out
}

/// Send one command; `Ok(None)` when nobody listens (a stale socket).
pub fn ask(socket: &Path, command: &Command) -> Result<Option<Value>> {
    ask_within(socket, command, Some(TIMEOUT))
}

/// Send one command and read its result as `T`.
pub fn ask_as<T: DeserializeOwned>(
    socket: &Path,
    command: &Command,
    timeout: Option<Duration>,
) -> Result<Option<T>> {
    let Some(v) = ask_within(socket, command, timeout)? else {
        return Ok(None);
    };
    serde_json::from_value(v)
        .map(Some)
        .map_err(|e| reply_corrupt(socket, command, e))
}

/// Send one command; wait for the reply up to `timeout` (`None`: as long
/// as the daemon works on it). A daemon's refusal is `Error::Conflict`
/// with its message.
pub fn ask_within(
    socket: &Path,
    command: &Command,
    timeout: Option<Duration>,
) -> Result<Option<Value>> {
    let stream = match UnixStream::connect(socket) {
        Ok(s) => s,
        Err(e)
            if e.raw_os_error() == Some(libc::ECONNREFUSED)
                || e.kind() == std::io::ErrorKind::NotFound =>
        {
            return Ok(None)
        }
        Err(e) => return Err(Error::io("connect", socket, e)),
    };
    stream
        .set_read_timeout(timeout)
        .map_err(|e| Error::io("socket", socket, e))?;
    let mut line = command.to_line();
    line.push('\n');
    (&stream)
        .write_all(line.as_bytes())
        .map_err(|e| Error::io("write", socket, e))?;
    let mut reply = String::new();
    BufReader::new(&stream)
        .read_line(&mut reply)
        .map_err(|e| Error::io("read", socket, e))?;
    let response: Response =
        serde_json::from_str(&reply).map_err(|e| reply_corrupt(socket, command, e))?;
    match response {
        Response::Ok(v) => Ok(Some(v)),
        Response::Err(f) => Err(Error::Conflict(format!(
            "daemon refused `{}`: {}",
            command.name(),
            f.message
        ))),
    }
}

fn reply_corrupt(socket: &Path, command: &Command, e: serde_json::Error) -> Error {
    Error::corrupt(
        "control reply",
        socket.display().to_string(),
        format!("`{}`: {e}", command.name()),
    )
}

/// Wait until the daemon with `pid` has its socket bound.
pub fn wait_for_socket(store: &Path, pid: u32, timeout: Duration) -> Option<PathBuf> {
    let path = store.join("run").join(format!("mountd-{pid}.sock"));
    let start = std::time::Instant::now();
    while start.elapsed() < timeout {
        if path.exists() {
            return Some(path);
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    None
}
