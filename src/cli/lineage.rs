//! `strata lineage`: the budgeted ancestry walk (`strata::lineage::walk`)
//! rendered as a table and its end, or `--json`. Exit 0 for `complete` and
//! `parent-retired`, 1 for `broken-binding`, 4 for `budget-exceeded` (the
//! walk stopped before an answer, like any other bound reached).

use super::args::LineageArgs;
use super::render::{self, print_json};
use strata::error::Result;
use strata::lineage::{Lineage, LineageEnd};
use strata::store::Store;

pub(crate) fn lineage(store: &Store, a: LineageArgs) -> Result<i32> {
    let walked = strata::lineage::walk(store, &a.set, a.gen, a.budget)?;
    let code = exit_code(&walked.end);
    if a.json {
        print_json(&walked)?;
        return Ok(code);
    }
    print_lineage(&walked);
    Ok(code)
}

fn exit_code(end: &LineageEnd) -> i32 {
    match end {
        LineageEnd::Complete | LineageEnd::ParentRetired { .. } => 0,
        LineageEnd::BrokenBinding { .. } => 1,
        LineageEnd::BudgetExceeded { .. } => 4,
    }
}

fn print_lineage(l: &Lineage) {
    let dash = || "-".to_string();
    let rows: Vec<Vec<String>> = l
        .visited
        .iter()
        .map(|n| {
            vec![
                n.generation.to_string(),
                n.representation.label().to_string(),
                n.parent.map_or_else(dash, |p| p.to_string()),
                n.base.map_or_else(dash, |b| b.to_string()),
                n.manifest[..12.min(n.manifest.len())].to_string(),
            ]
        })
        .collect();
    let headers = ["GEN", "REP", "PARENT", "BASE", "MANIFEST"];
    println!("{}", render::table(&headers, &rows));
    println!("{}", end_line(l));
}

fn end_line(l: &Lineage) -> String {
    match &l.end {
        LineageEnd::Complete => format!(
            "complete: every binding holds from generation {} down to 1",
            l.from
        ),
        LineageEnd::ParentRetired { generation } => {
            format!("parent-retired: generation {generation} is retired; the bindings above it hold")
        }
        LineageEnd::BrokenBinding { generation, broken } => {
            format!("broken-binding: generation {generation}: {broken}")
        }
        LineageEnd::BudgetExceeded { budget, generation } => format!(
            "budget-exceeded: {budget} generation(s) examined, stopped before generation {generation} (raise --budget)"
        ),
    }
}
