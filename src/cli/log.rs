//! `strata log`: the generations of a set (`strata::log::entries`), newest
//! first, as a table or `--json`.

use super::args::LogArgs;
use super::render::{self, print_json};
use strata::error::Result;
use strata::store::Store;

pub(crate) fn log(store: &Store, a: LogArgs) -> Result<i32> {
    let entries = strata::log::entries(store, &a.set, a.all)?;
    if a.json {
        return print_json(&entries);
    }
    let rows: Vec<Vec<String>> = entries
        .iter()
        .map(|e| {
            vec![
                e.generation.to_string(),
                e.state.to_string(),
                e.representation.to_string(),
                e.base.map_or("-".into(), |b| b.to_string()),
                e.files.to_string(),
                render::bytes(e.bytes),
                e.committed_ns.map_or("-".into(), render::time),
                e.identity[..12.min(e.identity.len())].to_string(),
                e.message.clone().unwrap_or_default(),
            ]
        })
        .collect();
    let headers = [
        "GEN",
        "STATE",
        "REP",
        "BASE",
        "FILES",
        "BYTES",
        "COMMITTED (UTC)",
        "IDENTITY",
        "MESSAGE",
    ];
    println!("{}", render::table(&headers, &rows));
    Ok(0)
}
