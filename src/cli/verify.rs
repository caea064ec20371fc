//! `strata verify`: re-hash everything reachable from the selected
//! generations (`strata::verify`); exit 1 when it finds problems.

use super::args::VerifyArgs;
use super::render::print_json;
use strata::error::Result;
use strata::store::Store;
use strata::verify::Selection;

pub(crate) fn verify(store: &Store, a: VerifyArgs) -> Result<i32> {
    let sets = match a.set {
        Some(s) => vec![s],
        None => store.sets()?,
    };
    let sel = match (a.gen, a.all) {
        (Some(g), _) => Selection::One(g),
        (None, true) => Selection::All,
        (None, false) => Selection::Latest,
    };
    let report = strata::verify::verify(store, &sets, sel)?;
    let code = i32::from(!report.problems.is_empty());
    if a.json {
        print_json(&report)?;
        return Ok(code);
    }
    println!(
        "verified {} generation(s): {} manifests, {} segments, {} packs, {} blobs, {} rows",
        report.generations.len(),
        report.manifests,
        report.segments,
        report.packs,
        report.blobs,
        report.rows
    );
    for p in &report.problems {
        println!("PROBLEM {p}");
    }
    if code == 0 {
        println!("ok");
    }
    Ok(code)
}
