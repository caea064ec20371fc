//! Incomplete multipart uploads on an S3-compatible store: finding those a
//! writer abandoned and aborting them.
//!
//! A large object goes up in parts (`Remote::put_large`), and an upload
//! that fails there is aborted on the spot. A writer killed mid-upload
//! cannot abort: its parts stay stored (and billed) but invisible, since
//! an upload nobody completes never becomes an object, and the client
//! library cannot list them. This module asks the service itself
//! (ListMultipartUploads under the store's prefix, signed with the store's
//! credentials) and aborts every upload initiated more than an age ago;
//! sweeps do this (`SweepOptions::upload_age`). An upload younger than the
//! age may belong to a live writer and is left alone. Nothing an upload
//! holds is ever visible, so aborting one never changes what readers see.

use super::remote::Remote;
use crate::error::{Error, Result};
use object_store::client::{ClientOptions, HttpConnector, HttpRequest, HttpRequestBody};
use object_store::multipart::MultipartStore;
use object_store::path::Path as ObjPath;
use object_store::signer::{Method, SignedUrlOptions, Signer};
use std::time::Duration;

/// An incomplete multipart upload.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Upload {
    /// The object the upload would create, relative to the store's prefix.
    pub key: String,
    pub id: String,
    /// When the service says the upload began (Unix ns).
    pub initiated_ns: i64,
}

/// One page of the service's answer.
struct Page {
    uploads: Vec<Upload>,
    /// Key and upload-id markers of the next page, if the answer was cut.
    next: Option<(String, String)>,
}

/// Answers larger than this are refused (a page holds at most 1,000 uploads).
const MAX_PAGE_BYTES: usize = 4 << 20;

impl Remote {
    /// Every incomplete multipart upload under the store's prefix.
    pub(crate) fn uploads(&self) -> Result<Vec<Upload>> {
        let mut out = Vec::new();
        let mut marker = None;
        loop {
            let page = super::remote::again(|| self.block(self.uploads_page(marker.as_ref())))?;
            out.extend(page.uploads);
            match page.next {
                Some(m) if Some(&m) != marker.as_ref() => marker = Some(m),
                _ => return Ok(out),
            }
        }
    }

    /// Abort one upload; its parts are gone when this returns. An upload
    /// already completed or aborted is fine.
    pub(crate) fn abort_upload(&self, upload: &Upload) -> Result<()> {
        let path = self.path(&upload.key);
        super::remote::again(|| {
            self.block(async {
                match self.store.abort_multipart(&path, &upload.id).await {
                    Ok(()) | Err(object_store::Error::NotFound { .. }) => Ok(()),
                    Err(e) => Err(Self::err("abort-multipart", &upload.key, e)),
                }
            })
        })
    }

    async fn uploads_page(&self, marker: Option<&(String, String)>) -> Result<Page> {
        let what = || format!("{}: incomplete uploads", self.describe());
        let mut query = vec![("uploads".to_string(), String::new())];
        if !self.prefix.is_empty() {
            query.push(("prefix".into(), format!("{}/", self.prefix)));
        }
        if let Some((key, id)) = marker {
            query.push(("key-marker".into(), key.clone()));
            query.push(("upload-id-marker".into(), id.clone()));
        }
        let opts = SignedUrlOptions::new().with_query(query);
        let url = self
            .store
            .signed_url_opts(Method::GET, &ObjPath::from(""), LINK_TTL, &opts)
            .await
            .map_err(|e| Self::err("sign-list-uploads", &what(), e))?;
        let client = object_store::client::ReqwestConnector::default()
            .connect(&ClientOptions::new().with_allow_http(self.allow_http))
            .map_err(|e| Self::err("list-uploads", &what(), e))?;
        let mut request = HttpRequest::new(HttpRequestBody::empty());
        *request.uri_mut() = url
            .as_str()
            .parse()
            .map_err(|e| failed(what(), format!("{e}"), false))?;
        let response = client
            .execute(request)
            .await
            .map_err(|e| failed(what(), format!("{e}"), true))?;
        let status = response.status();
        let body = response
            .into_body()
            .bytes()
            .await
            .map_err(|e| failed(what(), format!("{e}"), true))?;
        if !status.is_success() || body.len() > MAX_PAGE_BYTES {
            let text = String::from_utf8_lossy(&body[..body.len().min(300)]).into_owned();
            let transient = status.is_server_error() || status.as_u16() == 429;
            return Err(failed(
                what(),
                format!("status {status}: {text}"),
                transient,
            ));
        }
        parse_page(&String::from_utf8_lossy(&body), &self.prefix)
            .ok_or_else(|| failed(what(), "an answer that does not parse".into(), false))
    }
}

fn failed(key: String, why: String, transient: bool) -> Error {
    Error::Remote {
        op: "list-uploads",
        key,
        transient,
        source: why.into(),
    }
}

/// How long the signed listing request stays valid.
const LINK_TTL: Duration = Duration::from_secs(300);

/// Parse a ListMultipartUploadsResult; keys are made relative to `prefix`
/// (an upload outside it is not the store's and is left out).
fn parse_page(xml: &str, prefix: &str) -> Option<Page> {
    let mut uploads = Vec::new();
    for block in xml.split("<Upload>").skip(1) {
        let block = block.split("</Upload>").next()?;
        let full = element(block, "Key")?;
        let key = match prefix.is_empty() {
            true => Some(full.as_str()),
            false => full.strip_prefix(prefix).and_then(|k| k.strip_prefix('/')),
        };
        let Some(key) = key else { continue };
        uploads.push(Upload {
            key: key.to_string(),
            id: element(block, "UploadId")?,
            initiated_ns: parse_utc(&element(block, "Initiated")?)?,
        });
    }
    let truncated = element(xml, "IsTruncated").is_some_and(|t| t == "true");
    let next = match truncated {
        true => Some((
            element(xml, "NextKeyMarker")?,
            element(xml, "NextUploadIdMarker").unwrap_or_default(),
        )),
        false => None,
    };
    Some(Page { uploads, next })
}

/// The unescaped text of the first `<name>…</name>` in `xml`.
fn element(xml: &str, name: &str) -> Option<String> {
    let open = format!("<{name}>");
    let start = xml.find(&open)? + open.len();
    let len = xml[start..].find(&format!("</{name}>"))?;
    Some(unescape(&xml[start..start + len]))
}

fn unescape(s: &str) -> String {
    s.replace("&lt;", "<")
        .replace("&gt;", ">")
        .replace("&quot;", "\"")
        .replace("&apos;", "'")
        .replace("&amp;", "&")
}

/// `YYYY-MM-DDTHH:MM:SS[.fff]Z` as Unix nanoseconds.
fn parse_utc(s: &str) -> Option<i64> {
    let s = s.strip_suffix('Z')?;
    let (date, time) = s.split_once('T')?;
    let mut d = date.splitn(3, '-').map(|p| p.parse::<i64>().ok());
    let (y, m, day) = (d.next()??, d.next()??, d.next()??);
    let (hms, frac) = time.split_once('.').unwrap_or((time, ""));
    let mut t = hms.splitn(3, ':').map(|p| p.parse::<i64>().ok());
    let (h, min, sec) = (t.next()??, t.next()??, t.next()??);
    let nanos = match frac {
        "" => 0,
        f if f.len() <= 9 && f.bytes().all(|b| b.is_ascii_digit()) => {
            f.parse::<i64>().ok()? * 10i64.pow(9 - f.len() as u32)
        }
        _ => return None,
    };
    let secs = days_from_civil(y, m, day) * 86_400 + h * 3_600 + min * 60 + sec;
    secs.checked_mul(1_000_000_000)?.checked_add(nanos)
}

/// Howard Hinnant's civil-to-days algorithm (days since 1970-01-01).
fn days_from_civil(y: i64, m: i64, d: i64) -> i64 {
    let y = if m <= 2 { y - 1 } else { y };
    let era = y.div_euclid(400);
    let yoe = y - era * 400;
    let mp = (m + 9) % 12;
    let doy = (153 * mp + 2) / 5 + d - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    era * 146_097 + doe - 719_468
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn service_times_parse_to_unix_nanoseconds() {
        assert_eq!(parse_utc("1970-01-01T00:00:00Z"), Some(0));
        assert_eq!(
            parse_utc("2026-12-06T16:00:01.250Z"),
            Some(1_796_572_801_250_000_000)
        );
        assert_eq!(parse_utc("2026-12-06 16:00:01Z"), None);
    }

    #[test]
    fn a_listing_keeps_the_store_s_uploads_and_its_next_page() {
        let xml = "<ListMultipartUploadsResult><IsTruncated>true</IsTruncated>\
            <NextKeyMarker>p/b</NextKeyMarker><NextUploadIdMarker>u2</NextUploadIdMarker>\
            <Upload><Key>p/objects/a&amp;b</Key><UploadId>u1</UploadId>\
            <Initiated>1970-01-01T00:00:01Z</Initiated></Upload>\
            <Upload><Key>other/x</Key><UploadId>u9</UploadId>\
            <Initiated>1970-01-01T00:00:01Z</Initiated></Upload>\
            </ListMultipartUploadsResult>";
        let page = parse_page(xml, "p").unwrap();
        assert_eq!(
            page.uploads,
            vec![Upload {
                key: "objects/a&b".into(),
                id: "u1".into(),
                initiated_ns: 1_000_000_000
            }]
        );
        assert_eq!(page.next, Some(("p/b".into(), "u2".into())));
        assert!(parse_page("<Upload><Key>k</Key></Upload>", "").is_none());
    }
}
