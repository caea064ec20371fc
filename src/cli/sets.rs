//! `strata sets`: the sets of the store with their latest generation
//! (`strata::log::sets`), as a table or `--json`.

use super::args::JsonArg;
use super::render::{self, print_json};
use strata::error::Result;
use strata::store::Store;

pub(crate) fn sets(store: &Store, a: JsonArg) -> Result<i32> {
    let sets = strata::log::sets(store)?;
    if a.json {
        let v: Vec<_> = sets
            .iter()
            .map(|(s, l)| {
                serde_json::json!({ "set": s, "latest": l.map(|x| x.generation),
                    "files": l.map(|x| x.files), "bytes": l.map(|x| x.bytes) })
            })
            .collect();
        return print_json(&v);
    }
    let rows: Vec<Vec<String>> = sets
        .iter()
        .map(|(s, l)| {
            vec![
                s.clone(),
                l.map_or("-".into(), |x| x.generation.to_string()),
                l.map_or("-".into(), |x| x.files.to_string()),
                l.map_or("-".into(), |x| render::bytes(x.bytes)),
            ]
        })
        .collect();
    println!(
        "{}",
        render::table(&["SET", "LATEST", "FILES", "BYTES"], &rows)
    );
    Ok(0)
}
