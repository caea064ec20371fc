//! `strata tag`, `strata untag` and `strata tags` (`strata::tag`).

use super::args::{TagArgs, TagsArgs, UntagArgs};
use super::render::{self, print_json};
use strata::error::Result;
use strata::store::Store;

pub(crate) fn tag(store: &Store, a: TagArgs) -> Result<i32> {
    let generation = strata::tag::tag(store, &a.set, &a.name, a.gen)?;
    println!("tagged {}@{generation} as {}", a.set, a.name);
    Ok(0)
}

pub(crate) fn untag(store: &Store, a: UntagArgs) -> Result<i32> {
    strata::tag::untag(store, &a.set, &a.name)?;
    println!("untagged {} of {}", a.name, a.set);
    Ok(0)
}

pub(crate) fn tags(store: &Store, a: TagsArgs) -> Result<i32> {
    let tags = strata::tag::list_of_set(store, &a.set)?;
    if a.json {
        return print_json(&tags);
    }
    let rows: Vec<Vec<String>> = tags
        .iter()
        .map(|t| {
            vec![
                t.name.clone(),
                t.generation.to_string(),
                render::time(t.created_ns),
            ]
        })
        .collect();
    println!("{}", render::table(&["TAG", "GEN", "CREATED (UTC)"], &rows));
    Ok(0)
}
