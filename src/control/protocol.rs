//! The control protocol, version 1 (docs/CONTROL.md), as types: a request
//! is a [`Command`], an answer a [`Response`]. This module is the source of
//! truth for the wire; the daemon parses with [`Command::parse`] and
//! dispatches on the enum, the client builds `Command` values.
//!
//! The encoding is v1's, unchanged: a request is one flat JSON object,
//! `{"command": <name>, <the command's fields>, "version": 1}`. The parser
//! accepts exactly what the v1 daemon accepted: `version` and `command`
//! required, the optional fields `set`, `generation`, `wait`, `wait_ms`, `grace_ms`,
//! `dry_run` and `recount` (each with its type; `set`, `generation` and
//! `grace_ms` may be `null`), no other field, no field twice, nothing but
//! whitespace after the object. A field of another command (`set` on
//! `status`) is accepted and ignored, as v1 always did. Keys are written in
//! sorted order, so the bytes are those the v1 client (a `serde_json::json!`
//! map) sent; key order means nothing to a reader.

use serde::de::{self, Deserializer};
use serde::ser::{SerializeMap, Serializer};
use serde::{Deserialize, Serialize};
use serde_json::Value;
use std::fmt;

/// Protocol version spoken by this build (client and daemon).
pub const PROTOCOL_VERSION: u32 = 1;
/// Largest request line, newline included.
pub const MAX_REQUEST_BYTES: u64 = 1 << 20;

/// One request: a command and its arguments.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(try_from = "WireRequest")]
pub enum Command {
    /// The daemon's counters, mount and sets.
    Status,
    /// The served sets and their latest generations.
    Sets,
    /// The pins this daemon holds.
    Pins,
    /// Re-read the index and pin each served set's latest now.
    Refresh,
    /// Unmount (not lazily).
    Unmount,
    /// Materialize a generation on the daemon's worker.
    Materialize {
        /// The set (a valid set name).
        set: String,
        /// The generation; `None` is the latest.
        generation: Option<u64>,
        /// Wait for a busy task instead of failing.
        wait: bool,
        /// How long to wait at most (an optional v1 field; absent: the
        /// daemon's longest wait, `strata::materialize::MAX_WAIT`).
        wait_ms: Option<u64>,
    },
    /// Every task's newest record.
    Tasks,
    /// The daemon's metrics as Prometheus text.
    Metrics,
    /// One sweep in the daemon's sweep helper.
    Sweep {
        /// Grace in milliseconds; `None` is the daemon's `--sweep-grace-s`.
        grace_ms: Option<u64>,
        /// Plan only.
        dry_run: bool,
        /// Recount pack live ratios.
        recount: bool,
    },
}

/// Every command name, in the order of docs/CONTROL.md.
pub const COMMANDS: [&str; 9] = [
    "status",
    "sets",
    "pins",
    "refresh",
    "unmount",
    "materialize",
    "tasks",
    "metrics",
    "sweep",
];

impl Command {
    /// The command's name on the wire.
    pub fn name(&self) -> &'static str {
        match self {
            Command::Status => "status",
            Command::Sets => "sets",
            Command::Pins => "pins",
            Command::Refresh => "refresh",
            Command::Unmount => "unmount",
            Command::Materialize { .. } => "materialize",
            Command::Tasks => "tasks",
            Command::Metrics => "metrics",
            Command::Sweep { .. } => "sweep",
        }
    }

    /// Parse one request line (its newline may be included), strictly:
    /// the error says what was wrong and which kind it answers as.
    pub fn parse(line: &[u8]) -> Result<Command, RequestError> {
        let wire: WireRequest = serde_json::from_slice(line).map_err(RequestError::Malformed)?;
        Command::try_from(wire)
    }

    /// The request line for this command, without its newline.
    pub fn to_line(&self) -> String {
        // Serializing a map of strings, numbers and booleans cannot fail.
        serde_json::to_string(self).unwrap_or_default()
    }
}

/// A request the daemon refuses before running it.
#[derive(Debug, thiserror::Error)]
pub enum RequestError {
    /// Not JSON, not an object, a field of the wrong type, a missing
    /// `version` or `command`, an unknown or repeated field, or trailing
    /// bytes.
    #[error("not a request: {0}")]
    Malformed(serde_json::Error),
    /// A version this build does not speak.
    #[error("protocol version {0} is not supported; this daemon speaks {PROTOCOL_VERSION}")]
    UnsupportedVersion(u32),
    /// A command this build does not know.
    #[error("unknown command `{0}`")]
    UnknownCommand(String),
    /// A command without a field it needs.
    #[error("`{command}` needs `{field}`")]
    MissingField {
        command: &'static str,
        field: &'static str,
    },
    /// `set` is not a valid set name.
    #[error("{0}")]
    BadSet(crate::Error),
}

impl RequestError {
    /// The error kind the daemon answers with.
    pub fn kind(&self) -> ErrorKind {
        match self {
            RequestError::UnsupportedVersion(_) => ErrorKind::UnsupportedVersion,
            RequestError::UnknownCommand(_) => ErrorKind::UnknownCommand,
            RequestError::Malformed(_)
            | RequestError::MissingField { .. }
            | RequestError::BadSet(_) => ErrorKind::InvalidRequest,
        }
    }
}

/// A request as it is on the wire: an object of v1's fields, all of them
/// optional but `version` and `command`, nothing else.
struct WireRequest(WireFields);

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct WireFields {
    version: u32,
    command: String,
    #[serde(default)]
    set: Option<String>,
    #[serde(default)]
    generation: Option<u64>,
    #[serde(default)]
    wait: bool,
    #[serde(default)]
    wait_ms: Option<u64>,
    #[serde(default)]
    grace_ms: Option<u64>,
    #[serde(default)]
    dry_run: bool,
    #[serde(default)]
    recount: bool,
}

impl<'de> Deserialize<'de> for WireRequest {
    /// Only an object: a derived struct would also take an array of the
    /// field values in declaration order.
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<WireRequest, D::Error> {
        struct Object;
        impl<'de> de::Visitor<'de> for Object {
            type Value = WireRequest;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a request object")
            }
            fn visit_map<A: de::MapAccess<'de>>(self, map: A) -> Result<WireRequest, A::Error> {
                WireFields::deserialize(de::value::MapAccessDeserializer::new(map)).map(WireRequest)
            }
        }
        d.deserialize_map(Object)
    }
}

impl TryFrom<WireRequest> for Command {
    type Error = RequestError;

    /// The checks in v1's order: version, command, the command's fields.
    fn try_from(WireRequest(w): WireRequest) -> Result<Command, RequestError> {
        if w.version != PROTOCOL_VERSION {
            return Err(RequestError::UnsupportedVersion(w.version));
        }
        Ok(match w.command.as_str() {
            "status" => Command::Status,
            "sets" => Command::Sets,
            "pins" => Command::Pins,
            "refresh" => Command::Refresh,
            "unmount" => Command::Unmount,
            "materialize" => {
                let set = w.set.ok_or(RequestError::MissingField {
                    command: "materialize",
                    field: "set",
                })?;
                crate::store::check_set_name(&set).map_err(RequestError::BadSet)?;
                Command::Materialize {
                    set,
                    generation: w.generation,
                    wait: w.wait,
                    wait_ms: w.wait_ms,
                }
            }
            "tasks" => Command::Tasks,
            "metrics" => Command::Metrics,
            "sweep" => Command::Sweep {
                grace_ms: w.grace_ms,
                dry_run: w.dry_run,
                recount: w.recount,
            },
            _ => return Err(RequestError::UnknownCommand(w.command)),
        })
    }
}

impl Serialize for Command {
    /// The v1 request object, keys sorted (the v1 client's bytes).
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        let mut m = s.serialize_map(None)?;
        m.serialize_entry("command", self.name())?;
        match self {
            Command::Materialize {
                set,
                generation,
                wait,
                wait_ms,
            } => {
                m.serialize_entry("generation", generation)?;
                m.serialize_entry("set", set)?;
                m.serialize_entry("version", &PROTOCOL_VERSION)?;
                m.serialize_entry("wait", wait)?;
                if let Some(ms) = wait_ms {
                    m.serialize_entry("wait_ms", ms)?;
                }
            }
            Command::Sweep {
                grace_ms,
                dry_run,
                recount,
            } => {
                m.serialize_entry("dry_run", dry_run)?;
                if let Some(g) = grace_ms {
                    m.serialize_entry("grace_ms", g)?;
                }
                m.serialize_entry("recount", recount)?;
                m.serialize_entry("version", &PROTOCOL_VERSION)?;
            }
            _ => m.serialize_entry("version", &PROTOCOL_VERSION)?,
        }
        m.end()
    }
}

/// Why a request failed, as the `error.kind` of a response.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ErrorKind {
    /// Not JSON, wrong or extra fields, a bad argument.
    InvalidRequest,
    /// A protocol version the daemon does not speak.
    UnsupportedVersion,
    /// A command the daemon does not know.
    UnknownCommand,
    /// A request line over [`MAX_REQUEST_BYTES`].
    TooLarge,
    /// The connection limit, or `unmount` of a busy mount.
    Busy,
    /// The peer's uid may not use the socket.
    Forbidden,
    /// The request failed inside the daemon.
    Internal,
    /// `materialize` or `sweep` ran and failed (the message says why).
    Failed,
    /// A kind this build does not know (from a newer daemon).
    Other(String),
}

impl ErrorKind {
    /// The kind's name on the wire.
    pub fn as_str(&self) -> &str {
        match self {
            ErrorKind::InvalidRequest => "invalid-request",
            ErrorKind::UnsupportedVersion => "unsupported-version",
            ErrorKind::UnknownCommand => "unknown-command",
            ErrorKind::TooLarge => "too-large",
            ErrorKind::Busy => "busy",
            ErrorKind::Forbidden => "forbidden",
            ErrorKind::Internal => "internal",
            ErrorKind::Failed => "failed",
            ErrorKind::Other(s) => s,
        }
    }

    fn from_wire(s: String) -> ErrorKind {
        match s.as_str() {
            "invalid-request" => ErrorKind::InvalidRequest,
            "unsupported-version" => ErrorKind::UnsupportedVersion,
            "unknown-command" => ErrorKind::UnknownCommand,
            "too-large" => ErrorKind::TooLarge,
            "busy" => ErrorKind::Busy,
            "forbidden" => ErrorKind::Forbidden,
            "internal" => ErrorKind::Internal,
            "failed" => ErrorKind::Failed,
            _ => ErrorKind::Other(s),
        }
    }
}

impl fmt::Display for ErrorKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl Serialize for ErrorKind {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(self.as_str())
    }
}

impl<'de> Deserialize<'de> for ErrorKind {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<ErrorKind, D::Error> {
        String::deserialize(d).map(ErrorKind::from_wire)
    }
}

/// The `error` of a failed response.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Failure {
    pub kind: ErrorKind,
    pub message: String,
}

impl Failure {
    pub fn new(kind: ErrorKind, message: impl Into<String>) -> Failure {
        Failure {
            kind,
            message: message.into(),
        }
    }
}

impl From<RequestError> for Failure {
    fn from(e: RequestError) -> Failure {
        Failure::new(e.kind(), e.to_string())
    }
}

/// One response line: the command's result, or why it failed. The result
/// is the command's own JSON (docs/CONTROL.md, "Commands"); the client
/// reads it into the type it expects ([`Response::into_result`]).
#[derive(Debug, Clone, PartialEq)]
pub enum Response {
    Ok(Value),
    Err(Failure),
}

impl Response {
    /// An error response.
    pub fn error(kind: ErrorKind, message: impl Into<String>) -> Response {
        Response::Err(Failure::new(kind, message))
    }

    /// The response line, without its newline.
    pub fn to_line(&self) -> String {
        // A `Value` and strings serialize without failing.
        serde_json::to_string(self).unwrap_or_default()
    }

    /// The result, or the daemon's failure.
    pub fn into_result(self) -> Result<Value, Failure> {
        match self {
            Response::Ok(v) => Ok(v),
            Response::Err(f) => Err(f),
        }
    }
}

impl Serialize for Response {
    /// `{"ok": true, "result": …, "version": 1}` or
    /// `{"error": {"kind", "message"}, "ok": false, "version": 1}` (keys
    /// sorted, as the v1 daemon wrote them).
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        let mut m = s.serialize_map(Some(3))?;
        match self {
            Response::Ok(v) => {
                m.serialize_entry("ok", &true)?;
                m.serialize_entry("result", v)?;
            }
            Response::Err(f) => {
                m.serialize_entry("error", f)?;
                m.serialize_entry("ok", &false)?;
            }
        }
        m.serialize_entry("version", &PROTOCOL_VERSION)?;
        m.end()
    }
}

/// A response as it is on the wire. Unknown fields are let through (a
/// newer daemon may add some); the client is strict about what it reads.
#[derive(Deserialize)]
struct WireResponse {
    version: u32,
    ok: bool,
    #[serde(default)]
    result: Option<Value>,
    #[serde(default)]
    error: Option<Failure>,
}

impl<'de> Deserialize<'de> for Response {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Response, D::Error> {
        let w = WireResponse::deserialize(d)?;
        if w.version != PROTOCOL_VERSION {
            return Err(de::Error::custom(format_args!(
                "response of protocol version {}, this client speaks {PROTOCOL_VERSION}",
                w.version
            )));
        }
        match (w.ok, w.result, w.error) {
            (true, result, None) => Ok(Response::Ok(result.unwrap_or(Value::Null))),
            (false, None, Some(f)) => Ok(Response::Err(f)),
            (true, _, Some(_)) => Err(de::Error::custom("`ok` is true but an `error` is given")),
            (false, _, None) => Err(de::Error::custom("`ok` is false but no `error` is given")),
            (false, Some(_), Some(_)) => {
                Err(de::Error::custom("`ok` is false but a `result` is given"))
            }
        }
    }
}

/// One served set and its latest generation (`sets`, `refresh`, and
/// `status`'s `sets`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SetLatest {
    // Fields in sorted order: the bytes v1 wrote.
    pub latest: Option<u64>,
    pub set: String,
}

/// The result of `status` (docs/CONTROL.md, "Commands"). Fields in sorted
/// order: the bytes v1 wrote. A client that must work with daemons of other
/// builds reads only the fields it needs.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Status {
    pub bare_entries: u64,
    pub dir_reads: u64,
    /// The mount's FUSE connection number; `None` until the mount is made.
    pub fuse_connection: Option<u32>,
    pub inodes: u64,
    pub last_sweep: Option<SweepSummary>,
    pub lookups: u64,
    pub mountpoint: std::path::PathBuf,
    pub open_handles: u64,
    pub pid: u32,
    pub pinned_generations: u64,
    /// Added after v1 without a version change: absent from older daemons.
    #[serde(default)]
    pub pushed_files: u64,
    /// Object-store requests by kind and cache counters; `None` for a
    /// local store.
    pub remote_requests: Option<std::collections::BTreeMap<String, u64>>,
    pub rss_bytes: u64,
    pub sets: Vec<SetLatest>,
    /// Added after v1 without a version change: absent from older daemons.
    #[serde(default)]
    pub spliced_reads: u64,
    pub uptime_s: u64,
    pub verified_blobs: u64,
    pub verify_failures: u64,
}

/// `status`'s `last_sweep`: how the daemon's latest sweep ended.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(untagged)]
pub enum SweepSummary {
    /// It ran (fields in sorted order: the bytes v1 wrote).
    Done {
        at_ns: i64,
        condemned: crate::sweep::Tally,
        deferred: Option<String>,
        deleted: crate::sweep::Tally,
        epoch: u64,
    },
    /// It failed, with the sweep's message.
    Failed { at_ns: i64, error: String },
}

impl SweepSummary {
    /// When the sweep started.
    pub fn at_ns(&self) -> i64 {
        match self {
            SweepSummary::Done { at_ns, .. } | SweepSummary::Failed { at_ns, .. } => *at_ns,
        }
    }
}

/// The result of `unmount`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Unmounted {
    pub unmounted: bool,
}

/// The result of `metrics`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct MetricsText {
    pub text: String,
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(line: &str) -> Result<Command, RequestError> {
        Command::parse(line.as_bytes())
    }

    fn refused(line: &str) -> (ErrorKind, String) {
        let e = parse(line).expect_err(line);
        (e.kind(), e.to_string())
    }

    /// Every command's encoding, literally (the bytes the v1 `json!`
    /// client sent), and that it parses back to itself.
    #[test]
    fn each_command_has_its_v1_encoding() {
        let golden = [
            (Command::Status, r#"{"command":"status","version":1}"#),
            (Command::Sets, r#"{"command":"sets","version":1}"#),
            (Command::Pins, r#"{"command":"pins","version":1}"#),
            (Command::Refresh, r#"{"command":"refresh","version":1}"#),
            (Command::Unmount, r#"{"command":"unmount","version":1}"#),
            (Command::Tasks, r#"{"command":"tasks","version":1}"#),
            (Command::Metrics, r#"{"command":"metrics","version":1}"#),
            (
                Command::Materialize {
                    set: "s".into(),
                    generation: Some(7),
                    wait: true,
                    wait_ms: None,
                },
                r#"{"command":"materialize","generation":7,"set":"s","version":1,"wait":true}"#,
            ),
            (
                Command::Materialize {
                    set: "photos".into(),
                    generation: None,
                    wait: false,
                    wait_ms: None,
                },
                r#"{"command":"materialize","generation":null,"set":"photos","version":1,"wait":false}"#,
            ),
            (
                Command::Sweep {
                    grace_ms: Some(900_000),
                    dry_run: true,
                    recount: false,
                },
                r#"{"command":"sweep","dry_run":true,"grace_ms":900000,"recount":false,"version":1}"#,
            ),
            (
                Command::Sweep {
                    grace_ms: None,
                    dry_run: false,
                    recount: true,
                },
                r#"{"command":"sweep","dry_run":false,"recount":true,"version":1}"#,
            ),
        ];
        let mut named: Vec<&str> = golden.iter().map(|(c, _)| c.name()).collect();
        named.dedup();
        let mut all = COMMANDS.to_vec();
        all.sort_unstable();
        named.sort_unstable();
        assert_eq!(named, all, "a golden line per command");
        for (command, line) in golden {
            assert_eq!(command.to_line(), line);
            assert_eq!(parse(line).unwrap(), command, "{line}");
            assert_eq!(serde_json::from_str::<Command>(line).unwrap(), command);
        }
    }

    /// Requests as documented and as older clients wrote them: any key
    /// order, whitespace, defaults for absent fields, `null` optionals.
    #[test]
    fn v1_requests_in_any_spelling_parse() {
        let cases = [
            (r#"{"version": 1, "command": "status"}"#, Command::Status),
            ("{\"version\":1,\"command\":\"sets\"}\n", Command::Sets),
            (
                r#"{"version": 1, "command": "materialize", "set": "s", "generation": 7, "wait": true}"#,
                Command::Materialize {
                    set: "s".into(),
                    generation: Some(7),
                    wait: true,
                    wait_ms: None,
                },
            ),
            (
                r#"{"command":"materialize","set":"s","version":1}"#,
                Command::Materialize {
                    set: "s".into(),
                    generation: None,
                    wait: false,
                    wait_ms: None,
                },
            ),
            (
                r#"{"version":1,"command":"sweep"}"#,
                Command::Sweep {
                    grace_ms: None,
                    dry_run: false,
                    recount: false,
                },
            ),
            (
                r#"{"version":1,"command":"sweep","grace_ms":null,"dry_run":true}"#,
                Command::Sweep {
                    grace_ms: None,
                    dry_run: true,
                    recount: false,
                },
            ),
            // v1 accepts (and ignores) another command's fields.
            (
                r#"{"version":1,"command":"status","set":"s","wait":true,"grace_ms":1}"#,
                Command::Status,
            ),
        ];
        for (line, command) in cases {
            assert_eq!(parse(line).unwrap(), command, "{line}");
        }
    }

    #[test]
    fn malformed_requests_are_refused_with_what_was_wrong() {
        use ErrorKind::*;
        let cases: [(&str, ErrorKind, &str); 20] = [
            ("garbage", InvalidRequest, "expected value"),
            ("", InvalidRequest, "EOF"),
            // An array of the field values (which a derived parser, v1's
            // included, would take) is not a request.
            (
                "[1, \"status\"]",
                InvalidRequest,
                "expected a request object",
            ),
            ("7", InvalidRequest, "expected a request object"),
            (
                "{\"command\":\"status\"}",
                InvalidRequest,
                "missing field `version`",
            ),
            ("{\"version\":1}", InvalidRequest, "missing field `command`"),
            (
                r#"{"version":1,"command":"status","extra":1}"#,
                InvalidRequest,
                "unknown field `extra`",
            ),
            (
                r#"{"version":1,"command":"status","version":1}"#,
                InvalidRequest,
                "duplicate field `version`",
            ),
            (
                r#"{"version":1,"command":"status"} {}"#,
                InvalidRequest,
                "trailing characters",
            ),
            (
                r#"{"version":"1","command":"status"}"#,
                InvalidRequest,
                "invalid type",
            ),
            (
                r#"{"version":-1,"command":"status"}"#,
                InvalidRequest,
                "invalid value",
            ),
            (
                r#"{"version":4294967297,"command":"status"}"#,
                InvalidRequest,
                "invalid value",
            ),
            (
                r#"{"version":1,"command":7}"#,
                InvalidRequest,
                "invalid type",
            ),
            (
                r#"{"version":1,"command":"sweep","dry_run":null}"#,
                InvalidRequest,
                "invalid type: null",
            ),
            (
                r#"{"version":1,"command":"materialize","set":"s","generation":-3}"#,
                InvalidRequest,
                "invalid value",
            ),
            (
                r#"{"version":1,"command":"materialize"}"#,
                InvalidRequest,
                "`materialize` needs `set`",
            ),
            (
                r#"{"version":1,"command":"materialize","set":"../x"}"#,
                InvalidRequest,
                "set",
            ),
            (
                r#"{"version":1,"command":"nope"}"#,
                UnknownCommand,
                "unknown command `nope`",
            ),
            (
                r#"{"version":9,"command":"status"}"#,
                UnsupportedVersion,
                "protocol version 9 is not supported; this daemon speaks 1",
            ),
            // As in v1: a version is checked before the command.
            (
                r#"{"version":2,"command":"nope"}"#,
                UnsupportedVersion,
                "version 2",
            ),
        ];
        for (line, kind, says) in cases {
            let (k, message) = refused(line);
            assert_eq!(k, kind, "{line}: {message}");
            assert!(message.contains(says), "{line}: {message}");
        }
        // Field checks come first: an unknown field is `invalid-request`
        // whatever the version or command.
        assert_eq!(
            refused(r#"{"version":9,"command":"nope","zz":1}"#).0,
            InvalidRequest
        );
        assert!(matches!(
            parse(r#"{"version":1,"command":"materialize"}"#),
            Err(RequestError::MissingField {
                command: "materialize",
                field: "set"
            })
        ));
    }

    #[test]
    fn responses_have_their_v1_encoding() {
        let ok = Response::Ok(serde_json::json!([{"latest": 3, "set": "s"}]));
        let line = r#"{"ok":true,"result":[{"latest":3,"set":"s"}],"version":1}"#;
        assert_eq!(ok.to_line(), line);
        assert_eq!(serde_json::from_str::<Response>(line).unwrap(), ok);
        let err = Response::error(ErrorKind::Busy, "too many control connections; retry");
        let line = r#"{"error":{"kind":"busy","message":"too many control connections; retry"},"ok":false,"version":1}"#;
        assert_eq!(err.to_line(), line);
        assert_eq!(serde_json::from_str::<Response>(line).unwrap(), err);
        let sets = vec![SetLatest {
            latest: None,
            set: "s".into(),
        }];
        assert_eq!(
            Response::Ok(serde_json::to_value(sets).unwrap()).to_line(),
            r#"{"ok":true,"result":[{"latest":null,"set":"s"}],"version":1}"#
        );
        // Every kind by its wire name; an unknown one is kept.
        for kind in [
            "invalid-request",
            "unsupported-version",
            "unknown-command",
            "too-large",
            "busy",
            "forbidden",
            "internal",
            "failed",
            "newer-kind",
        ] {
            let line =
                format!(r#"{{"error":{{"kind":"{kind}","message":"m"}},"ok":false,"version":1}}"#);
            let r: Response = serde_json::from_str(&line).unwrap();
            assert_eq!(r.to_line(), line);
        }
    }

    /// `status`'s result, every field by name, and both `last_sweep` forms.
    #[test]
    fn status_has_its_v1_encoding() {
        let tally = |count, bytes| crate::sweep::Tally { count, bytes };
        let mut status = Status {
            bare_entries: 1,
            dir_reads: 2,
            fuse_connection: Some(44),
            inodes: 3,
            last_sweep: Some(SweepSummary::Done {
                at_ns: 5,
                condemned: tally(6, 60),
                deferred: None,
                deleted: tally(7, 70),
                epoch: 8,
            }),
            lookups: 9,
            mountpoint: "/mnt/s".into(),
            open_handles: 10,
            pid: 11,
            pinned_generations: 12,
            pushed_files: 19,
            remote_requests: None,
            rss_bytes: 13,
            sets: vec![SetLatest {
                latest: Some(14),
                set: "s".into(),
            }],
            spliced_reads: 18,
            uptime_s: 15,
            verified_blobs: 16,
            verify_failures: 17,
        };
        let line = concat!(
            r#"{"bare_entries":1,"dir_reads":2,"fuse_connection":44,"inodes":3,"#,
            r#""last_sweep":{"at_ns":5,"condemned":{"count":6,"bytes":60},"deferred":null,"#,
            r#""deleted":{"count":7,"bytes":70},"epoch":8},"lookups":9,"mountpoint":"/mnt/s","#,
            r#""open_handles":10,"pid":11,"pinned_generations":12,"pushed_files":19,"#,
            r#""remote_requests":null,"#,
            r#""rss_bytes":13,"sets":[{"latest":14,"set":"s"}],"spliced_reads":18,"uptime_s":15,"#,
            r#""verified_blobs":16,"verify_failures":17}"#
        );
        assert_eq!(serde_json::to_string(&status).unwrap(), line);
        assert_eq!(serde_json::from_str::<Status>(line).unwrap(), status);
        // A daemon from before `spliced_reads` and `pushed_files` leaves
        // them out.
        let older = line
            .replace(r#""spliced_reads":18,"#, "")
            .replace(r#""pushed_files":19,"#, "");
        let read = serde_json::from_str::<Status>(&older).unwrap();
        assert_eq!(
            (read.spliced_reads, read.pushed_files, read.uptime_s),
            (0, 0, 15)
        );
        status.last_sweep = Some(SweepSummary::Failed {
            at_ns: 5,
            error: "another sweep runs".into(),
        });
        let v = serde_json::to_value(&status).unwrap();
        assert_eq!(
            v["last_sweep"].to_string(),
            r#"{"at_ns":5,"error":"another sweep runs"}"#
        );
        assert_eq!(serde_json::from_value::<Status>(v).unwrap(), status);
    }

    #[test]
    fn inconsistent_responses_are_refused() {
        for line in [
            r#"{"ok":true,"result":1}"#,
            r#"{"ok":true,"result":1,"version":2}"#,
            r#"{"ok":false,"version":1}"#,
            r#"{"ok":true,"error":{"kind":"busy","message":"m"},"version":1}"#,
            r#"{"ok":false,"result":1,"error":{"kind":"busy","message":"m"},"version":1}"#,
            r#"{"ok":false,"error":{"kind":"busy"},"version":1}"#,
            r#"{"ok":"yes","version":1}"#,
        ] {
            assert!(serde_json::from_str::<Response>(line).is_err(), "{line}");
        }
    }
}
