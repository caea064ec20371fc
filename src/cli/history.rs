//! `strata history`: the versions of one path, newest first.

use super::{print_json, render};
use clap::Args;
use serde::Serialize;
use std::collections::HashMap;
use std::ffi::OsString;
use std::io::Write;
use std::os::unix::ffi::OsStrExt;
use strata::error::Result;
use strata::row::normalize;
use strata::store::Store;

#[derive(Args)]
pub(crate) struct HistoryArgs {
    /// The set (one of `strata sets`)
    #[arg(long)]
    set: String,
    /// A path of the set (a file, symlink or directory)
    path: OsString,
    /// Print JSON instead of a table
    #[arg(long)]
    json: bool,
}

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
    let times: HashMap<u64, Option<i64>> = strata::history::committed(store, &a.set)?
        .into_iter()
        .collect();
    let entries: Vec<VersionEntry> = strata::history::versions(store, &a.set, &path)?
        .into_iter()
        .map(|v| VersionEntry {
            generation: v.generation,
            committed_ns: times.get(&v.generation).copied().flatten(),
            kind: v.row.kind.label(),
            mode: format!("{:04o}", v.row.mode),
            size: v.row.size,
            mtime_ns: v.row.mtime_ns,
            digest: v.row.digest.map(hex::encode),
            target: v.row.target.as_deref().map(strata::row::show),
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
