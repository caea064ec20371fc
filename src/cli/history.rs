//! `strata history`: the versions of one path, newest first
//! (`strata::history::dated_versions`), as a table or `--json`.

use super::args::HistoryArgs;
use super::render::{self, print_json};
use serde::Serialize;
use std::io::Write;
use std::os::unix::ffi::OsStrExt;
use strata::error::Result;
use strata::row::normalize;
use strata::store::Store;

/// One version as `--json` shows it.
#[derive(Serialize)]
struct VersionEntry {
    /// The oldest committed generation holding this version.
    generation: u64,
    /// When that generation was committed.
    committed_ns: Option<i64>,
    kind: &'static str,
    mode: String,
    size: u64,
    mtime_ns: i64,
    digest: Option<String>,
    target: Option<String>,
}

pub(crate) fn history(store: &Store, a: HistoryArgs) -> Result<i32> {
    let path = normalize(a.path.as_bytes())?;
    let entries: Vec<VersionEntry> = strata::history::dated_versions(store, &a.set, &path)?
        .into_iter()
        .map(|d| VersionEntry {
            generation: d.version.generation,
            committed_ns: d.committed_ns,
            kind: d.version.row.kind.label(),
            mode: format!("{:04o}", d.version.row.mode),
            size: d.version.row.size,
            mtime_ns: d.version.row.mtime_ns,
            digest: d.version.row.digest.map(hex::encode),
            target: d.version.row.target.as_deref().map(strata::row::show),
        })
        .collect();
    if a.json {
        return print_json(&entries);
    }
    let rows: Vec<Vec<String>> = entries
        .iter()
        .map(|e| {
            vec![
                e.generation.to_string(),
                e.committed_ns.map_or("-".into(), render::time),
                e.kind.to_string(),
                e.mode.clone(),
                e.size.to_string(),
                e.digest.as_deref().map_or("-", |d| &d[..12]).to_string(),
                e.target.clone().unwrap_or_default(),
            ]
        })
        .collect();
    let headers = [
        "GEN",
        "COMMITTED (UTC)",
        "KIND",
        "MODE",
        "SIZE",
        "DIGEST",
        "TARGET",
    ];
    let _ = writeln!(
        std::io::stdout().lock(),
        "{}",
        render::table(&headers, &rows)
    );
    Ok(0)
}
