//! The pipe between the mount daemon and its sweep helper, `strata sweep
//! --in-process --serve` (docs/CONTROL.md, "The sweep helper"): one
//! [`SweepJob`] line in, one [`SweepAnswer`] line out. Both ends come from
//! one build, so the pipe is not versioned; both use these types.

use crate::sweep::SweepReport;
use serde::de::{self, Deserializer};
use serde::ser::{SerializeMap, Serializer};
use serde::{Deserialize, Serialize};
use std::time::Duration;

/// One sweep for the helper: `{"grace_ms": N, "dry_run": bool, "recount":
/// bool}` (the two flags default to false; no other field).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SweepJob {
    pub grace_ms: u64,
    #[serde(default)]
    pub dry_run: bool,
    #[serde(default)]
    pub recount: bool,
}

impl SweepJob {
    pub fn new(grace: Duration, dry_run: bool, recount: bool) -> SweepJob {
        SweepJob {
            grace_ms: u64::try_from(grace.as_millis()).unwrap_or(u64::MAX),
            dry_run,
            recount,
        }
    }

    pub fn grace(&self) -> Duration {
        Duration::from_millis(self.grace_ms)
    }

    /// Parse one request line, naming what was wrong.
    pub fn parse(line: &str) -> Result<SweepJob, serde_json::Error> {
        serde_json::from_str(line)
    }

    /// The request line, without its newline.
    pub fn to_line(&self) -> String {
        // Numbers and booleans serialize without failing.
        serde_json::to_string(self).unwrap_or_default()
    }
}

/// The helper's answer: `{"ok": true, "report": {…}}` (the report of
/// `strata sweep --json`) or `{"ok": false, "error": "…"}` (the message
/// `strata sweep` would print).
#[derive(Debug, Clone)]
pub enum SweepAnswer {
    Report(Box<SweepReport>),
    Failed(String),
}

impl SweepAnswer {
    /// The answer line, without its newline.
    pub fn to_line(&self) -> String {
        // A report is plain data; it serializes without failing.
        serde_json::to_string(self).unwrap_or_default()
    }

    /// Parse one answer line.
    pub fn parse(line: &str) -> Result<SweepAnswer, serde_json::Error> {
        serde_json::from_str(line)
    }
}

impl Serialize for SweepAnswer {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        let mut m = s.serialize_map(Some(2))?;
        match self {
            SweepAnswer::Report(r) => {
                m.serialize_entry("ok", &true)?;
                m.serialize_entry("report", r)?;
            }
            SweepAnswer::Failed(e) => {
                m.serialize_entry("ok", &false)?;
                m.serialize_entry("error", e)?;
            }
        }
        m.end()
    }
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct WireAnswer {
    ok: bool,
    #[serde(default)]
    report: Option<Box<SweepReport>>,
    #[serde(default)]
    error: Option<String>,
}

impl<'de> Deserialize<'de> for SweepAnswer {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<SweepAnswer, D::Error> {
        let w = WireAnswer::deserialize(d)?;
        match (w.ok, w.report, w.error) {
            (true, Some(r), None) => Ok(SweepAnswer::Report(r)),
            (false, None, Some(e)) => Ok(SweepAnswer::Failed(e)),
            (true, _, _) => Err(de::Error::custom(
                "`ok` is true: a `report` and no `error` expected",
            )),
            (false, _, _) => Err(de::Error::custom(
                "`ok` is false: an `error` and no `report` expected",
            )),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_job_has_its_encoding_and_refuses_strangers() {
        let job = SweepJob::new(Duration::from_secs(900), true, false);
        let line = r#"{"grace_ms":900000,"dry_run":true,"recount":false}"#;
        assert_eq!(job.to_line(), line);
        assert_eq!(SweepJob::parse(line).unwrap(), job);
        assert_eq!(
            SweepJob::parse("{\"grace_ms\": 0}\n").unwrap(),
            SweepJob::new(Duration::ZERO, false, false)
        );
        for (bad, says) in [
            (r#"{"grace": 0}"#, "unknown field `grace`"),
            (r#"{"dry_run": true}"#, "missing field `grace_ms`"),
            (r#"{"grace_ms": -1}"#, "invalid value"),
            (r#"{"grace_ms": 1, "recount": "yes"}"#, "invalid type"),
            (r#"{"grace_ms": 1} 2"#, "trailing characters"),
        ] {
            let e = SweepJob::parse(bad).expect_err(bad).to_string();
            assert!(e.contains(says), "{bad}: {e}");
        }
    }

    #[test]
    fn an_answer_has_its_encoding() {
        let failed = SweepAnswer::Failed("another sweep runs".into());
        let line = r#"{"ok":false,"error":"another sweep runs"}"#;
        assert_eq!(failed.to_line(), line);
        assert!(matches!(SweepAnswer::parse(line).unwrap(),
            SweepAnswer::Failed(e) if e == "another sweep runs"));
        let report = SweepReport {
            epoch: 4,
            ..SweepReport::default()
        };
        let line = SweepAnswer::Report(Box::new(report)).to_line();
        assert!(line.starts_with(r#"{"ok":true,"report":{"type":"","version":0,"epoch":4,"#));
        assert!(matches!(SweepAnswer::parse(&line).unwrap(),
            SweepAnswer::Report(r) if r.epoch == 4));
        for bad in [
            r#"{"ok":true}"#,
            r#"{"ok":false}"#,
            r#"{"ok":true,"error":"x"}"#,
            r#"{"ok":false,"error":"x","extra":1}"#,
            r#"{"ok":true,"report":{}}"#,
        ] {
            assert!(SweepAnswer::parse(bad).is_err(), "{bad}");
        }
    }
}
