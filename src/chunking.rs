//! Content-defined chunking: where a large file is cut into chunks.
//!
//! A gear hash (FastCDC, Xia et al. 2016/2020) rolls over the bytes; a cut
//! falls where its top bits are zero. The hash depends only on the last 64
//! bytes, so an insertion moves the cuts near it and no others, and equal
//! runs of content are cut alike in any file. Normalized chunking (a harder
//! mask before the average size, an easier one after) keeps sizes close to
//! [`AVG`]; [`MIN`] and [`MAX`] bound them. The parameters are part of the
//! store's behaviour, not its format: a reader never needs them.

/// Smallest chunk (except a file's or a data extent's last one).
pub const MIN: usize = 256 << 10;
/// Target average chunk.
pub const AVG: usize = 1 << 20;
/// Largest chunk.
pub const MAX: usize = crate::format::chunk::MAX_CHUNK as usize;

/// Top 22 bits: a cut is 4x less likely than at the average, before it.
const MASK_HARD: u64 = !0u64 << (64 - 22);
/// Top 18 bits: 4x more likely, after it.
const MASK_EASY: u64 = !0u64 << (64 - 18);

/// 256 pseudo-random 64-bit values (splitmix64 from a fixed seed).
const GEAR: [u64; 256] = gear_table();

const fn gear_table() -> [u64; 256] {
    let mut table = [0u64; 256];
    let mut state: u64 = 0x5354_5241_5441_4344; // "STRATACD"
    let mut i = 0;
    while i < 256 {
        state = state.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = state;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        table[i] = z ^ (z >> 31);
        i += 1;
    }
    table
}

/// Length of the first chunk of `data`. `data` holds at least [`MAX`] bytes
/// unless it is the end of the extent being cut (then all of it may be one
/// chunk).
pub fn cut(data: &[u8]) -> usize {
    let n = data.len().min(MAX);
    if n <= MIN {
        return n;
    }
    let mut fp: u64 = 0;
    let normal = AVG.min(n);
    for (i, &b) in data.iter().enumerate().take(normal).skip(MIN) {
        fp = (fp << 1).wrapping_add(GEAR[b as usize]);
        if fp & MASK_HARD == 0 {
            return i + 1;
        }
    }
    for (i, &b) in data.iter().enumerate().take(n).skip(normal) {
        fp = (fp << 1).wrapping_add(GEAR[b as usize]);
        if fp & MASK_EASY == 0 {
            return i + 1;
        }
    }
    n
}

/// Bytes of the window the gear hash covers: after this many bytes the
/// hash at a position depends on nothing before them.
const WINDOW: usize = 64;

/// Bytes per piece of a parallel candidate scan.
const SCAN_PIECE: usize = 1 << 20;

/// A position whose full-window hash passes the easy mask: (index of the
/// byte, whether it passes the hard mask too).
type Candidate = (usize, bool);

/// Every position `p >= WINDOW - 1` of `data` whose full-window hash
/// passes the easy mask, in order, scanned in pieces on the rayon pool.
fn candidates(data: &[u8]) -> Vec<Candidate> {
    use rayon::prelude::*;
    let first = WINDOW - 1;
    if data.len() <= first {
        return Vec::new();
    }
    let pieces: Vec<usize> = (first..data.len()).step_by(SCAN_PIECE).collect();
    pieces
        .par_iter()
        .map(|&start| scan(data, start, (start + SCAN_PIECE).min(data.len())))
        .collect::<Vec<_>>()
        .concat()
}

/// The candidates in `[start, end)` (`start >= WINDOW - 1`). Two halves
/// are hashed in one loop: each hash is a chain of dependent steps, and two
/// chains keep the core busy while either waits.
fn scan(data: &[u8], start: usize, end: usize) -> Vec<Candidate> {
    let mid = start + (end - start) / 2;
    let warm = |at: usize| {
        data[at + 1 - WINDOW..at]
            .iter()
            .fold(0u64, |fp, &b| (fp << 1).wrapping_add(GEAR[b as usize]))
    };
    let (mut fa, mut fb) = (warm(start), warm(mid));
    let (mut ca, mut cb) = (Vec::new(), Vec::new());
    let (left, right) = (&data[start..mid], &data[mid..end]);
    for (i, (&a, &b)) in left.iter().zip(right).enumerate() {
        fa = (fa << 1).wrapping_add(GEAR[a as usize]);
        fb = (fb << 1).wrapping_add(GEAR[b as usize]);
        if fa & MASK_EASY == 0 {
            ca.push((start + i, fa & MASK_HARD == 0));
        }
        if fb & MASK_EASY == 0 {
            cb.push((mid + i, fb & MASK_HARD == 0));
        }
    }
    // The right half is one byte longer when the piece is odd.
    for (i, &b) in right.iter().enumerate().skip(left.len()) {
        fb = (fb << 1).wrapping_add(GEAR[b as usize]);
        if fb & MASK_EASY == 0 {
            cb.push((mid + i, fb & MASK_HARD == 0));
        }
    }
    ca.extend(cb);
    ca
}

/// The length of the chunk starting at `s`, exactly as [`cut`] finds it:
/// the first `WINDOW - 1` positions hashed (where the hash still covers
/// fewer bytes than the window) are hashed here, the rest come from
/// `cands`.
fn cut_from(data: &[u8], s: usize, cands: &[Candidate]) -> usize {
    let n = (data.len() - s).min(MAX);
    if n <= MIN {
        return n;
    }
    let normal = AVG.min(n);
    let partial = (MIN + WINDOW - 1).min(n);
    let mut fp: u64 = 0;
    for i in MIN..partial {
        fp = (fp << 1).wrapping_add(GEAR[data[s + i] as usize]);
        let mask = if i < normal { MASK_HARD } else { MASK_EASY };
        if fp & mask == 0 {
            return i + 1;
        }
    }
    let from = cands.partition_point(|&(p, _)| p < s + partial);
    cands[from..]
        .iter()
        .take_while(|&&(p, _)| p < s + n)
        .find(|&&(p, hard)| hard || p - s >= normal)
        .map_or(n, |&(p, _)| p - s + 1)
}

/// The lengths of the chunks [`cut`] finds at the front of `data`, with
/// the scan for cut points spread over every core: every chunk while at
/// least [`MAX`] bytes remain, and the rest too when `last` (`data` ends
/// the extent).
pub fn cut_all(data: &[u8], last: bool) -> Vec<usize> {
    let cands = candidates(data);
    let mut out = Vec::new();
    let mut s = 0;
    while s < data.len() && (last || data.len() - s >= MAX) {
        let n = cut_from(data, s, &cands);
        out.push(n);
        s += n;
    }
    out
}

/// Cut `data` (a whole extent) into chunk lengths.
pub fn cuts(mut data: &[u8]) -> Vec<usize> {
    let mut out = Vec::new();
    while !data.is_empty() {
        let n = cut(data);
        out.push(n);
        data = &data[n..];
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn noise(len: usize, seed: u64) -> Vec<u8> {
        let mut s = seed;
        (0..len)
            .map(|_| {
                s ^= s << 13;
                s ^= s >> 7;
                s ^= s << 17;
                s as u8
            })
            .collect()
    }

    /// Chunk boundaries as absolute offsets.
    fn boundaries(data: &[u8]) -> Vec<usize> {
        let mut at = 0;
        cuts(data)
            .into_iter()
            .map(|n| {
                at += n;
                at
            })
            .collect()
    }

    #[test]
    fn sizes_stay_within_bounds_and_near_the_average() {
        let data = noise(64 << 20, 7);
        let lens = cuts(&data);
        assert_eq!(lens.iter().sum::<usize>(), data.len());
        let (last, rest) = lens.split_last().unwrap();
        assert!(*last <= MAX);
        assert!(rest.iter().all(|&n| (MIN..=MAX).contains(&n)), "{lens:?}");
        let avg = data.len() / lens.len();
        assert!((AVG / 2..AVG * 2).contains(&avg), "average {avg}");
    }

    #[test]
    fn the_parallel_scan_cuts_exactly_where_the_sequential_one_does() {
        for (len, seed) in [(0, 1), (100, 2), (MIN + 70, 3), (9 << 20, 4), (33 << 20, 5)] {
            let data = noise(len, seed);
            assert_eq!(cut_all(&data, true), cuts(&data), "{len} bytes");
            let complete = cut_all(&data, false);
            let expected: Vec<usize> = cuts(&data)
                .into_iter()
                .scan(0, |at, n| {
                    let keep = data.len() - *at >= MAX;
                    *at += n;
                    Some((n, keep))
                })
                .take_while(|&(_, keep)| keep)
                .map(|(n, _)| n)
                .collect();
            assert_eq!(complete, expected, "{len} bytes, complete chunks only");
        }
        // Runs of equal bytes: hashes repeat, cuts at the bounds.
        let zeros = vec![0u8; 10 << 20];
        assert_eq!(cut_all(&zeros, true), cuts(&zeros));
    }

    #[test]
    fn an_insertion_moves_only_nearby_boundaries() {
        let data = noise(32 << 20, 11);
        let mut edited = data.clone();
        let at = 16 << 20;
        edited.splice(at..at, noise(4096, 3));
        let before = boundaries(&data);
        let after: Vec<usize> = boundaries(&edited)
            .into_iter()
            .map(|b| if b > at { b - 4096 } else { b })
            .collect();
        let same = before.iter().filter(|b| after.contains(b)).count();
        assert!(
            same + 3 >= before.len(),
            "{same} of {} boundaries kept",
            before.len()
        );
    }
}
