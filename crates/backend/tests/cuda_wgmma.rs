//! Hopper's warpgroup tensor-core instruction (wgmma, sm_90a) against linear_bf16's mma.sync
//! chain: first the probe that decides whether a wgmma kernel can give linear_bf16's bits at
//! all (`cuda_wgmma_probe.cu`: the same values through both instructions, every accumulator
//! bit compared), then `linear_bf16_wg` (kernels/gemm90.cu) against `linear_bf16`, bit for
//! bit, and its speed beside `linear_bf16_tiled`.
//!
//! The probe compiles its own source with NVRTC and launches it through cudarc directly (it is
//! an experiment, not a backend op). Its control (mode 2: other k16 sets) must differ, or the
//! data cannot tell the instructions apart and the test fails.
//!
//! GPU tests are ignored elsewhere; on the GPU machine:
//! `cargo test --release -p tf-backend --test cuda_wgmma -- --ignored --nocapture`.

mod common;

use common::cuda::{
    bits, compiles_for_sm80_and_sm90a, gpu, nvrtc_dirs, per_call, up, GEMM_CASE_SHAPES,
};
use common::{random_bf16, random_vector, random_weight, Rng};
use cudarc::driver::{CudaContext, CudaSlice, CudaStream, LaunchConfig, PushKernelArg};
use cudarc::nvrtc::Ptx;
use tf_backend::cuda::{compile, loader, CudaBackend, CudaWeight};
use tf_backend::{ActDType, Backend};
use tf_checkpoint::{DType, TensorFormat, TensorView};

/// gemm90.cu's helpers, then the probe kernels.
const PROBE: compile::Unit = compile::Unit {
    name: "wgmma_probe",
    family: "wgmma_probe",
    source: concat!(
        include_str!("../kernels/gemm90.cu"),
        "\n",
        include_str!("cuda_wgmma_probe.cu")
    ),
    part: "",
    entries: &[],
};

/// Reduction length of the probe: 64 tiles of 64 k, 256 chained k16 steps.
const PK: usize = 4096;
/// Tokens of the probe's reference product (the widest wgmma; narrower ones use a prefix).
const PN: usize = 256;
const PROBE_NS: [usize; 4] = [8, 64, 128, 256];
const MODES: [&str; 4] =
    ["linear_bf16 sets, natural", "same sets, p^5 order", "other sets", "reversed in set"];

/// The probe compiles for every architecture (its wgmma part only on sm_90a); CPU only.
#[test]
fn probe_compiles() {
    compiles_for_sm80_and_sm90a(&PROBE);
}

fn bf16_bits(v: f64) -> u16 {
    half::bf16::from_f64(v).to_bits()
}

/// One probe input: weights (64 x PK), tokens (PN x PK) as bf16 bits, starting values (64 x PN).
struct Case {
    name: &'static str,
    a: Vec<u16>,
    b: Vec<u16>,
    c0: Vec<f32>,
}

/// A normal value times 2^e, e uniform in [lo, hi].
fn spread(rng: &mut Rng, lo: i32, hi: i32) -> f64 {
    let e = lo + rng.below((hi - lo + 1) as usize) as i32;
    rng.normal() * 2f64.powi(e)
}

fn cases() -> Vec<Case> {
    let mut rng = Rng::new(90);
    let mut out = Vec::new();
    let make =
        |name, rng: &mut Rng, f: &mut dyn FnMut(&mut Rng, usize) -> f64, c0: (i32, i32, bool)| {
            let a: Vec<u16> = (0..64 * PK).map(|i| bf16_bits(f(rng, i))).collect();
            let b: Vec<u16> = (0..PN * PK).map(|i| bf16_bits(f(rng, i))).collect();
            let c: Vec<f32> = (0..64 * PN)
                .map(|_| if c0.2 { spread(rng, c0.0, c0.1) as f32 } else { 0.0 })
                .collect();
            Case { name, a, b, c0: c }
        };
    // Small integers: every sum exact, so every mode must agree (checks the plumbing).
    out.push(make("integers", &mut rng, &mut |r, _| r.below(9) as f64 - 4.0, (0, 0, false)));
    out.push(make("spread, from +0", &mut rng, &mut |r, _| spread(r, -8, 8), (0, 0, false)));
    out.push(make(
        "spread, non-zero start",
        &mut rng,
        &mut |r, _| spread(r, -8, 8),
        (-10, 30, true),
    ));
    out.push(make("wide exponents", &mut rng, &mut |r, _| spread(r, -40, 40), (-60, 60, true)));
    out.push(make(
        "tiny (subnormal products)",
        &mut rng,
        &mut |r, _| spread(r, -70, -58),
        (-130, -120, true),
    ));
    // Cancellation: large values whose products cancel inside and across k16 sets, small ones
    // left over.
    let mut c = make("cancelling", &mut rng, &mut |r, _| spread(r, -12, 0), (-4, 4, true));
    // k16 sets are 16 consecutive k: k and k + 1 share one, k + 16 is in the other of the
    // super-step.
    let planted = || (0..PK).step_by(32).flat_map(|k| [k, k + 8]);
    for row in 0..64 {
        for k in planted() {
            let big = bf16_bits(spread(&mut rng, 10, 16));
            c.a[row * PK + k] = big;
            c.a[row * PK + k + 1] = big ^ 0x8000; // -big at a pair partner (same k16 set)
            c.a[row * PK + k + 16] = big; // and in the other set of the super-step
        }
    }
    for t in 0..PN {
        for k in planted() {
            let v = c.b[t * PK + k];
            c.b[t * PK + k + 1] = v;
            c.b[t * PK + k + 16] = v ^ 0x8000;
        }
    }
    out.push(c);
    out
}

struct Probe {
    stream: std::sync::Arc<CudaStream>,
    module: std::sync::Arc<cudarc::driver::CudaModule>,
}

impl Probe {
    fn new() -> Probe {
        loader::driver().unwrap_or_else(|e| panic!("{e}"));
        loader::nvrtc(&nvrtc_dirs()).unwrap_or_else(|e| panic!("{e}"));
        let ctx = CudaContext::new(0).expect("GPU 0");
        let cc = ctx.compute_capability().expect("compute capability");
        assert_eq!(cc, (9, 0), "the probe needs a Hopper GPU (sm_90a)");
        let cubin = compile::compile(&PROBE, "sm_90a").unwrap_or_else(|log| panic!("{log}"));
        let module = ctx.load_module(Ptx::from_binary(cubin)).expect("load probe");
        Probe { stream: ctx.default_stream(), module }
    }

    /// D (64 x PN) of `probe_mma`.
    fn mma(&self, a: &CudaSlice<u16>, b: &CudaSlice<u16>, c0: &CudaSlice<f32>) -> Vec<f32> {
        let f = self.module.load_function("probe_mma").unwrap();
        let mut d = self.stream.alloc_zeros::<f32>(64 * PN).unwrap();
        let (k, nb) = (PK as u32, PN as u32);
        let cfg =
            LaunchConfig { grid_dim: (nb / 8, 4, 1), block_dim: (32, 1, 1), shared_mem_bytes: 0 };
        let mut l = self.stream.launch_builder(&f);
        l.arg(a).arg(b).arg(c0).arg(&mut d).arg(&k).arg(&nb);
        // SAFETY: the argument list matches probe_mma's signature; buffers hold 64 x PK,
        // PN x PK, 64 x PN and 64 x PN elements, the kernel reads and writes within them.
        unsafe { l.launch(cfg) }.expect("probe_mma");
        self.stream.clone_dtoh(&d).unwrap()
    }

    /// D (64 x PN, first n columns written) of `probe_wg_n{n}` in `mode`.
    fn wg(
        &self,
        n: usize,
        mode: i32,
        a: &CudaSlice<u16>,
        b: &CudaSlice<u16>,
        c0: &CudaSlice<f32>,
    ) -> Vec<f32> {
        let f = self.module.load_function(&format!("probe_wg_n{n}")).unwrap();
        let smem = ((64 + n) * 128 + 1024) as u32;
        let attr = cudarc::driver::sys::CUfunction_attribute::CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES;
        f.set_attribute(attr, smem as i32).unwrap();
        let mut d = self.stream.alloc_zeros::<f32>(64 * PN).unwrap();
        let (k, nb) = (PK as u32, PN as u32);
        let cfg =
            LaunchConfig { grid_dim: (1, 1, 1), block_dim: (128, 1, 1), shared_mem_bytes: smem };
        let mut l = self.stream.launch_builder(&f);
        l.arg(a).arg(b).arg(c0).arg(&mut d).arg(&k).arg(&nb).arg(&mode);
        // SAFETY: as `mma`; the kernel reads tokens 0..n and writes columns 0..n.
        unsafe { l.launch(cfg) }.expect("probe_wg");
        self.stream.clone_dtoh(&d).unwrap()
    }
}

/// Elements of the first n columns whose bits differ, and up to 3 examples.
fn compare(want: &[f32], got: &[f32], n: usize) -> (usize, Vec<String>) {
    let mut count = 0;
    let mut ex = Vec::new();
    for r in 0..64 {
        for c in 0..n {
            let (x, y) = (want[r * PN + c], got[r * PN + c]);
            if x.to_bits() != y.to_bits() {
                count += 1;
                if ex.len() < 3 {
                    ex.push(format!(
                        "[{r}][{c}] mma {x:e} ({:08x}) wgmma {y:e} ({:08x})",
                        x.to_bits(),
                        y.to_bits()
                    ));
                }
            }
        }
    }
    (count, ex)
}

/// STEP 1: a wgmma m64nNk16 chain gives the accumulator bits of linear_bf16's mma.sync chain
/// when each k16 step holds the same 16 k, read from a natural tile (mode 0), for N
/// 8/64/128/256, from +0 and from non-zero starts, over 256 chained steps. Modes 1 and 3 say
/// whether the order inside a step matters (printed only); mode 2 (other sets) must differ.
#[test]
#[ignore = "needs an NVIDIA Hopper GPU: run with --ignored on the GPU machine"]
fn wgmma_step_equals_mma_sync_steps_bitwise() {
    let p = Probe::new();
    let mut bad = Vec::new();
    let mut control_differs = false;
    for case in cases() {
        let s = &p.stream;
        let (a, b, c0) = (
            s.clone_htod(&case.a).unwrap(),
            s.clone_htod(&case.b).unwrap(),
            s.clone_htod(&case.c0).unwrap(),
        );
        let want = p.mma(&a, &b, &c0);
        assert!(want.iter().any(|v| *v != 0.0), "{}: the reference is all zeros", case.name);
        for n in PROBE_NS {
            let mut line = format!("probe {:<26} n{n:<3}:", case.name);
            for (mode, what) in MODES.iter().enumerate() {
                let got = p.wg(n, mode as i32, &a, &b, &c0);
                let (count, ex) = compare(&want, &got, n);
                line += &format!(" [{what}] {count}/{}", 64 * n);
                if mode == 0 && count > 0 {
                    bad.push(format!("{} n{n}: {count} differ: {}", case.name, ex.join("; ")));
                }
                if mode == 2 && count > 0 {
                    control_differs = true;
                }
                if count > 0 && n == 256 {
                    println!("  e.g. {} mode {mode}: {}", case.name, ex.join("; "));
                }
            }
            println!("{line}");
        }
    }
    assert!(control_differs, "the control (other k16 sets) never differed: the data cannot tell");
    assert!(bad.is_empty(), "wgmma differs from mma.sync:\n{}", bad.join("\n"));
}

/// The wgmma entry points (gemm90.cu's `WG_ENTRY`s and gemm90ws.cu's `linear_bf16_ws`, both
/// operands by tensor copies): each must give `linear_bf16`'s bits.
const WG: [&str; 3] = ["linear_bf16_wg", "linear_bf16_wg_m192", "linear_bf16_ws"];

/// The entry points a run covers: `TF_WG_KERNELS` (comma-separated) or all of `WG`.
fn wg_kernels() -> Vec<String> {
    match std::env::var("TF_WG_KERNELS") {
        Ok(v) if !v.is_empty() => v.split(',').map(str::to_string).collect(),
        _ => WG.iter().map(|s| s.to_string()).collect(),
    }
}

/// A bf16 `(n, k)` weight with rows 0..4 made positive (so an input row of -0.0 gives -0.0
/// partials and the empty-slice combine shows), on the device.
fn wg_case_weight(g: &CudaBackend, rng: &mut Rng, n: usize, k: usize) -> CudaWeight {
    let wv = random_weight(rng, TensorFormat::Plain(DType::BF16), n, k, 0.05);
    let mut bytes = wv.bytes().to_vec();
    for b in bytes[..4.min(n) * k * 2].chunks_exact_mut(2) {
        b[1] &= 0x7f;
    }
    let wv = TensorView::owned("wg.weight", TensorFormat::Plain(DType::BF16), vec![n, k], bytes);
    g.load_weight(&wv).unwrap()
}

/// `linear_bf16_wg*` against `linear_bf16`, bit for bit, forced onto each kernel, on every
/// llama3-8b and SmolLM2-135M product shape plus odd ones (K not a multiple of the 64-k tile:
/// 72, 1000, 4104; a slice end inside a tile: 1024 x 4104 has 16 slices of 288, the last
/// empty), 1 / 17 / 128 / 333 / 2,048 rows, bf16 and f32 outputs, bias, input rows of -0.0 and
/// +0.0.
#[test]
#[ignore = "needs an NVIDIA Hopper GPU: run with --ignored on the GPU machine"]
fn wg_linear_equals_streaming_linear_bitwise() {
    let g = gpu();
    assert_eq!(g.arch(), "sm_90a", "linear_bf16_wg needs a Hopper GPU");
    let mut rng = Rng::new(91);
    let shapes = GEMM_CASE_SHAPES;
    let mut failed = Vec::new();
    let mut compared = 0usize;
    for (n, k, with_bias) in shapes {
        let w = wg_case_weight(&g, &mut rng, n, k);
        let b = g.load_weight(&random_vector(&mut rng, n, 0.0, 0.5)).unwrap();
        let bias = with_bias.then_some(&b);
        let max_rows = 2048;
        let (mut xb, _) = random_bf16(&mut rng, max_rows * k, 1.0);
        xb[3 * k..6 * k].fill(0x8000);
        xb[6 * k..8 * k].fill(0);
        for rows in [1usize, 17, 128, 333, max_rows] {
            let x = up(&g, rows, k, &xb[..rows * k]);
            for dt in [ActDType::Bf16, ActDType::F32] {
                let mut o = g.alloc(dt, rows, n).unwrap();
                g.linear_with_kernel("linear_bf16", &x, &w, bias, &mut o).unwrap();
                let a = bits(&g.read_f32(&o, rows).unwrap());
                for name in &wg_kernels() {
                    let mut o = g.alloc(dt, rows, n).unwrap();
                    g.linear_with_kernel(name, &x, &w, bias, &mut o).unwrap();
                    let t = bits(&g.read_f32(&o, rows).unwrap());
                    let differ = a.iter().zip(&t).filter(|(p, q)| p != q).count();
                    compared += a.len();
                    if differ > 0 {
                        failed.push(format!("{name} {n}x{k} rows {rows} {dt:?}: {differ} differ"));
                    }
                }
            }
        }
        println!("wg == streaming {n}x{k} bias={with_bias} rows 1/17/128/333/{max_rows}");
    }
    println!("{compared} elements compared, {} failing calls", failed.len());
    assert!(failed.is_empty(), "wgmma kernel differs:\n{}", failed.join("\n"));
}

/// TFLOP/s of the wgmma kernels beside `linear_bf16_tiled` (and `_r`) on the llama3-8b shapes
/// at 2,048 and 8,192 rows, same run; prints only.
#[test]
#[ignore = "needs an NVIDIA Hopper GPU: run with --ignored on the GPU machine"]
fn wg_linear_speed() {
    let g = gpu();
    let mut rng = Rng::new(92);
    let rows_all = [2048usize, 8192];
    let (xb, _) = random_bf16(&mut rng, 8192 * 14336, 1.0);
    for (n, k) in [(4096, 4096), (1024, 4096), (6144, 4096), (14336, 4096), (4096, 14336)] {
        let w = wg_case_weight(&g, &mut rng, n, k);
        let xs: Vec<_> = rows_all.iter().map(|&r| up(&g, r, k, &xb[..r * k])).collect();
        let tiled = ["linear_bf16_tiled", "linear_bf16_tiled_r"].map(str::to_string);
        for name in tiled.iter().chain(&wg_kernels()) {
            let mut line = format!("{n}x{k} {name:<22}:");
            for (&rows, x) in rows_all.iter().zip(&xs) {
                let mut out = g.alloc(ActDType::Bf16, rows, n).unwrap();
                let dt = per_call(&g, 20, || {
                    g.linear_with_kernel(name, x, &w, None, &mut out).unwrap();
                });
                let tf = 2.0 * (n * k * rows) as f64 / dt / 1e12;
                line += &format!(" r{rows}: {tf:.0}");
            }
            println!("wg TFLOP/s {line}");
        }
    }
}
