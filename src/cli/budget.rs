//! `strata budget`: show or change the disk budget (src/budget.rs).

use super::args::BudgetArgs;
use super::render::{self, print_json};
use strata::budget::{self, Budget};
use strata::error::{Error, Result};
use strata::store::Store;

pub(crate) fn budget(store: &Store, root: &std::path::Path, a: BudgetArgs) -> Result<i32> {
    let mut b = budget::load(store)?;
    if a.min_free.is_some() || a.max_store.is_some() {
        b = budget::update(store, |mut b| {
            if let Some(v) = &a.min_free {
                set_floor(&mut b, v)?;
            }
            if let Some(v) = &a.max_store {
                b.max_store_bytes = match v.as_str() {
                    "none" => None,
                    size => Some(strata::storage::parse_size(size).map_err(Error::Invalid)?),
                };
            }
            Ok(b)
        })?;
    }
    let (free, total) = strata::os::filesystem_space(root)?;
    let used = budget::store_bytes(store)?;
    if a.json {
        return print_json(&serde_json::json!({ "budget": b, "free_bytes": free,
            "filesystem_bytes": total, "store_bytes": used }));
    }
    let floor = match b.min_free_bytes {
        Some(n) => render::bytes(n),
        None => format!("{}% of {}", b.min_free_percent, render::bytes(total)),
    };
    println!(
        "free-space floor: {floor} (free now: {})",
        render::bytes(free)
    );
    let limit = b.max_store_bytes.map_or("none".into(), render::bytes);
    println!(
        "store size limit: {limit} (objects now: {})",
        render::bytes(used)
    );
    Ok(0)
}

fn set_floor(b: &mut Budget, v: &str) -> Result<()> {
    match v.strip_suffix('%') {
        Some(pct) => {
            b.min_free_percent = pct
                .parse()
                .map_err(|_| Error::Invalid(format!("not a percent: min-free=`{v}`")))?;
            b.min_free_bytes = None;
        }
        None => b.min_free_bytes = Some(strata::storage::parse_size(v).map_err(Error::Invalid)?),
    }
    Ok(())
}
