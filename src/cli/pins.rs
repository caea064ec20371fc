//! `strata pins`: read pins with holder and liveness (`strata::pin::list`),
//! as a table or `--json`.

use super::args::JsonArg;
use super::render::{self, print_json};
use strata::error::Result;
use strata::store::Store;

pub(crate) fn pins(store: &Store, a: JsonArg) -> Result<i32> {
    let pins = strata::pin::list(store)?;
    if a.json {
        return print_json(&pins);
    }
    let rows: Vec<Vec<String>> = pins
        .iter()
        .map(|p| {
            let state = serde_json::to_value(p.state)
                .ok()
                .and_then(|v| v.as_str().map(str::to_string))
                .unwrap_or_default();
            vec![
                state,
                p.set.clone(),
                p.generation.to_string(),
                p.representation.clone(),
                render::time(p.since_ns),
                p.holder.clone(),
            ]
        })
        .collect();
    println!(
        "{}",
        render::table(
            &["STATE", "SET", "GEN", "REP", "SINCE (UTC)", "HOLDER"],
            &rows
        )
    );
    Ok(0)
}
