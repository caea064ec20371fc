//! Served generations: each is a pinned [`GenView`]. A generation is opened
//! (pin first, then verify the representation is still COMMITTED — done by
//! `GenView::open`) before anything of it is served, and stays pinned while
//! it is latest or while any user (a node, an open file, a directory
//! reading) holds it.

use crate::compose::GenView;
use crate::index::GenIndex;
use crate::{Result, Store};
use std::collections::HashMap;
use std::sync::{Arc, Mutex, PoisonError, Weak};
use std::time::{Duration, Instant};

/// The pin holder's name in pin markers.
const HOLDER: &str = "mountd";

/// One served generation: its pinned view.
pub struct Gen {
    pub set: String,
    pub generation: u64,
    pub view: GenView,
}

/// What [`Gens::keep_pins`] found for one served generation whose pin was
/// lost: taken again (`Ok`), or not (its readers may find its data swept).
pub struct PinRetaken {
    pub set: String,
    pub generation: u64,
    pub outcome: Result<()>,
}

/// Open generations by (set, generation), and the pinned latest per set.
pub struct Gens {
    store: Store,
    /// How long a resolved latest is trusted before the index is re-read.
    latest_fresh: Duration,
    open: Mutex<HashMap<(String, u64), Weak<Gen>>>,
    latest: Mutex<HashMap<String, (Instant, Arc<Gen>)>>,
}

impl Gens {
    /// Served generations of `store`; a set's latest is re-read from the
    /// index when the one resolved is older than `latest_fresh`.
    pub fn new(store: Store, latest_fresh: Duration) -> Gens {
        Gens {
            store,
            latest_fresh,
            open: Mutex::new(HashMap::new()),
            latest: Mutex::new(HashMap::new()),
        }
    }

    pub fn store(&self) -> &Store {
        &self.store
    }

    /// The served generation, opening (and pinning) it if nobody holds it.
    /// A generation the index has no committed record of is
    /// `Error::NotFound`.
    pub fn get(&self, set: &str, generation: u64) -> Result<Arc<Gen>> {
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
        let g = Arc::new(self.open_gen(set, generation)?);
        let mut open = self.open.lock().unwrap_or_else(PoisonError::into_inner);
        open.retain(|_, w| w.strong_count() > 0);
        Ok(open
            .entry(key)
            .or_insert_with(|| Arc::downgrade(&g))
            .upgrade()
            .unwrap_or(g))
    }

    fn open_gen(&self, set: &str, generation: u64) -> Result<Gen> {
        let view = GenView::open(&self.store, set, Some(generation), HOLDER)?;
        Ok(Gen {
            set: set.to_string(),
            generation,
            view,
        })
    }

    /// Stop handing the current view of `generation` to new users: the next
    /// user opens (and pins) whatever the index then selects. Current users
    /// keep theirs.
    pub fn forget_view(&self, set: &str, generation: u64) {
        self.open
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .remove(&(set.to_string(), generation));
    }

    /// Open `generation` afresh and serve the new view to new users.
    fn reopen(&self, set: &str, generation: u64) -> Result<Arc<Gen>> {
        let g = Arc::new(self.open_gen(set, generation)?);
        self.open
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .insert((set.to_string(), generation), Arc::downgrade(&g));
        Ok(g)
    }

    /// The latest generation of `set` (`None`: the set has none), re-read
    /// when the one resolved is older than the freshness given to [`Gens::new`].
    pub fn latest(&self, set: &str) -> Result<Option<Arc<Gen>>> {
        if let Some((at, g)) = self
            .latest
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .get(set)
        {
            if at.elapsed() < self.latest_fresh {
                return Ok(Some(g.clone()));
            }
        }
        self.refresh(set)
    }

    /// Re-read the index and pin the current latest of `set`. When the
    /// generation now reads from another representation (materialized), a
    /// fresh view is opened for new users; current users keep theirs.
    pub fn refresh(&self, set: &str) -> Result<Option<Arc<Gen>>> {
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

    /// Drop the pinned latest of every set (at shutdown, once no other
    /// user holds a generation: every pin is released).
    pub fn release(&self) {
        self.latest
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clear();
    }

    /// Generations some user or `latest` holds, with the manifest their
    /// current view reads (the view new users get).
    pub fn held_views(&self) -> Vec<(String, u64, String)> {
        let open = self.open.lock().unwrap_or_else(PoisonError::into_inner);
        open.iter()
            .filter_map(|((s, g), w)| {
                let view = w.upgrade()?;
                Some((s.clone(), *g, view.view.top().manifest_name.clone()))
            })
            .collect()
    }

    /// The generations of `set` held, in order.
    pub fn held(&self, set: &str) -> Vec<u64> {
        let mut gens: Vec<u64> = self
            .held_views()
            .into_iter()
            .filter(|(s, _, _)| s == set)
            .map(|(_, g, _)| g)
            .collect();
        gens.sort_unstable();
        gens
    }

    /// Keep the pin of every served generation held: a pin lost while this
    /// process stalled (a remote lease reclaimed by a sweep) is taken again
    /// if its representation is still committed. Returns each lost pin and
    /// whether it was taken again.
    pub fn keep_pins(&self) -> Vec<PinRetaken> {
        let held: Vec<Arc<Gen>> = {
            let open = self.open.lock().unwrap_or_else(PoisonError::into_inner);
            open.values().filter_map(Weak::upgrade).collect()
        };
        held.into_iter()
            .filter_map(|g| {
                let outcome = match g.view.pin.keep(&self.store) {
                    Ok(false) => return None,
                    Ok(true) => Ok(()),
                    Err(e) => Err(e),
                };
                Some(PinRetaken {
                    set: g.set.clone(),
                    generation: g.generation,
                    outcome,
                })
            })
            .collect()
    }

    /// Drop the cached segments and row groups of every served generation.
    pub fn shed(&self) {
        let held: Vec<Arc<Gen>> = {
            let open = self.open.lock().unwrap_or_else(PoisonError::into_inner);
            open.values().filter_map(Weak::upgrade).collect()
        };
        for g in held {
            g.view.shed();
        }
    }

    /// Number of generations currently pinned.
    pub fn pinned(&self) -> usize {
        let open = self.open.lock().unwrap_or_else(PoisonError::into_inner);
        open.values().filter(|w| w.strong_count() > 0).count()
    }
}
