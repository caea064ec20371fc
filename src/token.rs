//! Owner/attempt tokens: 128 random bits, hex. Every staged or leased name
//! carries one so that a deleted name is never written again.

use rand::RngCore;

pub fn new_token() -> String {
    let mut b = [0u8; 16];
    rand::rng().fill_bytes(&mut b);
    hex::encode(b)
}

/// Nanoseconds since the Unix epoch.
pub fn now_ns() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_nanos() as i64)
        .unwrap_or(0)
}
