//! Which readdirplus entries carry attributes.
//!
//! The kernel makes an inode and a dentry for every readdirplus entry that
//! carries a node id: about 2.5 µs of kernel time each, and memory until
//! reclaim. That is wasted on a walk that only reads names (`find`,
//! `find -name`, `ls -f`) and saves a lookup round trip per entry on one
//! that stats or opens what it lists (`ls -l`, `find -printf '%s'`, `du`,
//! `grep -r`). So directory entries always carry attributes (every walker
//! descends through them), and other entries go bare (node id zero, real
//! `d_ino` and type; the kernel looks the name up if something needs it)
//! to a caller that has not shown that it uses them.
//!
//! The kernel keeps every listing it fetched (names only) and serves later
//! reads of the directory from it, so a caller that stats would find no
//! attributes there if the listing was fetched bare, and would look up
//! every entry. Directories listed bare are remembered, and when a caller
//! that stats looks something up, the kernel is told to drop the kept
//! listings of all of them (fs.rs, `drop_listings`): their next reading
//! fetches them again, this time with attributes.
//!
//! A caller is the thread id in the request header. It has shown that it
//! uses what it lists once its lookups of non-directory entries reach
//! [`MIN_LOOKUPS`] and a quarter of the bare entries it was sent; from then
//! on it gets attributes for everything. So does every later caller of the
//! same job (process group) while it reads what it lists:
//! `xargs -P8 -n1 grep -r`, `parallel` or a script's loop start a new
//! process per directory, each of which would otherwise look up every
//! entry of the one directory it reads before it showed its habit (and
//! push_ahead.rs can only push into inodes the kernel holds). A caller of
//! such a job that goes on to list another directory without reading a
//! file since (`find`, `ls -R`) is listed bare from then on, so a walk that
//! reads names only pays for one directory's attributes.
//!
//! What is remembered is bounded: past [`CAPACITY`] callers, the least
//! recently seen one is forgotten, and past as many jobs the record of jobs
//! starts over. The choice only moves work between readdirplus and lookup;
//! both give the same attributes, so it never changes what a reader sees.

use crate::inode_set::InodeSet;
use std::collections::{HashMap, HashSet};
use std::sync::{Mutex, PoisonError};

/// Callers remembered at most.
const CAPACITY: usize = 1024;
/// Lookups a caller makes before it can count as one that stats.
const MIN_LOOKUPS: u64 = 8;
/// Directories listed bare remembered at most; past it the record starts
/// over (a forgotten one only costs a caller that stats its lookups).
const DIR_CAPACITY: usize = 1 << 16;

#[derive(Default)]
struct Habit {
    /// Non-directory entries listed to this caller without attributes.
    bare: u64,
    /// Lookups of non-directory entries by this caller.
    looked_up: u64,
    /// When this caller was last seen (a tick of [`Callers`]).
    seen: u64,
    /// The caller's process group, if it can be known.
    job: Option<u32>,
    /// The directory last listed to this caller with attributes on its
    /// job's account (its own habit does not stat).
    trial_dir: Option<u64>,
    /// Whether this caller has read a file since `trial_dir` was listed.
    read_since: bool,
}

impl Habit {
    fn stats(&self) -> bool {
        self.looked_up >= MIN_LOOKUPS && self.looked_up.saturating_mul(4) >= self.bare
    }
}

struct Callers {
    by_pid: HashMap<u32, Habit>,
    tick: u64,
    /// Directory inodes whose kept listing may have been fetched bare.
    bare_dirs: InodeSet,
    /// Process groups a caller of which stats what it lists.
    statting_jobs: HashSet<u32>,
}

impl Default for Callers {
    fn default() -> Self {
        Callers {
            by_pid: HashMap::new(),
            tick: 0,
            bare_dirs: InodeSet::new(DIR_CAPACITY),
            statting_jobs: HashSet::new(),
        }
    }
}

/// The process group of thread `pid`; `None` for pid 0 (a request the
/// kernel makes itself, or from a pid namespace the daemon cannot see) or
/// a thread already gone.
fn process_group(pid: u32) -> Option<u32> {
    let pid = libc::pid_t::try_from(pid).ok().filter(|p| *p > 0)?;
    // SAFETY: getpgid has no preconditions; it fails for an unknown pid.
    let group = unsafe { libc::getpgid(pid) };
    u32::try_from(group).ok().filter(|g| *g > 0)
}

/// What each recent caller does with the entries it is listed.
#[derive(Default)]
pub(crate) struct StatHabits {
    callers: Mutex<Callers>,
}

impl StatHabits {
    fn lock(&self) -> std::sync::MutexGuard<'_, Callers> {
        self.callers.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Whether non-directory entries of directory `dir` listed to `pid`
    /// should carry attributes.
    pub(crate) fn wants_attrs(&self, pid: u32, dir: u64) -> bool {
        let mut callers = self.lock();
        let habit = callers.habit(pid);
        if habit.stats() {
            return true;
        }
        let job = habit.job;
        if !job.is_some_and(|j| callers.statting_jobs.contains(&j)) {
            return false;
        }
        let Some(habit) = callers.by_pid.get_mut(&pid) else {
            return false;
        };
        let reads = habit.trial_dir.is_none_or(|d| d == dir || habit.read_since);
        if reads && habit.trial_dir != Some(dir) {
            habit.trial_dir = Some(dir);
            habit.read_since = false;
        }
        reads
    }

    /// `pid` read the start of a file.
    pub(crate) fn read(&self, pid: u32) {
        if let Some(habit) = self.lock().by_pid.get_mut(&pid) {
            habit.read_since = true;
        }
    }

    /// `n` non-directory entries of directory `dir` were listed to `pid`
    /// without attributes.
    pub(crate) fn listed_bare(&self, pid: u32, dir: u64, n: u64) {
        if n == 0 {
            return;
        }
        let mut callers = self.lock();
        callers.bare_dirs.insert(dir);
        let habit = callers.habit(pid);
        habit.bare = habit.bare.saturating_add(n);
    }

    /// `pid` looked up a non-directory entry (also one it was never listed
    /// by the daemon: the kernel may have served it a kept listing).
    /// Returns the directories whose kept listings went out bare once `pid`
    /// stats what it lists (then they are forgotten here): the kernel is
    /// to drop those listings, so they are fetched again with attributes.
    pub(crate) fn looked_up(&self, pid: u32) -> Vec<u64> {
        let mut callers = self.lock();
        let habit = callers.habit(pid);
        habit.looked_up = habit.looked_up.saturating_add(1);
        if !habit.stats() {
            return Vec::new();
        }
        if let Some(job) = habit.job {
            if callers.statting_jobs.len() >= CAPACITY {
                callers.statting_jobs.clear();
            }
            callers.statting_jobs.insert(job);
        }
        callers.bare_dirs.take_all()
    }

    /// Callers currently remembered.
    #[cfg(test)]
    fn len(&self) -> usize {
        self.lock().by_pid.len()
    }
}

impl Callers {
    /// The habit of `pid`, marked as just seen; a new caller past
    /// [`CAPACITY`] replaces the least recently seen one.
    fn habit(&mut self, pid: u32) -> &mut Habit {
        self.tick += 1;
        if self.by_pid.len() >= CAPACITY && !self.by_pid.contains_key(&pid) {
            let oldest = self.by_pid.iter().min_by_key(|(_, h)| h.seen);
            if let Some(&old) = oldest.map(|(pid, _)| pid) {
                self.by_pid.remove(&old);
            }
        }
        let habit = self.by_pid.entry(pid).or_insert_with(|| Habit {
            job: process_group(pid),
            ..Habit::default()
        });
        habit.seen = self.tick;
        habit
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Caller `n` as a thread id no process has (above Linux's largest
    /// `pid_max`), so it belongs to no job.
    fn c(n: u32) -> u32 {
        (1 << 23) + n
    }

    #[test]
    fn a_caller_that_only_reads_names_stays_bare() {
        let h = StatHabits::default();
        assert!(!h.wants_attrs(c(7), 1));
        h.listed_bare(c(7), 1, 1000);
        // find descends directories, which are never bare: no lookups here.
        assert!(!h.wants_attrs(c(7), 1));
        h.listed_bare(c(7), 1, 1000);
        assert!(!h.wants_attrs(c(7), 1));
    }

    #[test]
    fn a_caller_that_stats_what_it_lists_gets_attributes() {
        let h = StatHabits::default();
        h.listed_bare(c(7), 1, 40);
        for _ in 0..9 {
            h.looked_up(c(7));
        }
        assert!(!h.wants_attrs(c(7), 1), "9 of 40 is under a quarter");
        h.looked_up(c(7));
        assert!(h.wants_attrs(c(7), 1));
        assert!(!h.wants_attrs(c(8), 1), "habits are per caller");
    }

    #[test]
    fn bare_kept_listings_are_dropped_once_for_a_caller_that_stats() {
        let h = StatHabits::default();
        h.listed_bare(c(7), 100, 50);
        assert!(
            h.looked_up(c(7)).is_empty(),
            "the caller that read names only"
        );
        h.listed_bare(c(8), 200, 1);
        for _ in 1..MIN_LOOKUPS {
            assert!(h.looked_up(c(8)).is_empty(), "not a habit yet");
        }
        let mut dropped = h.looked_up(c(8));
        dropped.sort();
        assert_eq!(dropped, [100, 200], "listed bare: fetch again");
        assert!(
            h.looked_up(c(8)).is_empty(),
            "fetched again with attributes"
        );
        h.listed_bare(c(7), 300, 5);
        assert_eq!(h.looked_up(c(8)), [300], "listed bare since");
    }

    #[test]
    fn a_few_lookups_are_not_a_habit() {
        let h = StatHabits::default();
        h.listed_bare(c(7), 1, 4);
        for _ in 0..(MIN_LOOKUPS - 1) {
            h.looked_up(c(7));
        }
        assert!(!h.wants_attrs(c(7), 1));
    }

    #[test]
    fn a_caller_served_from_kept_listings_is_known_by_its_lookups() {
        let h = StatHabits::default();
        h.listed_bare(c(7), 100, 50);
        // Caller 9 reads directory 100 from the kernel's kept listing (the
        // daemon sees no readdir) and stats its entries.
        for _ in 1..MIN_LOOKUPS {
            h.looked_up(c(9));
        }
        assert_eq!(h.looked_up(c(9)), [100]);
        assert!(h.wants_attrs(c(9), 1));
    }

    #[test]
    fn a_later_caller_of_a_job_that_stats_gets_attributes_while_it_reads() {
        use std::os::unix::process::CommandExt;
        use std::process::Command;
        let h = StatHabits::default();
        // This test's process, in the job of the processes it starts,
        // stats what it lists.
        let me = std::process::id();
        h.listed_bare(me, 1, 10);
        for _ in 0..MIN_LOOKUPS {
            h.looked_up(me);
        }
        let mut same = Command::new("sleep").arg("60").spawn().unwrap();
        let mut other = Command::new("sleep")
            .arg("60")
            .process_group(0)
            .spawn()
            .unwrap();
        let (later, elsewhere) = (same.id(), other.id());
        assert!(!h.wants_attrs(elsewhere, 2), "a caller of another job");
        assert!(h.wants_attrs(later, 2), "a later caller of the job");
        assert!(h.wants_attrs(later, 2), "the rest of the same listing");
        h.read(later);
        assert!(h.wants_attrs(later, 3), "it read from what it listed");
        assert!(!h.wants_attrs(later, 4), "listing on without reading");
        h.read(later);
        assert!(h.wants_attrs(later, 5), "reading again");
        for child in [&mut same, &mut other] {
            child.kill().unwrap();
            child.wait().unwrap();
        }
    }

    #[test]
    fn memory_is_bounded_and_the_least_recent_caller_goes_first() {
        let h = StatHabits::default();
        h.listed_bare(c(0), 1, 1);
        for _ in 0..MIN_LOOKUPS {
            h.looked_up(c(0));
        }
        for pid in 1..CAPACITY as u32 {
            h.listed_bare(c(pid), 1, 1);
        }
        // Caller 0 is listed again, so caller 1 is now the least recent.
        h.listed_bare(c(0), 1, 1);
        h.listed_bare(c(CAPACITY as u32), 1, 1);
        assert_eq!(h.len(), CAPACITY);
        assert!(h.wants_attrs(c(0), 1));
        assert!(
            !h.lock().by_pid.contains_key(&c(1)),
            "caller 1 was forgotten"
        );
    }
}
