//! Client side of the control socket (docs/CONTROL.md): find the daemons of
//! a store without flags and ask them. Used by the CLI and by the mount
//! table's check of whether a daemon still serves a mount.

use crate::error::{Error, Result};
use serde_json::{json, Value};
use std::io::{BufRead, BufReader, Write};
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::time::Duration;

/// Protocol version this client speaks.
pub const PROTOCOL_VERSION: u32 = 1;
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
pub fn ask(socket: &Path, command: &str) -> Result<Option<Value>> {
    ask_within(socket, command, TIMEOUT)
}

/// [`ask`] with its own reply timeout.
pub fn ask_within(socket: &Path, command: &str, timeout: Duration) -> Result<Option<Value>> {
    let request = json!({ "version": PROTOCOL_VERSION, "command": command });
    ask_request(socket, &request, Some(timeout))
}

/// Send one request (its `version` is set here); wait for the reply up to
/// `timeout` (`None`: as long as the daemon works on it).
pub fn ask_request(
    socket: &Path,
    request: &Value,
    timeout: Option<Duration>,
) -> Result<Option<Value>> {
    let mut request = request.clone();
    request["version"] = json!(PROTOCOL_VERSION);
    let command = request["command"].as_str().unwrap_or("?").to_string();
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
    let mut line = serde_json::to_vec(&request).map_err(|e| Error::Internal(e.to_string()))?;
    line.push(b'\n');
    (&stream)
        .write_all(&line)
        .map_err(|e| Error::io("write", socket, e))?;
    let mut reply = String::new();
    BufReader::new(&stream)
        .read_line(&mut reply)
        .map_err(|e| Error::io("read", socket, e))?;
    let v: Value = serde_json::from_str(&reply).map_err(|e| {
        Error::corrupt("control reply", socket.display().to_string(), e.to_string())
    })?;
    if v["ok"] != true {
        return Err(Error::Conflict(format!(
            "daemon refused `{command}`: {}",
            v["error"]["message"].as_str().unwrap_or("no message")
        )));
    }
    Ok(Some(v["result"].clone()))
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
