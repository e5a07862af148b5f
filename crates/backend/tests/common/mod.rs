//! Shared helpers of the CPU backend tests: a seeded RNG, random weights of every format, the
//! independent decoding of `tf_checkpoint::quant` (scalar ggml port) and float64 references.
#![allow(dead_code)]

pub mod bench;
pub mod cuda;

use tf_backend::cpu::{CpuBackend, CpuConfig, CpuTensor, CpuWeight, SimdLevel};
use tf_backend::Backend;
use tf_checkpoint::{DType, GgmlType, TensorFormat, TensorView};

/// splitmix64: small, seeded, good enough for test data.
pub struct Rng(u64);

impl Rng {
    pub fn new(seed: u64) -> Rng {
        Rng(seed ^ 0x9e37_79b9_7f4a_7c15)
    }
    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }
    /// Uniform in [0, 1).
    pub fn uniform(&mut self) -> f64 {
        (self.next_u64() >> 11) as f64 / (1u64 << 53) as f64
    }
    /// Standard normal (Box-Muller).
    pub fn normal(&mut self) -> f64 {
        let u1 = self.uniform().max(1e-300);
        let u2 = self.uniform();
        (-2.0 * u1.ln()).sqrt() * (2.0 * std::f64::consts::PI * u2).cos()
    }
    pub fn below(&mut self, n: usize) -> usize {
        (self.next_u64() % n as u64) as usize
    }
    pub fn bytes(&mut self, n: usize) -> Vec<u8> {
        (0..n).map(|_| self.next_u64() as u8).collect()
    }
}

pub const ALL_FORMATS: [TensorFormat; 11] = [
    TensorFormat::Plain(DType::BF16),
    TensorFormat::Plain(DType::F16),
    TensorFormat::Plain(DType::F32),
    TensorFormat::Ggml(GgmlType::Q4_0),
    TensorFormat::Ggml(GgmlType::Q4_1),
    TensorFormat::Ggml(GgmlType::Q5_0),
    TensorFormat::Ggml(GgmlType::Q5_1),
    TensorFormat::Ggml(GgmlType::Q8_0),
    TensorFormat::Ggml(GgmlType::Q4_K),
    TensorFormat::Ggml(GgmlType::Q5_K),
    TensorFormat::Ggml(GgmlType::Q6_K),
];

fn put_f16(b: &mut [u8], at: usize, v: f64) {
    b[at..at + 2].copy_from_slice(&half::f16::from_f64(v).to_le_bytes());
}

/// A random `(n, k)` weight of `format`, values of order `scale`: random codes with sane f16
/// scales (and mins), or random normals for plain formats.
pub fn random_weight(
    rng: &mut Rng,
    format: TensorFormat,
    n: usize,
    k: usize,
    scale: f64,
) -> TensorView {
    let bytes = match format {
        TensorFormat::Plain(d) => {
            let mut out = Vec::with_capacity(n * k * d.size());
            for _ in 0..n * k {
                let v = rng.normal() * scale;
                match d {
                    DType::BF16 => out.extend_from_slice(&half::bf16::from_f64(v).to_le_bytes()),
                    DType::F16 => out.extend_from_slice(&half::f16::from_f64(v).to_le_bytes()),
                    DType::F32 => out.extend_from_slice(&(v as f32).to_le_bytes()),
                    _ => unreachable!("plain test formats are bf16/f16/f32"),
                }
            }
            out
        }
        TensorFormat::Ggml(t) => {
            let nb = n * k / t.block_elems();
            let bb = t.block_bytes();
            let mut out = rng.bytes(nb * bb);
            for blk in out.chunks_exact_mut(bb) {
                let d = scale * (0.5 + rng.uniform()) / 8.0;
                match t {
                    GgmlType::Q4_0 | GgmlType::Q5_0 | GgmlType::Q8_0 => put_f16(blk, 0, d / 4.0),
                    GgmlType::Q4_1 | GgmlType::Q5_1 => {
                        put_f16(blk, 0, d);
                        put_f16(blk, 2, -8.0 * d * (0.5 + rng.uniform()));
                    }
                    GgmlType::Q4_K | GgmlType::Q5_K => {
                        put_f16(blk, 0, d / 32.0);
                        put_f16(blk, 2, d / 8.0 * rng.uniform());
                    }
                    GgmlType::Q6_K => put_f16(blk, 208, d / 64.0),
                }
            }
            out
        }
    };
    TensorView::owned("test.weight", format, vec![n, k], bytes)
}

/// A random f32 vector weight (norm weights, biases).
pub fn random_vector(rng: &mut Rng, k: usize, mean: f64, scale: f64) -> TensorView {
    let bytes: Vec<u8> =
        (0..k).flat_map(|_| ((mean + rng.normal() * scale) as f32).to_le_bytes()).collect();
    TensorView::owned("test.vector", TensorFormat::Plain(DType::F32), vec![k], bytes)
}

/// The exact f32 values of a weight, decoded by `tf_checkpoint::quant` (the scalar reference).
pub fn reference_values(view: &TensorView) -> Vec<f32> {
    tf_checkpoint::quant::tensor_to_f32(view).expect("reference decode")
}

/// bf16 activations from normals of `scale`, as (bits, exact f32 values).
pub fn random_bf16(rng: &mut Rng, len: usize, scale: f64) -> (Vec<u16>, Vec<f32>) {
    let bits: Vec<u16> =
        (0..len).map(|_| half::bf16::from_f64(rng.normal() * scale).to_bits()).collect();
    let vals = bits.iter().map(|&b| f32::from_bits((b as u32) << 16)).collect();
    (bits, vals)
}

pub fn backend(level: SimdLevel, threads: usize) -> CpuBackend {
    CpuBackend::with_config(CpuConfig { threads: Some(threads), level: Some(level) })
        .expect("backend")
}

pub fn levels() -> Vec<SimdLevel> {
    SimdLevel::all_supported()
}

pub fn load(be: &CpuBackend, view: &TensorView) -> CpuWeight {
    be.load_weight(view).expect("load_weight")
}

pub fn bf16_tensor(rows: usize, cols: usize, bits: &[u16]) -> CpuTensor {
    CpuTensor::from_bf16_bits(rows, cols, bits.to_vec()).expect("tensor")
}

/// bf16 of an f32 (round to nearest even), via `half`.
pub fn bf16(x: f32) -> f32 {
    half::bf16::from_f32(x).to_f32()
}

/// The unit roundoff of fp32 and the bound factor gamma_d = d u / (1 - d u).
pub fn gamma(d: f64) -> f64 {
    let u = 2f64.powi(-24);
    d * u / (1.0 - d * u)
}
