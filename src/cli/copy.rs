//! `strata copy`: committed generations to another store.

use super::args::CopyArgs;
use super::render::{self, print_json};
use strata::copy::{CopyOptions, CopySummary};
use strata::error::Result;
use strata::storage::StoreArgs;
use strata::store::Store;

pub(crate) fn copy(source: &Store, args: &StoreArgs, a: CopyArgs) -> Result<i32> {
    let mut to = args.clone();
    to.store = Some(a.to.clone());
    // The target's cache (for s3://) is its own, never the source's.
    to.cache_dir = None;
    let storage = to.location()?.create()?;
    super::count_requests(&storage);
    let (target, _) = Store::init(storage)?;
    let opts = CopyOptions {
        sets: a.set,
        generations: a.gen,
    };
    let summary = strata::copy::copy(source, &target, &opts)?;
    if a.json {
        return print_json(&summary);
    }
    print_summary(&a.to, &summary);
    Ok(0)
}

fn print_summary(to: &str, s: &CopySummary) {
    for set in &s.sets {
        println!(
            "set {}: {} generation(s) copied {:?}, {} already there, {} recorded retired, {} tag(s)",
            set.set,
            set.copied.len(),
            set.copied,
            set.present,
            set.retired.len(),
            set.tags
        );
    }
    println!(
        "sent {} object(s) ({}) to {to}; {} already there",
        s.objects_sent,
        render::bytes(s.bytes_sent),
        s.objects_present
    );
}
