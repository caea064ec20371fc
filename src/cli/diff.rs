//! `strata diff`: paths added (A), removed (D) and changed (M) between two
//! generations (`strata::diff`), or `--json`.

use super::args::DiffArgs;
use super::render::print_json;
use std::io::Write;
use strata::compose::GenView;
use strata::diff::Change;
use strata::error::Result;
use strata::store::Store;

pub(crate) fn diff(store: &Store, a: DiffArgs) -> Result<i32> {
    let va = GenView::open(store, &a.set, Some(a.a), "diff")?;
    let vb = GenView::open(store, &a.set, Some(a.b), "diff")?;
    let entries = strata::diff::diff(&va, &vb)?;
    if a.json {
        return print_json(&entries);
    }
    let mut out = std::io::stdout().lock();
    for e in &entries {
        let c = match e.change {
            Change::Added => 'A',
            Change::Removed => 'D',
            Change::Changed => 'M',
        };
        let _ = writeln!(out, "{c} {}", e.path);
    }
    Ok(0)
}
