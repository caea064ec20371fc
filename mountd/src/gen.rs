//! Served generations: `strata::mount_tree::Gens` (one pinned `GenView`
//! per (set, generation), shared by every node and handle that uses it;
//! the pinned latest per set), with the daemon's freshness of `latest` and
//! the log of pins the refresher had to take again.

use std::time::Duration;
pub(crate) use strata::mount_tree::{Gen, Gens};
use tracing::{error, warn};

/// How long a resolved `latest` is trusted before the index is re-read.
pub(crate) const LATEST_FRESH: Duration = Duration::from_millis(300);

/// Keep the pin of every served generation held (`Gens::keep_pins`),
/// logging each pin that was lost: taken again, or not (its readers may
/// find its data swept).
pub(crate) fn keep_pins(gens: &Gens) {
    for lost in gens.keep_pins() {
        let (set, g) = (&lost.set, lost.generation);
        match lost.outcome {
            Ok(()) => warn!("{set}@{g}: its pin was lost; pinned again"),
            Err(e) => error!(
                "{set}@{g}: its pin was lost and cannot be taken again: {}",
                strata::cli_chain(&e)
            ),
        }
    }
}
