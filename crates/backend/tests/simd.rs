//! The SIMD primitives every kernel is built on: each level equals the scalar level bit for bit
//! on hard inputs (NaN, infinities, subnormals, rounding ties), `exp` is within 2 ulp of the
//! float64 value, and bf16 rounding is round-to-nearest-even as `half` does it.

mod common;

use common::Rng;
use tf_backend::cpu::simd::{math, scalar::Scalar, Kernel, Simd, SimdLevel};

/// Values that stress every branch: specials, subnormals, ties, the exp cut-offs.
fn hard_values(rng: &mut Rng) -> Vec<f32> {
    let mut v = vec![
        0.0,
        -0.0,
        1.0,
        -1.0,
        f32::INFINITY,
        f32::NEG_INFINITY,
        f32::NAN,
        -f32::NAN,
        f32::from_bits(0x7fc0_1234),
        f32::MIN_POSITIVE,
        f32::from_bits(1),
        f32::from_bits(0x8000_0001),
        f32::from_bits(0x0040_0000),
        f32::MAX,
        f32::MIN,
        88.72283,
        88.72284,
        89.0,
        89.5,
        -87.33654,
        -103.9,
        -104.0,
        -104.5,
        -150.0,
        f32::from_bits(0x3f80_8000), // bf16 tie, even below
        f32::from_bits(0x3f81_8000), // bf16 tie, odd below
        f32::from_bits(0x7f7f_8000), // rounds up to infinity
    ];
    for _ in 0..2000 {
        v.push(f32::from_bits(rng.next_u64() as u32));
        v.push((rng.normal() * 30.0) as f32);
    }
    while v.len() % 16 != 0 {
        v.push(0.5);
    }
    v
}

/// Runs `exp`, `silu`, `round_bf16_v`, `store_bf16` and `reduce` over `xs`.
struct Ops<'a>(&'a [f32]);

impl Kernel for Ops<'_> {
    type Output = Vec<u32>;
    fn run<S: Simd>(self, s: S) -> Vec<u32> {
        let mut out = Vec::new();
        for c in self.0.chunks_exact(16) {
            let mut f = [0f32; 16];
            let mut h = [0u16; 16];
            // SAFETY: every buffer holds 16 elements.
            unsafe {
                let v = s.load(c.as_ptr());
                s.store(f.as_mut_ptr(), math::exp(s, v));
                out.extend(f.iter().map(|x| x.to_bits()));
                s.store(f.as_mut_ptr(), math::silu(s, v));
                out.extend(f.iter().map(|x| x.to_bits()));
                s.store(f.as_mut_ptr(), math::round_bf16_v(s, v));
                out.extend(f.iter().map(|x| x.to_bits()));
                s.store_bf16(h.as_mut_ptr(), v);
                out.extend(h.iter().map(|&x| x as u32));
                s.store(f.as_mut_ptr(), s.load_bf16(h.as_ptr()));
                out.extend(f.iter().map(|x| x.to_bits()));
                out.push(s.reduce(v).to_bits());
                // 16 distinct vectors (rotations, scaled) summed at once.
                let dbl: Vec<f32> = c.iter().chain(c).copied().collect();
                let vs: [S::V; 16] = std::array::from_fn(|i| {
                    s.mul(s.load(dbl.as_ptr().add(i)), s.splat(1.0 + i as f32 / 16.0))
                });
                out.extend(s.reduce16(&vs).iter().map(|x| x.to_bits()));
                s.store(f.as_mut_ptr(), s.min(s.max(v, s.splat(-3.0)), s.splat(2.0)));
                out.extend(f.iter().map(|x| x.to_bits()));
                s.store(f.as_mut_ptr(), s.max(s.splat(f32::NAN), v));
                out.extend(f.iter().map(|x| x.to_bits()));
                s.store(f.as_mut_ptr(), s.round_even(s.mul(v, s.splat(1e-30))));
                out.extend(f.iter().map(|x| x.to_bits()));
                s.store_n(f.as_mut_ptr(), s.load_n(c.as_ptr(), 5), 7);
                out.extend(f.iter().map(|x| x.to_bits()));
                let b: Vec<u8> = c.iter().map(|x| x.to_bits() as u8).collect();
                s.store(f.as_mut_ptr(), s.to_float(s.load_i8(b.as_ptr())));
                out.extend(f.iter().map(|x| x.to_bits()));
                s.store(f.as_mut_ptr(), s.to_float(s.mask_bits(c[0].to_bits(), 16)));
                out.extend(f.iter().map(|x| x.to_bits()));
                let idx = s.load_i8(b.as_ptr());
                s.store(f.as_mut_ptr(), s.lut16(v, idx));
                out.extend(f.iter().map(|x| x.to_bits()));
                s.store(f.as_mut_ptr(), s.splat_f16(c[1].to_bits() as u16));
                out.extend(f.iter().map(|x| x.to_bits()));
                let (lo, hi) = s.splat_f16x2(c[2].to_bits());
                s.store(f.as_mut_ptr(), s.sub(hi, lo));
                out.extend(f.iter().map(|x| x.to_bits()));
                s.prefetch(c.as_ptr().cast());
                let h16: Vec<u16> = c.iter().map(|x| x.to_bits() as u16).collect();
                s.store(f.as_mut_ptr(), s.load_f16(h16.as_ptr()));
                out.extend(f.iter().map(|x| x.to_bits()));
            }
        }
        out
    }
}

#[test]
fn every_level_matches_the_scalar_bits_on_hard_inputs() {
    let xs = hard_values(&mut Rng::new(1));
    let want = Scalar.vectorize(Ops(&xs));
    println!("levels: {:?}", SimdLevel::all_supported());
    for level in SimdLevel::all_supported() {
        let got = level.dispatch(Ops(&xs));
        assert_eq!(got.len(), want.len());
        // NaN payloads and signs are unspecified (Rust float semantics let the compiler
        // commute operands); which lanes are NaN is not. bf16 NaNs are 0x7f81..0xffff.
        let nan = |x: u32| f32::from_bits(x).is_nan() || (x < 0x10000 && (x & 0x7fff) > 0x7f80);
        if let Some(i) =
            (0..got.len()).find(|&i| got[i] != want[i] && !(nan(got[i]) && nan(want[i])))
        {
            panic!("{level}: output {i} is {:#x}, scalar {:#x}", got[i], want[i]);
        }
    }
}

fn ulps(a: f32, b: f64) -> f64 {
    let b32 = b as f32;
    let ulp = (f32::from_bits(b32.abs().to_bits() + 1) - b32.abs()) as f64;
    (a as f64 - b).abs() / ulp
}

#[test]
fn exp_is_within_two_ulp_of_float64() {
    let mut worst = 0f64;
    let mut x = -87.0f32;
    while x < 88.7 {
        let xs = [x; 16];
        let y = math::exp(Scalar, xs)[0];
        let e = ulps(y, (x as f64).exp());
        worst = worst.max(e);
        assert!(e <= 2.0, "exp({x}) = {y}, f64 {} ({e} ulp)", (x as f64).exp());
        x += 0.000_37;
    }
    println!("exp worst error {worst:.2} ulp");
    let e = |x: f32| math::exp(Scalar, [x; 16])[0];
    assert_eq!(e(f32::NEG_INFINITY), 0.0);
    assert_eq!(e(-200.0), 0.0);
    assert_eq!(e(f32::INFINITY), f32::INFINITY);
    assert_eq!(e(100.0), f32::INFINITY);
    assert!(e(f32::NAN).is_nan());
    assert_eq!(e(0.0), 1.0);
    // Subnormal results are rounded, not flushed.
    let y = e(-100.0);
    assert!(
        y > 0.0 && y < f32::MIN_POSITIVE && ulps(y, (-100f64).exp()) <= 1.0,
        "exp(-100) = {y:e}"
    );
}

#[test]
fn bf16_rounding_is_nearest_even_like_half() {
    let mut rng = Rng::new(2);
    for x in hard_values(&mut rng) {
        let want = half::bf16::from_f32(x).to_bits();
        let got = math::f32_to_bf16(x);
        if x.is_nan() {
            assert!(math::bf16_to_f32(got).is_nan(), "{x}");
        } else {
            assert_eq!(got, want, "{x:e} ({:#x})", x.to_bits());
        }
    }
    for h in 0..=u16::MAX {
        let want = half::f16::from_bits(h).to_f32();
        let got = math::f16_to_f32(h);
        assert!(got.to_bits() == want.to_bits() || (got.is_nan() && want.is_nan()), "f16 {h:#x}");
    }
}
