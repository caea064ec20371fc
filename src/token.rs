//! Owner/attempt tokens: 128 random bits, hex. Every staged or leased name
//! carries one so that a deleted name is never written again; and the
//! private files named by them.

use crate::error::{IoContext, Result};
use rand::RngCore;
use std::fs::{File, OpenOptions};
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};

pub fn new_token() -> String {
    let mut b = [0u8; 16];
    rand::rng().fill_bytes(&mut b);
    hex::encode(b)
}

/// Create `path` new (never an existing file), readable and writable by
/// the owner only.
pub fn create_private(path: &Path) -> Result<File> {
    OpenOptions::new()
        .read(true)
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(path)
        .ctx("create", path)
}

/// A private file in `dir` named `{prefix}-{token}.tmp`.
pub fn fresh_file(dir: &Path, prefix: &str) -> Result<(PathBuf, File)> {
    let path = dir.join(format!("{prefix}-{}.tmp", new_token()));
    let file = create_private(&path)?;
    Ok((path, file))
}

/// Nanoseconds since the Unix epoch.
pub fn now_ns() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_nanos() as i64)
        .unwrap_or(0)
}
