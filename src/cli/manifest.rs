//! `strata manifest`: the manifest a generation reads through, as JSON:
//! whole (as this strata reads it), or with `--redacted` the boundary-safe
//! render (`strata::redact`) without paths, keys, prefixes, the set name or
//! the commit message.

use super::args::ManifestArgs;
use super::render::print_json;
use strata::error::{Error, Result};
use strata::index::GenIndex;
use strata::store::Store;

pub(crate) fn manifest(store: &Store, a: ManifestArgs) -> Result<i32> {
    let index = GenIndex::new(store, &a.set);
    let record = match a.gen {
        Some(g) => index.load(g)?,
        None => index.latest()?.ok_or_else(|| Error::NotFound {
            what: "set with a committed generation",
            name: a.set.clone(),
        })?,
    };
    let (name, manifest) = strata::lineage::selected_manifest(store, &record)?;
    if a.redacted {
        return print_json(&strata::redact::redacted(&name, &manifest));
    }
    print_json(&manifest)
}
