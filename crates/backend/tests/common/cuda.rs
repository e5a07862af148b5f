//! Helpers of the GPU tests (`cuda_ops.rs`, `cuda_linear.rs`): the backends, uploads, bit
//! views and the linear/batch plumbing they share.

use tf_backend::batch::{BatchMeta, SeqMeta};
use tf_backend::cpu::CpuBackend;
use tf_backend::cuda::{CudaBackend, CudaTensor, CudaWeight};
use tf_backend::{ActDType, Backend};
use tf_checkpoint::{DType, TensorFormat, TensorView};

use super::{random_bf16, Rng};

/// Row counts of the row-invariance checks below 2,048.
pub const ROWS: [usize; 7] = [1, 2, 3, 8, 16, 17, 128];

/// Where the GPU tests that compile their own sources find NVRTC: the pip wheel's library
/// under `$TENSORFOLD_CACHE` (default `<repo>/.cache`, `scripts/nvrtc-wheels.sh`).
pub fn nvrtc_dirs() -> Vec<std::path::PathBuf> {
    let cache =
        std::env::var_os("TENSORFOLD_CACHE").map(std::path::PathBuf::from).unwrap_or_else(|| {
            std::path::PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../.cache")
        });
    vec![cache.join("nvrtc/nvidia/cu13/lib")]
}

/// A test-only kernel unit compiles for sm_80 and sm_90a (CPU only: NVRTC from the pip wheel).
pub fn compiles_for_sm80_and_sm90a(unit: &tf_backend::cuda::compile::Unit) {
    if let Err(e) = tf_backend::cuda::loader::nvrtc(&nvrtc_dirs()) {
        panic!("{e}\nThis test needs NVRTC from the pip wheel: run scripts/nvrtc-wheels.sh");
    }
    for arch in ["sm_80", "sm_90a"] {
        tf_backend::cuda::compile::compile(unit, arch).unwrap_or_else(|log| panic!("{log}"));
    }
}

pub fn gpu() -> CudaBackend {
    CudaBackend::new(0).unwrap_or_else(|e| panic!("{e}"))
}

pub fn cpu() -> CpuBackend {
    CpuBackend::new().expect("cpu backend")
}

pub fn up(g: &CudaBackend, rows: usize, cols: usize, bits: &[u16]) -> CudaTensor {
    g.upload_bf16(rows, cols, bits).expect("upload")
}

/// bf16 bits of f32 values that hold bf16 values.
pub fn bits(v: &[f32]) -> Vec<u32> {
    v.iter().map(|x| x.to_bits()).collect()
}

/// (max |a - b|, elements whose bits differ).
pub fn diff(a: &[f32], b: &[f32]) -> (f32, usize) {
    assert_eq!(a.len(), b.len());
    let mut m = 0f32;
    let mut n = 0;
    for (x, y) in a.iter().zip(b) {
        assert!(x.is_finite() && y.is_finite(), "non-finite value {x} vs {y}");
        m = m.max((x - y).abs());
        n += (x.to_bits() != y.to_bits()) as usize;
    }
    (m, n)
}

pub fn batch(positions: Vec<u32>, row_seq: Vec<u32>, seqs: Vec<SeqMeta>, bs: usize) -> BatchMeta {
    let rows = positions.len();
    BatchMeta {
        tokens: vec![0; rows],
        positions,
        row_seq,
        seqs,
        logit_rows: vec![],
        block_size: bs,
    }
}

/// One decode row of one sequence (token 1 at position 300, blocks 0..32 of 16 positions,
/// its logits wanted): the step the decode timing tests replay.
pub fn decode_step_meta() -> BatchMeta {
    BatchMeta {
        tokens: vec![1],
        positions: vec![300],
        row_seq: vec![0],
        seqs: vec![SeqMeta { block_table: (0..32).collect() }],
        logit_rows: vec![0],
        block_size: 16,
    }
}

/// linear on the GPU for `rows` of `xb` (row-major, k wide); returns f32 values.
pub fn gpu_linear(
    g: &CudaBackend,
    xb: &[u16],
    rows: usize,
    w: &tf_backend::cuda::CudaWeight,
    bias: Option<&tf_backend::cuda::CudaWeight>,
    dt: ActDType,
) -> Vec<f32> {
    let (n, k) = w.shape();
    let x = up(g, rows, k, &xb[..rows * k]);
    let mut out = g.alloc(dt, rows, n).unwrap();
    g.linear(&x, w, bias, &mut out).unwrap();
    g.read_f32(&out, rows).unwrap()
}

/// Seconds per call of `f`, after a warm-up, over `iters` calls ended by one synchronize.
pub fn per_call(g: &CudaBackend, iters: usize, mut f: impl FnMut()) -> f64 {
    f();
    g.synchronize().unwrap();
    let t = std::time::Instant::now();
    for _ in 0..iters {
        f();
    }
    g.synchronize().unwrap();
    t.elapsed().as_secs_f64() / iters as f64
}

/// (features, K, with bias) of the GEMM kernels' bitwise tests: every llama3-8b and
/// SmolLM2-135M product shape, plus K not a multiple of the 64-k tile (72, 1000, 4104) and an
/// empty trailing K slice (1024 x 4104: 16 slices of 288).
#[allow(dead_code)]
pub const GEMM_CASE_SHAPES: [(usize, usize, bool); 13] = [
    (4096, 4096, false),
    (1024, 4096, false),
    (6144, 4096, false),
    (14336, 4096, false),
    (4096, 14336, false),
    (576, 576, true),
    (192, 576, false),
    (1536, 576, false),
    (576, 1536, false),
    (49152, 576, false),
    (200, 72, true),
    (136, 1000, true),
    (1024, 4104, false),
];

/// A bf16 `(n, k)` matrix of one repeated value (speed only: the values do not matter).
#[allow(dead_code)]
pub fn flat_weight(g: &CudaBackend, n: usize, k: usize) -> tf_backend::cuda::CudaWeight {
    let bytes = [0x3cu8, 0x3c].repeat(n * k);
    let format = tf_checkpoint::TensorFormat::Plain(tf_checkpoint::DType::BF16);
    let view = tf_checkpoint::TensorView::owned("w", format, vec![n, k], bytes);
    g.load_weight(&view).unwrap()
}

/// A random bf16 `(n, k)` weight (scale 1/sqrt(k)).
#[allow(dead_code)]
pub fn rand_weight(
    g: &CudaBackend,
    rng: &mut super::Rng,
    n: usize,
    k: usize,
) -> tf_backend::cuda::CudaWeight {
    let fmt = tf_checkpoint::TensorFormat::Plain(tf_checkpoint::DType::BF16);
    g.load_weight(&super::random_weight(rng, fmt, n, k, 1.0 / (k as f64).sqrt())).unwrap()
}

/// A random f32 vector of n around 1 (norm weights, biases).
#[allow(dead_code)]
pub fn rand_vector(
    g: &CudaBackend,
    rng: &mut super::Rng,
    n: usize,
) -> tf_backend::cuda::CudaWeight {
    g.load_weight(&super::random_vector(rng, n, 1.0, 0.25)).unwrap()
}

/// A bf16 activation tensor of (rows, cols).
#[allow(dead_code)]
pub fn bf(g: &CudaBackend, rows: usize, cols: usize) -> CudaTensor {
    g.alloc(ActDType::Bf16, rows, cols).unwrap()
}

/// The first `rows` rows of `t` as f32 bit patterns.
#[allow(dead_code)]
pub fn read_bits(g: &CudaBackend, t: &CudaTensor, rows: usize) -> Vec<u32> {
    g.read_f32(t, rows).unwrap().iter().map(|v| v.to_bits()).collect()
}

/// A bf16 `[positions, hd]` table: random values (`real` false: every rounding case) or
/// cos/sin of a rope's angles (speed runs, so repeated rotations stay bounded).
pub fn rope_table(rng: &mut Rng, npos: usize, hd: usize, real: bool) -> Vec<u16> {
    let half = hd / 2;
    let bits: Vec<u16> = match real {
        false => random_bf16(rng, npos * hd, 1.0).0,
        true => (0..npos * hd)
            .map(|j| {
                let (p, i) = ((j / hd) as f64, j % hd);
                let f = 10000f64.powf(-((i % half) as f64) / half as f64);
                let a = p * f;
                half::bf16::from_f64(if i < half { a.cos() } else { a.sin() }).to_bits()
            })
            .collect(),
    };
    bits
}

pub fn table_weight(g: &CudaBackend, bits: &[u16], npos: usize, hd: usize) -> CudaWeight {
    let bytes = bits.iter().flat_map(|b| b.to_le_bytes()).collect();
    let view = TensorView::owned("rope", TensorFormat::Plain(DType::BF16), vec![npos, hd], bytes);
    g.load_weight(&view).unwrap()
}
