//! `strata ls`: a directory of a generation, or one entry
//! (`strata::browse::listing`), as `ls -l`-like lines or `--json`.

use super::args::LsArgs;
use super::render::{self, print_json};
use serde::Serialize;
use std::io::Write;
use std::os::unix::ffi::OsStrExt;
use strata::compose::GenView;
use strata::error::Result;
use strata::row::{show, Row};
use strata::store::Store;

/// One entry as `--json` shows it.
#[derive(Serialize)]
struct LsEntry {
    name: String,
    name_hex: String,
    kind: &'static str,
    mode: String,
    size: u64,
    mtime_ns: i64,
    digest: Option<String>,
    target: Option<String>,
    changed_gen: u64,
}

fn ls_entry(r: &Row) -> LsEntry {
    LsEntry {
        name: show(&r.name),
        name_hex: hex::encode(&r.name),
        kind: r.kind.label(),
        mode: format!("{:04o}", r.mode),
        size: r.size,
        mtime_ns: r.mtime_ns,
        digest: r.digest.map(hex::encode),
        target: r.target.as_deref().map(show),
        changed_gen: r.changed_gen,
    }
}

pub(crate) fn ls(store: &Store, a: LsArgs) -> Result<i32> {
    let view = GenView::open(store, &a.set, a.gen, "ls")?;
    let path = a.path.as_ref().map_or(&b""[..], |p| p.as_bytes());
    let rows = strata::browse::listing(&view, path)?;
    if a.json {
        return print_json(&rows.iter().map(ls_entry).collect::<Vec<_>>());
    }
    let mut out = std::io::stdout().lock();
    for r in &rows {
        let mut name = show(&r.name);
        if let Some(t) = &r.target {
            name = format!("{name} -> {}", show(t));
        }
        let _ = writeln!(
            out,
            "{} {:>12} {} {}",
            render::mode(r),
            r.size,
            render::time(r.mtime_ns),
            name
        );
    }
    Ok(0)
}
