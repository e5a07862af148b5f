//! Philox4x32-10, the counter-based generator of Salmon et al., "Parallel random numbers: as
//! easy as 1, 2, 3" (SC'11). A draw is a pure function of (key, counter): tensorfold keys it
//! with the request's seed and counts by the token's position in its sequence, so a sampled
//! token does not depend on which batch it was in, on restarts, or on drafting.
//!
//! Rejected: a stateful stream RNG per request (its state depends on how many draws happened,
//! which speculative decoding changes).

const M0: u32 = 0xD251_1F53;
const M1: u32 = 0xCD9E_8D57;
const W0: u32 = 0x9E37_79B9;
const W1: u32 = 0xBB67_AE85;

fn mulhilo(a: u32, b: u32) -> (u32, u32) {
    let p = u64::from(a) * u64::from(b);
    ((p >> 32) as u32, p as u32)
}

/// Ten rounds of Philox4x32 on `counter` under `key`.
pub fn philox4x32_10(counter: [u32; 4], key: [u32; 2]) -> [u32; 4] {
    let (mut c, mut k) = (counter, key);
    for round in 0..10 {
        if round > 0 {
            k = [k[0].wrapping_add(W0), k[1].wrapping_add(W1)];
        }
        let (hi0, lo0) = mulhilo(M0, c[0]);
        let (hi1, lo1) = mulhilo(M1, c[2]);
        c = [hi1 ^ c[1] ^ k[0], lo1, hi0 ^ c[3] ^ k[1], lo0];
    }
    c
}

/// A uniform draw in [0, 1) with 53 random bits, keyed by (seed, position, stream).
/// `stream` separates independent uses at one position (e.g. drafting's acceptance test).
pub fn uniform(seed: u64, position: u64, stream: u32) -> f64 {
    let key = [seed as u32, (seed >> 32) as u32];
    let out = philox4x32_10([position as u32, (position >> 32) as u32, stream, 0], key);
    let bits = (u64::from(out[0]) << 32 | u64::from(out[1])) >> 11;
    bits as f64 * (1.0 / (1u64 << 53) as f64)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Known-answer vectors published with Random123 (kat_vectors, philox4x32 10 rounds).
    #[test]
    fn known_answers() {
        assert_eq!(philox4x32_10([0; 4], [0; 2]), [0x6627e8d5, 0xe169c58d, 0xbc57ac4c, 0x9b00dbd8]);
        assert_eq!(
            philox4x32_10([u32::MAX; 4], [u32::MAX; 2]),
            [0x408f276d, 0x41c83b0e, 0xa20bc7c6, 0x6d5451fd]
        );
        assert_eq!(
            philox4x32_10(
                [0x243f6a88, 0x85a308d3, 0x13198a2e, 0x03707344],
                [0xa4093822, 0x299f31d0]
            ),
            [0xd16cfe09, 0x94fdcceb, 0x5001e420, 0x24126ea1]
        );
    }

    #[test]
    fn uniform_in_range_and_keyed() {
        let a = uniform(7, 100, 0);
        assert!((0.0..1.0).contains(&a));
        assert_eq!(a, uniform(7, 100, 0));
        assert_ne!(a, uniform(8, 100, 0));
        assert_ne!(a, uniform(7, 101, 0));
        assert_ne!(a, uniform(7, 100, 1));
        let mean: f64 = (0..10_000).map(|p| uniform(1, p, 0)).sum::<f64>() / 10_000.0;
        assert!((mean - 0.5).abs() < 0.02, "mean {mean}");
    }
}
