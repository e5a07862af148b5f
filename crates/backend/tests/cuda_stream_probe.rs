//! A decision probe for issue 6's prefill target (plan in `docs/bench/2026-12-01-h200.md`,
//! "Dropped"): can decode keep streaming weights at full speed if every mma step holds 16
//! consecutive k? Then the consecutive-k wgmma prefill kernel could serve. `cuda_stream_probe.cu`
//! streams one token tile's product both ways: `stream_frag` (today's fragment-order k sets,
//! a lane's 16 bytes feed two mma steps) and `stream_nat` (natural steps; each warp turns its
//! 16-byte loads into A fragments through its own shared memory and `ldmatrix.x4`).
//!
//! Each kernel's product is checked against float64 on sampled rows (a layout slip fails it);
//! the speeds are printed, not asserted. The source compiles on the CPU machine in CI
//! (`probe_compiles`); on the GPU machine:
//! `cargo test --release -p tf-backend --test cuda_stream_probe -- --ignored --nocapture`.

mod common;

use std::time::Instant;

use common::cuda::{compiles_for_sm80_and_sm90a, nvrtc_dirs};
use common::{random_bf16, Rng};
use cudarc::driver::{CudaContext, CudaSlice, CudaStream, LaunchConfig, PushKernelArg};
use cudarc::nvrtc::Ptx;
use tf_backend::cuda::{compile, loader};

const PROBE: compile::Family =
    compile::Family { name: "stream_probe", source: include_str!("cuda_stream_probe.cu") };

/// (features, k, K slices): gate and up together, down, o, q/k/v together (llama3-8b); k /
/// slices is a multiple of 256 (the kernels walk two buffers of 128 k at a time).
const SHAPES: [(usize, usize, usize); 4] =
    [(28_672, 4_096, 4), (4_096, 14_336, 8), (4_096, 4_096, 4), (6_144, 4_096, 4)];

/// The probe compiles (CPU only; NVRTC from the pip wheel).
#[test]
fn probe_compiles() {
    compiles_for_sm80_and_sm90a(&PROBE);
}

/// One kernel's run: y partials [slices][n][8] summed over slices, seconds a call.
fn run(
    stream: &std::sync::Arc<CudaStream>,
    f: &cudarc::driver::CudaFunction,
    (w, x): (&CudaSlice<u16>, &CudaSlice<u16>),
    (n, k, slices): (usize, usize, usize),
) -> (Vec<f64>, f64) {
    let mut y = stream.alloc_zeros::<f32>(slices * n * 8).unwrap();
    let cfg = LaunchConfig {
        grid_dim: ((n / 64) as u32, slices as u32, 1),
        block_dim: (128, 1, 1),
        shared_mem_bytes: 0,
    };
    let (nu, ku, su) = (n as u32, k as u32, slices as u32);
    let mut launch = || {
        let mut l = stream.launch_builder(f);
        l.arg(w).arg(x).arg(&mut y).arg(&nu).arg(&ku).arg(&su);
        // SAFETY: the arguments match the kernels' signature (w n x k, x 8 x k, y slices x n
        // x 8 elements); n is a multiple of 64 and k / slices of 256, so every access is inside.
        unsafe { l.launch(cfg) }.expect("probe launch");
    };
    launch();
    stream.synchronize().unwrap();
    let reps = 20;
    let t = Instant::now();
    for _ in 0..reps {
        launch();
    }
    stream.synchronize().unwrap();
    let secs = t.elapsed().as_secs_f64() / reps as f64;
    let parts = stream.clone_dtoh(&y).unwrap();
    let mut sum = vec![0f64; n * 8];
    for s in 0..slices {
        for (o, p) in sum.iter_mut().zip(&parts[s * n * 8..(s + 1) * n * 8]) {
            *o += *p as f64;
        }
    }
    (sum, secs)
}

/// Streaming rate of both step definitions on the llama3-8b decode shapes, each product
/// checked against float64 on every 61st row (|err| <= 2^-20 of sum |w x| per element).
#[test]
#[ignore = "needs an NVIDIA GPU: run with --ignored on the GPU machine"]
fn natural_steps_stream_as_fast_as_fragment_order() {
    loader::driver().unwrap_or_else(|e| panic!("{e}"));
    loader::nvrtc(&nvrtc_dirs()).unwrap_or_else(|e| panic!("{e}"));
    let ctx = CudaContext::new(0).expect("GPU 0");
    let cc = ctx.compute_capability().expect("compute capability");
    let arch = compile::arch_for(cc);
    let cubin = compile::compile(&PROBE, &arch).unwrap_or_else(|log| panic!("{log}"));
    let module = ctx.load_module(Ptx::from_binary(cubin)).expect("load probe");
    let stream = ctx.default_stream();
    let mut rng = Rng::new(21);
    for (n, k, slices) in SHAPES {
        let (wb, wv) = random_bf16(&mut rng, n * k, 0.05);
        let (xb, xv) = random_bf16(&mut rng, 8 * k, 1.0);
        let (w, x) = (stream.clone_htod(&wb).unwrap(), stream.clone_htod(&xb).unwrap());
        let mut rates = Vec::new();
        for name in ["stream_frag", "stream_nat"] {
            let f = module.load_function(name).unwrap();
            let (y, secs) = run(&stream, &f, (&w, &x), (n, k, slices));
            let mut worst = 0f64;
            for r in (0..n).step_by(61) {
                for t in 0..8 {
                    let (mut exact, mut mag) = (0f64, 0f64);
                    for i in 0..k {
                        let p = wv[r * k + i] as f64 * xv[t * k + i] as f64;
                        exact += p;
                        mag += p.abs();
                    }
                    worst = worst.max((y[r * 8 + t] - exact).abs() / mag.max(f64::MIN_POSITIVE));
                }
            }
            let gbs = (n * k * 2) as f64 / secs / 1e9;
            println!(
                "{name} ({n} x {k}, {slices} slices): {:.1} us, {gbs:.0} GB/s; worst error {worst:.2e} of sum |w x|",
                secs * 1e6
            );
            assert!(worst <= 2f64.powi(-20), "{name}: error {worst:e} (a layout slip?)");
            rates.push(gbs);
        }
        println!("  natural / fragment order: {:.3}", rates[1] / rates[0]);
    }
}
