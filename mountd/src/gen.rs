//! Served generations: each is a pinned [`GenView`]. A generation is opened
//! (pin first, then verify the representation is still COMMITTED — done by
//! `GenView::open`) before anything of it is served, and stays pinned while
//! it is latest or while any node, open file or directory handle holds it.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, PoisonError, Weak};
use std::time::{Duration, Instant};
use strata::compose::GenView;
use strata::index::GenIndex;
use strata::{Result, Store};
use tracing::{error, warn};

/// How long a resolved `latest` is trusted before the index is re-read.
pub(crate) const LATEST_FRESH: Duration = Duration::from_millis(300);

pub(crate) struct Gen {
    pub(crate) set: String,
    pub(crate) generation: u64,
    pub(crate) view: GenView,
}

/// Open generations by (set, generation), and the pinned latest per set.
pub(crate) struct Gens {
    store: Store,
    open: Mutex<HashMap<(String, u64), Weak<Gen>>>,
    latest: Mutex<HashMap<String, (Instant, Arc<Gen>)>>,
}

impl Gens {
    pub(crate) fn new(store: Store) -> Gens {
        Gens {
            store,
            open: Mutex::new(HashMap::new()),
            latest: Mutex::new(HashMap::new()),
        }
    }

    pub(crate) fn store(&self) -> &Store {
        &self.store
    }

    /// The served generation, opening (and pinning) it if nobody holds it.
    pub(crate) fn get(&self, set: &str, generation: u64) -> Result<Arc<Gen>> {
        let key = (set.to_string(), generation);
        if let Some(g) = self
            .open
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .get(&key)
            .and_then(Weak::upgrade)
        {
            return Ok(g);
        }
        let view = GenView::open(&self.store, set, Some(generation), "mountd")?;
        let g = Arc::new(Gen {
            set: set.to_string(),
            generation,
            view,
        });
        let mut open = self.open.lock().unwrap_or_else(PoisonError::into_inner);
        open.retain(|_, w| w.strong_count() > 0);
        Ok(open
            .entry(key)
            .or_insert_with(|| Arc::downgrade(&g))
            .upgrade()
            .unwrap_or(g))
    }

    /// Stop handing the current view of `generation` to new users: the next
    /// user opens (and pins) whatever the index then selects. Current users
    /// keep theirs.
    pub(crate) fn forget_view(&self, set: &str, generation: u64) {
        self.open
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .remove(&(set.to_string(), generation));
    }

    /// Open `generation` afresh and serve the new view to new users.
    fn reopen(&self, set: &str, generation: u64) -> Result<Arc<Gen>> {
        let view = GenView::open(&self.store, set, Some(generation), "mountd")?;
        let g = Arc::new(Gen {
            set: set.to_string(),
            generation,
            view,
        });
        self.open
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .insert((set.to_string(), generation), Arc::downgrade(&g));
        Ok(g)
    }

    /// The latest generation of `set`, re-read when older than [`LATEST_FRESH`].
    pub(crate) fn latest(&self, set: &str) -> Result<Option<Arc<Gen>>> {
        if let Some((at, g)) = self
            .latest
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .get(set)
        {
            if at.elapsed() < LATEST_FRESH {
                return Ok(Some(g.clone()));
            }
        }
        self.refresh(set)
    }

    /// Re-read the index and pin the current latest of `set`. When the
    /// generation now reads from another representation (materialized), a
    /// fresh view is opened for new users; current users keep theirs.
    pub(crate) fn refresh(&self, set: &str) -> Result<Option<Arc<Gen>>> {
        let Some(record) = GenIndex::new(&self.store, set).latest()? else {
            return Ok(None);
        };
        let mut g = self.get(set, record.generation)?;
        let selected = record.read_rep().map(|r| r.manifest.as_str());
        if selected != Some(g.view.top().manifest_name.as_str()) {
            g = self.reopen(set, record.generation)?;
        }
        self.latest
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .insert(set.to_string(), (Instant::now(), g.clone()));
        Ok(Some(g))
    }

    /// Drop the pinned latest of every set (at shutdown, after the session
    /// ended, so no node holds a generation any more: every pin is released).
    pub(crate) fn release(&self) {
        self.latest
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clear();
    }

    /// Generations some node, handle or `latest` of this daemon holds, with
    /// the manifest their current view reads (the view new users get).
    pub(crate) fn held_views(&self) -> Vec<(String, u64, String)> {
        let open = self.open.lock().unwrap_or_else(PoisonError::into_inner);
        open.iter()
            .filter_map(|((s, g), w)| {
                let view = w.upgrade()?;
                Some((s.clone(), *g, view.view.top().manifest_name.clone()))
            })
            .collect()
    }

    /// Keep the pin of every served generation held: a pin lost while this
    /// daemon stalled (a remote lease reclaimed by a sweep) is taken again
    /// if its representation is still committed; what cannot be re-pinned
    /// is reported (its readers may find its data swept).
    pub(crate) fn keep_pins(&self) {
        let held: Vec<Arc<Gen>> = {
            let open = self.open.lock().unwrap_or_else(PoisonError::into_inner);
            open.values().filter_map(Weak::upgrade).collect()
        };
        for g in held {
            match g.view.pin.keep(&self.store) {
                Ok(false) => {}
                Ok(true) => warn!("{}@{}: its pin was lost; pinned again", g.set, g.generation),
                Err(e) => error!(
                    "{}@{}: its pin was lost and cannot be taken again: {}",
                    g.set,
                    g.generation,
                    strata::cli_chain(&e)
                ),
            }
        }
    }

    /// Number of generations currently pinned by this daemon.
    pub(crate) fn pinned(&self) -> usize {
        let open = self.open.lock().unwrap_or_else(PoisonError::into_inner);
        open.values().filter(|w| w.strong_count() > 0).count()
    }
}
