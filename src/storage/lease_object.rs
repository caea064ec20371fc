//! Leases without flock: lease objects renewed by conditional update.
//!
//! A lease object's body is `{holder, token, counter, ttl_ms, released}`.
//! Its holder renews it every ttl/4 with a PUT `If-Match` on the version it
//! last wrote and `counter + 1`; the body always changes, so its content
//! ETag never repeats (no ABA). Another party treats a lease as dead only
//! after observing the same token and counter for a whole ttl on its *own*
//! monotonic clock (no clocks are compared across machines), and takes it
//! over with the same conditional PUT. A released lease is free at once.
//!
//! Renewals never hold a lease's state across a request: each is one
//! attempt bounded by a quarter ttl, all held leases renewed at once.
//!
//! Fencing: a holder measures from the moment it *sent* its last successful
//! renewal, on CLOCK_BOOTTIME (which counts a suspended host's sleep). No
//! one takes the lease over before that moment plus a ttl. Past half the
//! ttl without a confirmed renewal, [`Lease::check`] renews synchronously
//! and fails with `Fenced` if that does not succeed; otherwise it answers
//! the deadline (7/8 of the ttl after that moment) that the caller puts up
//! as a [`super::fence`] around its writes.

use super::remote::{Put, Remote};
use super::{fence, Lease, LeaseState, TryLease};
use crate::error::{Error, Result};
use bytes::Bytes;
use object_store::{PutMode, UpdateVersion};
use serde::{Deserialize, Serialize};
use std::collections::HashMap;
use std::sync::{Arc, Mutex, PoisonError, Weak};
use std::time::{Duration, Instant};

const LEASE_TAG: &str = "strata-lease";
/// 1: initial lease object.
const LEASE_VERSION: u32 = 1;
const MAX_LEASE_BYTES: u64 = 64 << 10;
/// A lease body's ttl is believed up to this long (a larger one would make
/// a dead holder's lease undecidable).
const MAX_TTL: Duration = Duration::from_secs(3600);
/// Leases renewed at once by the renewal thread.
const RENEW_PARALLEL: usize = 16;

/// The holder's clock: CLOCK_BOOTTIME, which keeps counting while the host
/// is suspended, so a holder that slept through its ttl knows it.
/// `None` if the clock cannot be read (a lease then counts as stale).
fn boottime() -> Option<Duration> {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: clock_gettime writes one timespec we own.
    if unsafe { libc::clock_gettime(libc::CLOCK_BOOTTIME, &mut ts) } != 0 {
        return None;
    }
    Some(Duration::new(
        ts.tv_sec.max(0) as u64,
        ts.tv_nsec.clamp(0, 999_999_999) as u32,
    ))
}

#[derive(Debug, Clone, Serialize, Deserialize)]
struct Body {
    #[serde(rename = "type")]
    tag: String,
    version: u32,
    holder: String,
    token: String,
    counter: u64,
    ttl_ms: u64,
    released: bool,
}

impl Body {
    fn encode(&self) -> Bytes {
        Bytes::from(serde_json::to_vec(self).unwrap_or_default())
    }

    fn decode(key: &str, bytes: &[u8]) -> Result<Body> {
        crate::format::parse_versioned("lease object", key, LEASE_TAG, LEASE_VERSION, bytes)
    }

    fn next(&self, released: bool) -> Body {
        Body {
            counter: self.counter.saturating_add(1),
            released,
            ..self.clone()
        }
    }
}

/// A lease this process holds.
#[derive(Debug)]
struct Held {
    body: Body,
    version: UpdateVersion,
    /// When the last successful renewal (or the acquisition) was sent, on
    /// the holder's clock ([`boottime`]).
    sent: Duration,
    /// A renewal whose outcome is unknown: its counter and when it was
    /// first sent (a later confirmation counts from then).
    pending: Option<(u64, Duration)>,
    /// Someone else wrote the lease: it is gone for good.
    lost: bool,
    released: bool,
}

impl Held {
    fn age(&self) -> Duration {
        boottime().map_or(Duration::MAX, |now| now.saturating_sub(self.sent))
    }

    /// A renewal, or the release, to send now: the body, the version it
    /// replaces, and when this counter was first sent.
    fn attempt(&mut self, released: bool) -> (Body, UpdateVersion, Duration) {
        let next = self.body.next(released);
        let sent = match self.pending {
            Some((counter, sent)) if counter == next.counter => sent,
            _ => boottime().unwrap_or_default(),
        };
        self.pending = Some((next.counter, sent));
        (next, self.version.clone(), sent)
    }

    /// The outcome of a write of `next` over `from`, sent at `sent`; an
    /// outcome about a version this state has already moved past is stale.
    fn settle(&mut self, from: &UpdateVersion, next: Body, sent: Duration, outcome: Outcome) {
        if self.version != *from {
            return;
        }
        match outcome {
            Outcome::Confirmed(version) => {
                self.body = next;
                self.version = version;
                self.sent = sent;
                self.pending = None;
            }
            Outcome::Ours(body, version) => {
                self.body = body;
                self.version = version;
            }
            Outcome::Lost => self.lost = true,
            Outcome::Unknown => {}
        }
    }
}

/// What became of one conditional write to a held lease.
enum Outcome {
    Confirmed(UpdateVersion),
    /// Not this write, but the object still carries our token (an earlier
    /// write of ours whose answer was lost): adopt it and write again.
    Ours(Body, UpdateVersion),
    /// Someone else wrote or removed the lease.
    Lost,
    /// No answer: the lease stays stale until a renewal is confirmed.
    Unknown,
}

/// A held lease by key: the holder text and its state.
type HeldEntry = (String, Arc<Mutex<Held>>);

/// What this process last saw of someone else's lease.
#[derive(Debug, Clone)]
struct Seen {
    token: String,
    counter: u64,
    since: Instant,
}

#[derive(Debug)]
pub(crate) struct LeaseTable {
    remote: Arc<Remote>,
    ttl: Duration,
    held: Mutex<HashMap<String, HeldEntry>>,
    seen: Mutex<HashMap<String, Seen>>,
}

/// Decision about someone else's lease right now.
enum Verdict {
    Free(Body, UpdateVersion),
    Absent,
    Live(String),
    /// Unchanged, but not yet for a whole ttl.
    Undecided(String),
}

impl LeaseTable {
    /// A table whose renewals run on a thread that ends with the table.
    pub(crate) fn start(remote: Arc<Remote>, ttl: Duration) -> Arc<LeaseTable> {
        let ttl = ttl.min(MAX_TTL);
        let table = Arc::new(LeaseTable {
            remote,
            ttl,
            held: Mutex::new(HashMap::new()),
            seen: Mutex::new(HashMap::new()),
        });
        let weak = Arc::downgrade(&table);
        let renewer = std::thread::Builder::new()
            .name("strata-lease-renew".into())
            .spawn(move || renew_loop(weak, ttl / 4));
        if let Err(e) = renewer {
            tracing::error!(
                "lease renewal thread did not start; leases are renewed only when checked: error=`{e}`"
            );
        }
        table
    }

    pub(crate) fn ttl(&self) -> Duration {
        self.ttl
    }

    fn step(&self) -> Duration {
        (self.ttl / 8).max(Duration::from_millis(20))
    }

    pub(crate) fn acquire(
        self: &Arc<Self>,
        key: &str,
        holder: &str,
        wait: bool,
    ) -> Result<TryLease> {
        let started = Instant::now();
        loop {
            if let Some(own) = self.own_holder(key) {
                if !wait {
                    return Ok(TryLease::Busy { holder: own });
                }
            } else {
                match self.judge(key)? {
                    Verdict::Absent => {
                        if let Some(l) = self.write_new(key, holder, None)? {
                            return Ok(TryLease::Acquired(l));
                        }
                    }
                    Verdict::Free(prev, v) => {
                        let holder_was = prev.holder.clone();
                        if let Some(l) = self.write_new(key, holder, Some((prev, v)))? {
                            return Ok(TryLease::Acquired(l));
                        }
                        if !wait && started.elapsed() > self.ttl * 2 {
                            return Ok(TryLease::Busy { holder: holder_was });
                        }
                    }
                    Verdict::Live(h) if !wait => return Ok(TryLease::Busy { holder: h }),
                    Verdict::Undecided(h) if !wait && started.elapsed() > self.ttl * 2 => {
                        return Ok(TryLease::Busy { holder: h })
                    }
                    Verdict::Live(_) | Verdict::Undecided(_) => {}
                }
            }
            std::thread::sleep(self.step());
        }
    }

    fn own_holder(&self, key: &str) -> Option<String> {
        let held = self.held.lock().unwrap_or_else(PoisonError::into_inner);
        held.get(key).map(|(holder, _)| holder.clone())
    }

    /// Read the lease and decide on this process's observations.
    fn judge(&self, key: &str) -> Result<Verdict> {
        let Some((bytes, version)) = self.remote.get(key, MAX_LEASE_BYTES)? else {
            return Ok(Verdict::Absent);
        };
        let body = Body::decode(key, &bytes)?;
        if body.released {
            return Ok(Verdict::Free(body, version));
        }
        let ttl = self
            .ttl
            .max(Duration::from_millis(body.ttl_ms).min(MAX_TTL));
        let mut seen = self.seen.lock().unwrap_or_else(PoisonError::into_inner);
        match seen.get(key) {
            Some(s) if s.token == body.token && s.counter == body.counter => {
                if s.since.elapsed() >= ttl {
                    return Ok(Verdict::Free(body, version));
                }
                Ok(Verdict::Undecided(body.holder))
            }
            Some(_) => {
                seen.insert(key.to_string(), observed(&body));
                Ok(Verdict::Live(body.holder))
            }
            None => {
                seen.insert(key.to_string(), observed(&body));
                Ok(Verdict::Undecided(body.holder))
            }
        }
    }

    /// Create the lease (`prev: None`) or take it over from `prev`.
    fn write_new(
        self: &Arc<Self>,
        key: &str,
        holder: &str,
        prev: Option<(Body, UpdateVersion)>,
    ) -> Result<Option<Box<dyn Lease>>> {
        let body = Body {
            tag: LEASE_TAG.into(),
            version: LEASE_VERSION,
            holder: holder.to_string(),
            token: crate::token::new_token(),
            counter: prev
                .as_ref()
                .map_or(1, |(b, _)| b.counter.saturating_add(1)),
            ttl_ms: self.ttl.as_millis() as u64,
            released: false,
        };
        let mode = match prev {
            None => PutMode::Create,
            Some((_, v)) => PutMode::Update(v),
        };
        let sent = boottime().unwrap_or_default();
        let version = match self.remote.put(key, body.encode(), mode)? {
            Put::Done(v) => v,
            Put::Exists | Put::Changed => match self.remote.get(key, MAX_LEASE_BYTES)? {
                // A retried request whose first response was lost.
                Some((b, v)) if b == body.encode() => v,
                _ => return Ok(None),
            },
        };
        let held = Arc::new(Mutex::new(Held {
            body,
            version,
            sent,
            pending: None,
            lost: false,
            released: false,
        }));
        self.held
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .insert(key.to_string(), (holder.to_string(), held.clone()));
        Ok(Some(Box::new(ObjectLease {
            key: key.to_string(),
            held,
            table: self.clone(),
        })))
    }

    /// Without waiting: held (by us, or by someone renewing or not yet
    /// observed for a ttl), unheld (released, or unchanged for a ttl) or missing.
    pub(crate) fn probe(&self, key: &str) -> Result<LeaseState> {
        if let Some(holder) = self.own_holder(key) {
            return Ok(LeaseState::Held { holder });
        }
        Ok(match self.judge(key)? {
            Verdict::Absent => LeaseState::Missing,
            Verdict::Free(..) => LeaseState::Unheld,
            Verdict::Live(holder) | Verdict::Undecided(holder) => LeaseState::Held { holder },
        })
    }

    /// The holder text of a lease object, `None` if it is gone.
    pub(crate) fn holder(&self, key: &str) -> Result<Option<String>> {
        match self.remote.get(key, MAX_LEASE_BYTES)? {
            Some((bytes, _)) => Ok(Some(Body::decode(key, &bytes)?.holder)),
            None => Ok(None),
        }
    }

    /// Observe the undecided leases among `keys` for up to a ttl so that
    /// the verdicts that follow are settled: a renewing lease is held, a
    /// lease unchanged for a whole ttl is unheld. A lease that does not
    /// parse is left to the probe that reports it invalid.
    pub(crate) fn settle(&self, keys: &[String]) -> Result<()> {
        let mut open: Vec<&String> = Vec::new();
        for key in keys {
            if self.probe_open(key)? {
                open.push(key);
            }
        }
        let deadline = Instant::now() + self.ttl + self.step();
        while !open.is_empty() && Instant::now() < deadline {
            std::thread::sleep(self.step());
            let mut still = Vec::new();
            for key in open {
                let before = self.seen_counter(key);
                if self.probe_open(key)? && before == self.seen_counter(key) {
                    still.push(key);
                }
            }
            open = still;
        }
        Ok(())
    }

    /// Probe one lease; true while it is someone else's and still looks
    /// held without having been watched for a whole ttl.
    fn probe_open(&self, key: &str) -> Result<bool> {
        let state = match self.probe(key) {
            Ok(state) => state,
            Err(e) if e.kind() == crate::error::ErrorKind::Corrupt => return Ok(false),
            Err(e) => return Err(e),
        };
        let held = matches!(state, LeaseState::Held { .. });
        Ok(held && self.own_holder(key).is_none() && self.undecided(key))
    }

    fn undecided(&self, key: &str) -> bool {
        let seen = self.seen.lock().unwrap_or_else(PoisonError::into_inner);
        seen.get(key).is_some_and(|s| s.since.elapsed() < self.ttl)
    }

    fn seen_counter(&self, key: &str) -> Option<(String, u64)> {
        let seen = self.seen.lock().unwrap_or_else(PoisonError::into_inner);
        seen.get(key).map(|s| (s.token.clone(), s.counter))
    }

    /// Renew one held lease now: one conditional PUT of counter + 1,
    /// bounded by a quarter ttl, without holding the lease's state across
    /// it. Only a confirmed write by someone else loses the lease; after
    /// other failures it stays stale (and fenced by [`Lease::check`]) until
    /// a renewal is confirmed.
    fn renew(&self, key: &str, held: &Mutex<Held>) {
        let (next, from, sent) = {
            let mut h = held.lock().unwrap_or_else(PoisonError::into_inner);
            if h.released || h.lost {
                return;
            }
            h.attempt(false)
        };
        let outcome = self.write_held(key, &next, &from);
        let mut h = held.lock().unwrap_or_else(PoisonError::into_inner);
        if !h.released {
            let was_lost = h.lost;
            h.settle(&from, next, sent, outcome);
            if h.lost && !was_lost {
                tracing::warn!("lease renewal found the lease taken over or removed: key=`{key}`");
            }
        }
    }

    /// One bounded conditional write of `next` over version `from`. When
    /// the precondition fails, the lease is read back: our own `next` (an
    /// earlier answer was lost) is confirmed, another body with our token
    /// is adopted, anything else means the lease is lost.
    fn write_held(&self, key: &str, next: &Body, from: &UpdateVersion) -> Outcome {
        let _fence = fence::until(key, std::time::Instant::now() + self.ttl / 4);
        let bytes = next.encode();
        match self
            .remote
            .put(key, bytes.clone(), PutMode::Update(from.clone()))
        {
            Ok(Put::Done(v)) => Outcome::Confirmed(v),
            Ok(Put::Exists | Put::Changed) => match self.remote.get(key, MAX_LEASE_BYTES) {
                Ok(Some((b, v))) if b == bytes => Outcome::Confirmed(v),
                Ok(Some((b, v))) => match Body::decode(key, &b) {
                    Ok(body) if body.token == next.token && !body.released => {
                        Outcome::Ours(body, v)
                    }
                    _ => Outcome::Lost,
                },
                Ok(None) => Outcome::Lost,
                Err(e) => unanswered(key, "read back", &e),
            },
            Err(e) => unanswered(key, "write", &e),
        }
    }

    /// Mark the lease released and write that (best effort: a lease whose
    /// release did not land is taken over after its ttl).
    fn release(&self, key: &str, held: &Mutex<Held>) {
        let mut h = held.lock().unwrap_or_else(PoisonError::into_inner);
        h.released = true;
        let mut attempts = if h.lost { 0 } else { 2 };
        while attempts > 0 {
            attempts -= 1;
            let (next, from, sent) = h.attempt(true);
            let outcome = self.write_held(key, &next, &from);
            let again = matches!(outcome, Outcome::Ours(..));
            h.settle(&from, next, sent, outcome);
            if !again {
                break;
            }
        }
        drop(h);
        let mut map = self.held.lock().unwrap_or_else(PoisonError::into_inner);
        if map.get(key).is_some_and(|(_, x)| std::ptr::eq(&**x, held)) {
            map.remove(key);
        }
    }

    fn held_now(&self) -> Vec<(String, Arc<Mutex<Held>>)> {
        let map = self.held.lock().unwrap_or_else(PoisonError::into_inner);
        map.iter()
            .map(|(k, (_, v))| (k.clone(), v.clone()))
            .collect()
    }
}

/// A renewal or release of a held lease that got no answer: the lease
/// stays as it was (stale until a renewal lands; an unreleased one is taken
/// over after its ttl). Nobody waits for the answer, so it is logged.
fn unanswered(key: &str, step: &str, e: &Error) -> Outcome {
    tracing::warn!(
        "lease {step} got no answer: key=`{key}` error=`{}`",
        crate::cli_chain(e)
    );
    Outcome::Unknown
}

fn observed(body: &Body) -> Seen {
    Seen {
        token: body.token.clone(),
        counter: body.counter,
        since: Instant::now(),
    }
}

/// Renew every held lease each period, up to [`RENEW_PARALLEL`] at once,
/// so that one slow request does not make the others stale.
fn renew_loop(table: Weak<LeaseTable>, every: Duration) {
    loop {
        std::thread::sleep(every);
        let Some(t) = table.upgrade() else {
            return;
        };
        for batch in t.held_now().chunks(RENEW_PARALLEL) {
            std::thread::scope(|s| {
                for (key, held) in batch {
                    let t = &t;
                    s.spawn(move || t.renew(key, held));
                }
            });
        }
    }
}

/// A held lease object; dropping it releases the lease.
#[derive(Debug)]
struct ObjectLease {
    key: String,
    held: Arc<Mutex<Held>>,
    table: Arc<LeaseTable>,
}

impl Lease for ObjectLease {
    fn key(&self) -> &str {
        &self.key
    }

    fn check(&self) -> Result<Option<Instant>> {
        let ttl = self.table.ttl;
        let stale = {
            let h = self.held.lock().unwrap_or_else(PoisonError::into_inner);
            h.lost || h.age() >= ttl / 2
        };
        if stale {
            self.table.renew(&self.key, &self.held);
        }
        let h = self.held.lock().unwrap_or_else(PoisonError::into_inner);
        let age = h.age();
        if h.lost || h.released || age >= ttl / 2 {
            return Err(Error::Fenced {
                key: self.key.clone(),
            });
        }
        Ok(Some(Instant::now() + (ttl * 7 / 8).saturating_sub(age)))
    }
}

impl Drop for ObjectLease {
    fn drop(&mut self) {
        self.table.release(&self.key, &self.held);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn body() -> Body {
        Body {
            tag: LEASE_TAG.into(),
            version: LEASE_VERSION,
            holder: "strata-mountd pid=1".into(),
            token: "t".into(),
            counter: 7,
            ttl_ms: 30_000,
            released: false,
        }
    }

    proptest! {
        /// Fuzzing (issue 7): lease objects are bytes from the server; a
        /// damaged one is a typed error (an invalid marker), never a panic.
        #[test]
        fn lease_objects_never_panic(flips in proptest::collection::vec((any::<usize>(), 1u8..), 0..6),
                                     cut in any::<usize>()) {
            let mut bytes = body().encode().to_vec();
            for (i, x) in flips {
                let i = i % bytes.len();
                bytes[i] ^= x;
            }
            bytes.truncate(cut % (bytes.len() + 1));
            if let Err(e) = Body::decode("k", &bytes) {
                let typed = matches!(e, Error::Corrupt { .. } | Error::NewerFormat { .. });
                prop_assert!(typed, "{:?}", e);
            }
        }
    }

    #[test]
    fn a_lease_object_round_trips() {
        let b = body();
        let back = Body::decode("k", &b.encode()).unwrap();
        assert_eq!((back.counter, back.token), (b.counter, b.token));
    }
}
