//! Where each row stream of a striped matrix-vector product starts, so that the streams do not share
//! L1 sets.
//!
//! The decode layout cuts `n` rows into `RD` stripes of `q` rows and walks them side by side: stream `i`
//! reads row `i·q + g` at step `g`. When `q·rb` (the stripes' distance in bytes) is a multiple of 4 KiB,
//! as it is for most of the models' shapes (the 9B's 12288×4096 Q4_K: 768 rows × 2304 bytes = 432 pages),
//! every stream reads at the same offset within its page: the same L1 sets (64 sets of 64 bytes on
//! Zen 4 and the Intel cores we run on), 16 streams of 2–3 lines each in 8 ways. Then every load of the
//! 16-row tile misses L1: with its 256 rows in L2, Zen 4 ran the 3-token tile at 14 GB/s, and at 18 GB/s
//! with all 16 streams on one row. Starting stream `i` at row `s_i` of its stripe (and wrapping once)
//! puts its offset within the page near `i·4096/RD` instead.

/// The L1 set period: 64 sets × 64-byte lines.
const PAGE: usize = 4096;

/// Start offsets `s_i < q` for `RD` streams over stripes of `q` rows of `rb` bytes: stream `i` begins
/// at row `i·q + s_i` and wraps to `i·q` after row `i·q + q − 1`. `s_i·rb ≡ i·PAGE/rd − i·q·rb`
/// (mod PAGE) as nearly as `rb`'s powers of two allow; 0 where no offset can spread the streams.
pub fn stream_starts<const RD: usize>(q: usize, rb: usize) -> [usize; RD] {
    let mut s = [0usize; RD];
    if q < 2 || rb == 0 {
        return s;
    }
    // s·rb mod PAGE reaches the multiples of g = gcd(rb, PAGE), i.e. s·u mod m with u = rb/g odd.
    let g = 1usize << rb.trailing_zeros().min(PAGE.trailing_zeros());
    let m = PAGE / g;
    if m == 1 {
        return s;
    }
    let inv = inverse_mod_pow2((rb / g) as u64) as usize & (m - 1);
    for (i, si) in s.iter_mut().enumerate() {
        let target = i * PAGE / RD;
        let base = (i * q * rb) % PAGE;
        let c = ((target + PAGE - base + g / 2) % PAGE) / g;
        let exact = c * inv % m;
        *si = if exact < q {
            exact
        } else {
            // Short stripes (q < m): the nearest offset a row of the stripe reaches. The search takes
            // q steps, against the q rows of work the stream has ahead of it.
            (0..q)
                .min_by_key(|&s| circular_distance((base + s * rb) % PAGE, target))
                .unwrap_or(0)
        };
    }
    s
}

/// Distance between two offsets within a page, around the page.
fn circular_distance(a: usize, b: usize) -> usize {
    let d = a.abs_diff(b);
    d.min(PAGE - d)
}

/// The inverse of an odd `u` modulo 2⁶⁴ (Newton's iteration doubles the correct low bits each step).
fn inverse_mod_pow2(u: u64) -> u64 {
    debug_assert!(u % 2 == 1);
    let mut x = u; // correct to 3 bits: u·u ≡ 1 (mod 8) for odd u
    for _ in 0..5 {
        x = x.wrapping_mul(2u64.wrapping_sub(u.wrapping_mul(x)));
    }
    x
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Offset of stream `i`'s first row within its page.
    fn page_offset(i: usize, q: usize, rb: usize, s: usize) -> usize {
        ((i * q + s) * rb) % PAGE
    }

    #[test]
    fn inverse_is_an_inverse() {
        for u in (1..10_000u64)
            .step_by(2)
            .chain([u64::MAX, 0x9E37_79B9_7F4A_7C15])
        {
            assert_eq!(u.wrapping_mul(inverse_mod_pow2(u)), 1, "u = {u}");
        }
    }

    #[test]
    fn streams_spread_over_the_page() {
        // Q4_K rows of 4096 (2304 bytes) and 12288 (6912) columns, Q6_K of 4096 (3360), F16 of 1000.
        for (q, rb) in [
            (768, 2304),
            (256, 6912),
            (768, 3360),
            (64, 2000),
            (16, 2304),
        ] {
            let s = stream_starts::<16>(q, rb);
            let g = 1usize << rb.trailing_zeros().min(12);
            for (i, &si) in s.iter().enumerate() {
                assert!(si < q);
                let want = i * PAGE / 16;
                let got = page_offset(i, q, rb, si);
                // The best any row of the stripe reaches.
                let best = (0..q)
                    .map(|s| circular_distance(page_offset(i, q, rb, s), want))
                    .min()
                    .unwrap();
                let dist = circular_distance(got, want);
                assert!(
                    dist <= (g / 2).max(best),
                    "q {q} rb {rb} stream {i}: offset {got}, wanted {want}"
                );
                assert!(dist <= 64, "q {q} rb {rb} stream {i}: {dist} bytes off");
            }
        }
    }

    #[test]
    fn no_offset_where_none_helps() {
        // Rows of whole pages: every row starts at offset 0 whatever the start.
        assert_eq!(stream_starts::<4>(100, 8192), [0; 4]);
        // One row per stripe.
        assert_eq!(stream_starts::<16>(1, 2304), [0; 16]);
    }
}
