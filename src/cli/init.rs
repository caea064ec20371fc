//! `strata init`: create a store (idempotent).

use strata::error::Result;
use strata::storage::StoreArgs;
use strata::store::Store;

pub(crate) fn init(cli_store: &StoreArgs) -> Result<i32> {
    let storage = cli_store.location()?.create()?;
    let described = storage.describe();
    let (_, created) = Store::init(storage)?;
    let verb = if created {
        "initialized"
    } else {
        "already initialized"
    };
    println!("store {verb}: {described}");
    Ok(0)
}
