//! The daemon's metrics in the Prometheus text exposition format (0.0.4),
//! as the control socket's `metrics` command answers them.
//!
//! Owns the metric names (docs/CONTROL.md lists them). Everything is read
//! from counters the daemon keeps anyway; rendering takes no lock that a
//! FUSE handler holds for long.

use crate::control::Context;
use std::fmt::Write;
use std::sync::atomic::Ordering;
use strata::control::protocol::SweepSummary;

/// One metric family: its help line, type and samples.
struct Family<'a> {
    out: &'a mut String,
}

impl Family<'_> {
    fn head(&mut self, name: &str, kind: &str, help: &str) {
        let _ = writeln!(self.out, "# HELP {name} {help}");
        let _ = writeln!(self.out, "# TYPE {name} {kind}");
    }

    fn sample(&mut self, name: &str, labels: &[(&str, &str)], value: f64) {
        let _ = write!(self.out, "{name}");
        if !labels.is_empty() {
            let inner: Vec<String> = labels
                .iter()
                .map(|(k, v)| format!("{k}=\"{}\"", escape(v)))
                .collect();
            let _ = write!(self.out, "{{{}}}", inner.join(","));
        }
        let _ = writeln!(self.out, " {value}");
    }

    fn single(&mut self, name: &str, kind: &str, help: &str, value: f64) {
        self.head(name, kind, help);
        self.sample(name, &[], value);
    }
}

/// A label value with `\`, `"` and newlines escaped.
fn escape(v: &str) -> String {
    v.replace('\\', "\\\\")
        .replace('"', "\\\"")
        .replace('\n', "\\n")
}

/// Every metric of this daemon, as Prometheus text.
pub(crate) fn render(ctx: &Context, rss_bytes: u64) -> String {
    let mut out = String::new();
    let mut f = Family { out: &mut out };
    let stats = &ctx.stats;
    let load = |v: &std::sync::atomic::AtomicU64| v.load(Ordering::Relaxed) as f64;
    let uptime = ctx.started.elapsed().as_secs_f64();
    f.single(
        "strata_mountd_uptime_seconds",
        "gauge",
        "Seconds since the daemon started.",
        uptime,
    );
    f.single(
        "strata_mountd_resident_memory_bytes",
        "gauge",
        "Resident set size.",
        rss_bytes as f64,
    );
    let pinned = ctx.gens.pinned() as f64;
    f.single(
        "strata_mountd_pinned_generations",
        "gauge",
        "Generations this daemon pins.",
        pinned,
    );
    let counters = [
        (
            "strata_mountd_inodes",
            "gauge",
            "Inodes the kernel holds.",
            &stats.inodes,
        ),
        (
            "strata_mountd_open_handles",
            "gauge",
            "Open file and directory handles.",
            &stats.handles,
        ),
        (
            "strata_mountd_verified_blobs_total",
            "counter",
            "Blobs hashed in full before service.",
            &stats.verify.verified,
        ),
        (
            "strata_mountd_verify_failures_total",
            "counter",
            "Content that did not match its digest (served as EIO).",
            &stats.verify.failures,
        ),
        (
            "strata_mountd_lookups_total",
            "counter",
            "Lookups answered with an entry.",
            &stats.lookups,
        ),
        (
            "strata_mountd_bare_entries_total",
            "counter",
            "Entries listed by readdirplus without attributes.",
            &stats.bare_entries,
        ),
        (
            "strata_mountd_dir_reads_total",
            "counter",
            "Directory reads answered (listings the kernel had not cached).",
            &stats.dir_reads,
        ),
        (
            "strata_mountd_spliced_reads_total",
            "counter",
            "File reads answered by splicing a local file's pages.",
            &stats.spliced_reads,
        ),
        (
            "strata_mountd_pushed_files_total",
            "counter",
            "Small files put into the kernel's page cache ahead of their reads.",
            &stats.pushed_files,
        ),
    ];
    for (name, kind, help, value) in counters {
        f.single(name, kind, help, load(value));
    }
    f.head(
        "strata_set_latest_generation",
        "gauge",
        "The latest generation of each served set.",
    );
    for s in crate::control::sets(ctx) {
        if let Some(latest) = s.latest {
            f.sample(
                "strata_set_latest_generation",
                &[("set", &s.set)],
                latest as f64,
            );
        }
    }
    if let Some(counts) = ctx.gens.store().storage().request_counts() {
        remote(&mut f, &counts);
    }
    if let Some(last) = ctx.last_sweep.get() {
        last_sweep(&mut f, &last);
    }
    out
}

fn remote(f: &mut Family<'_>, counts: &std::collections::BTreeMap<&'static str, u64>) {
    f.head(
        "strata_remote_requests_total",
        "counter",
        "Requests to the object store, by operation.",
    );
    for (op, n) in counts {
        if !op.starts_with("cache_") {
            f.sample("strata_remote_requests_total", &[("op", op)], *n as f64);
        }
    }
    let get = |k: &str| counts.get(k).copied().unwrap_or(0) as f64;
    f.single(
        "strata_cache_hits_total",
        "counter",
        "Reads served from the local cache.",
        get("cache_hits"),
    );
    f.single(
        "strata_cache_fills_total",
        "counter",
        "Objects fetched into the local cache.",
        get("cache_fills"),
    );
    f.single(
        "strata_cache_bytes",
        "gauge",
        "Bytes held by the local cache.",
        get("cache_bytes"),
    );
}

fn last_sweep(f: &mut Family<'_>, last: &SweepSummary) {
    f.single(
        "strata_sweep_last_run_timestamp_seconds",
        "gauge",
        "When this daemon's last sweep started.",
        last.at_ns() as f64 / 1e9,
    );
    let (failed, deleted, condemned) = match last {
        SweepSummary::Done {
            deleted, condemned, ..
        } => (0.0, deleted.bytes, condemned.bytes),
        SweepSummary::Failed { .. } => (1.0, 0, 0),
    };
    f.single(
        "strata_sweep_last_failed",
        "gauge",
        "1 if this daemon's last sweep failed.",
        failed,
    );
    f.single(
        "strata_sweep_last_deleted_bytes",
        "gauge",
        "Bytes the last sweep deleted.",
        deleted as f64,
    );
    f.single(
        "strata_sweep_last_condemned_bytes",
        "gauge",
        "Unreachable bytes the last sweep found.",
        condemned as f64,
    );
}
