//! The kernel contract on the CPU backend, and proof that the contract can fail.
//!
//! - `smollm2_contract_passes_with_every_control_red`: the whole contract (every op family,
//!   all gates, all planted controls) at the SmolLM2-135M geometry, as CI runs it;
//! - the negative tests wrap the CPU backend in [`Faulty`], which breaks one thing, and run
//!   the contract on a tiny geometry (same 2,048-row calls, narrow rows, so seconds): a
//!   `linear` that perturbs one row whenever a call has more than one row must fail gate 3 of
//!   every linear unit; a `linear` 1% off must fail gate 2 of every linear unit; a backend
//!   reporting a kernel that did not compile, one over its limits, and one no op drives must
//!   fail gates 1 and 4 of exactly the units those kernels serve; an argmax breaking ties
//!   high, and a sampler drawing with `1 - u`, must fail gate 2 of the `sample` unit.

use tf_backend::contract::{self, ContractConfig, Family, Geometry, Summary, SMOLLM2};
use tf_backend::cpu::{CpuBackend, CpuBatch, CpuKv, CpuTensor, CpuWeight};
use tf_backend::penalty::Penalties;
use tf_backend::sample::Draw;
use tf_backend::{
    ActDType, AttnArgs, Backend, BatchMeta, KernelInfo, KvGeometry, NormArgs, Result, RopeArgs,
};
use tf_checkpoint::TensorView;

/// Narrow enough to be fast, with GQA (4 heads over 2) and every op.
const TINY: Geometry = Geometry {
    name: "tiny",
    hidden: 64,
    heads: 4,
    kv_heads: 2,
    head_dim: 16,
    intermediate: 96,
    vocab: 300,
    rope_theta: 10_000.0,
    rms_eps: 1e-5,
};

fn run(be: &impl Backend, geometry: Geometry, only: Option<Family>) -> (Summary, Vec<String>) {
    let cfg =
        ContractConfig { geometries: vec![geometry], only, seed: 1, scratch: std::env::temp_dir() };
    let mut lines = Vec::new();
    let summary = contract::run(be, &cfg, &mut |l| {
        println!("{l}");
        lines.push(l.to_string())
    });
    (summary, lines)
}

/// Lines of `op` units at `gate` with verdict `word`.
fn count(lines: &[String], op: &str, gate: &str, word: &str) -> usize {
    lines
        .iter()
        .filter(|l| l.starts_with(&format!("{op:<9} ")) && l.contains(gate))
        .filter(|l| l.split_whitespace().any(|w| w == word))
        .count()
}

#[test]
fn smollm2_contract_passes_with_every_control_red() {
    let t0 = std::time::Instant::now();
    let be = CpuBackend::new().expect("cpu backend");
    let (s, lines) = run(&be, SMOLLM2, None);
    println!("smollm2 contract on {}: {:.1} s", be.name(), t0.elapsed().as_secs_f64());
    // 32 units, attention counting twice (kv_store and attention): 33 kernels, 66 controls.
    assert_eq!(
        s.line(),
        "SUMMARY 33 kernels: 33 pass gates 1-4, 0 fail; 66 controls: 66 red as planted, 0 missed"
    );
    assert!(s.ok());
    assert_eq!(lines.last(), Some(&s.line()));
    assert!(lines.iter().any(|l| l.contains("vacuous")), "the CPU's gates 1 and 4 say vacuous");
}

#[derive(Clone, Copy, Debug, PartialEq)]
enum Fault {
    /// `linear` flips a low bit of row 0 when the call has more than one row.
    RowDependent,
    /// `linear` returns its outputs times 1.01.
    OnePercentOff,
    /// `kernels()` reports entries: `norm` not compiled, `elementwise` over its limits, and
    /// `sampler`, which no op of the contract drives.
    BadKernels,
    /// `argmax` breaks ties to the HIGHEST id.
    ArgmaxTiesHigh,
    /// `sample` draws with `1 - u` instead of `u` (walks the survivors from the far end).
    SampleMirrored,
    /// `sample` drops the rows' penalties.
    PenaltiesDropped,
}

/// The CPU backend with one planted fault.
struct Faulty {
    inner: CpuBackend,
    fault: Fault,
}

impl Faulty {
    fn new(fault: Fault) -> Faulty {
        Faulty { inner: CpuBackend::new().expect("cpu backend"), fault }
    }

    /// Rewrites `out`'s valid rows through `f`, keeping its capacity.
    fn rewrite(out: &mut CpuTensor, f: impl Fn(&mut [f32])) -> Result<()> {
        let (rows, cols, max) = (out.rows(), out.cols(), out.max_rows());
        let mut all = out.to_f32(max);
        f(&mut all[..rows * cols]);
        *out = match out.dtype() {
            ActDType::Bf16 => CpuTensor::from_f32_as_bf16(max, cols, &all)?,
            ActDType::F32 => CpuTensor::from_f32(max, cols, all)?,
        };
        out.set_rows(rows)
    }
}

fn kernel(name: &str, family: &str) -> KernelInfo {
    KernelInfo {
        name: name.into(),
        family: family.into(),
        compiled: Ok(()),
        registers: 32,
        shared_bytes: 0,
        launch_threads: 128,
        max_threads: 1024,
        limits: Ok(()),
    }
}

impl Backend for Faulty {
    type Tensor = CpuTensor;
    type Weight = CpuWeight;
    type Kv = CpuKv;
    type Batch = CpuBatch;

    fn name(&self) -> String {
        format!("faulty {:?} over {}", self.fault, self.inner.name())
    }
    fn load_weight(&self, view: &TensorView) -> Result<CpuWeight> {
        self.inner.load_weight(view)
    }
    fn alloc(&self, dtype: ActDType, max_rows: usize, cols: usize) -> Result<CpuTensor> {
        self.inner.alloc(dtype, max_rows, cols)
    }
    fn alloc_kv(&self, geom: &KvGeometry) -> Result<CpuKv> {
        self.inner.alloc_kv(geom)
    }
    fn prepare_batch(&self, meta: &BatchMeta) -> Result<CpuBatch> {
        self.inner.prepare_batch(meta)
    }
    fn embed(&self, table: &CpuWeight, batch: &CpuBatch, out: &mut CpuTensor) -> Result<()> {
        self.inner.embed(table, batch, out)
    }
    fn rms_norm(&self, a: NormArgs<'_, Self>) -> Result<()> {
        let NormArgs { x, weight, eps, group, out } = a;
        self.inner.rms_norm(NormArgs { x, weight, eps, group, out })
    }
    fn linear(
        &self,
        x: &CpuTensor,
        w: &CpuWeight,
        bias: Option<&CpuWeight>,
        out: &mut CpuTensor,
    ) -> Result<()> {
        self.inner.linear(x, w, bias, out)?;
        match self.fault {
            Fault::RowDependent if out.rows() > 1 => {
                Self::rewrite(out, |v| v[0] = f32::from_bits(v[0].to_bits() ^ (1 << 16)))
            }
            Fault::OnePercentOff => Self::rewrite(out, |v| v.iter_mut().for_each(|x| *x *= 1.01)),
            _ => Ok(()),
        }
    }
    fn rope(&self, a: RopeArgs<'_, Self>) -> Result<()> {
        let RopeArgs { x, heads, head_dim, style, table, batch } = a;
        self.inner.rope(RopeArgs { x, heads, head_dim, style, table, batch })
    }
    fn kv_store(
        &self,
        kv: &mut CpuKv,
        layer: usize,
        k: &CpuTensor,
        v: &CpuTensor,
        batch: &CpuBatch,
    ) -> Result<()> {
        self.inner.kv_store(kv, layer, k, v, batch)
    }
    fn attention(&self, a: AttnArgs<'_, Self>) -> Result<()> {
        let AttnArgs { q, kv, layer, batch, heads, kv_heads, head_dim, scale, out } = a;
        let args = AttnArgs { q, kv, layer, batch, heads, kv_heads, head_dim, scale, out };
        self.inner.attention(args)
    }
    fn swiglu(&self, gate: &CpuTensor, up: &CpuTensor, out: &mut CpuTensor) -> Result<()> {
        self.inner.swiglu(gate, up, out)
    }
    fn add(&self, acc: &mut CpuTensor, x: &CpuTensor) -> Result<()> {
        self.inner.add(acc, x)
    }
    fn logits(
        &self,
        x: &CpuTensor,
        w: &CpuWeight,
        batch: &CpuBatch,
        out: &mut CpuTensor,
    ) -> Result<()> {
        self.inner.logits(x, w, batch, out)
    }
    fn read_f32(&self, t: &CpuTensor, rows: usize) -> Result<Vec<f32>> {
        self.inner.read_f32(t, rows)
    }
    fn read_kv(
        &self,
        kv: &CpuKv,
        layer: usize,
        block_table: &[u32],
        len: usize,
    ) -> Result<(Vec<f32>, Vec<f32>)> {
        self.inner.read_kv(kv, layer, block_table, len)
    }
    fn synchronize(&self) -> Result<()> {
        self.inner.synchronize()
    }
    fn sample(
        &self,
        t: &CpuTensor,
        rows: usize,
        draws: &[Draw],
        penalties: &[Penalties<'_>],
    ) -> Result<Vec<u32>> {
        match self.fault {
            Fault::SampleMirrored => {
                let below_one = 1.0 - 1.0 / (1u64 << 53) as f64;
                let mirrored: Vec<Draw> =
                    draws.iter().map(|d| Draw { uniform: below_one - d.uniform, ..*d }).collect();
                self.inner.sample(t, rows, &mirrored, penalties)
            }
            Fault::PenaltiesDropped => self.inner.sample(t, rows, draws, &[]),
            _ => self.inner.sample(t, rows, draws, penalties),
        }
    }
    fn argmax(&self, t: &CpuTensor, rows: usize) -> Result<Vec<u32>> {
        if self.fault != Fault::ArgmaxTiesHigh {
            return self.inner.argmax(t, rows);
        }
        let v = self.inner.read_f32(t, rows)?;
        let cols = v.len() / rows.max(1);
        let high = |r: &[f32]| {
            let mut best = 0;
            for (i, &x) in r.iter().enumerate() {
                if x >= r[best] {
                    best = i;
                }
            }
            best as u32
        };
        Ok(v.chunks_exact(cols.max(1)).map(high).collect())
    }
    fn kernels(&self) -> Result<Vec<KernelInfo>> {
        if self.fault != Fault::BadKernels {
            return self.inner.kernels();
        }
        let mut norm = kernel("rms_norm_bf16", "norm");
        norm.compiled = Err("norm.cu(12): error: identifier \"x\" is undefined".into());
        let mut add = kernel("add_bf16", "elementwise");
        add.limits = Err("launches 2048 threads, the kernel allows 1024".into());
        let mut all = vec![norm, add, kernel("argmax", "sampler")];
        all.extend(
            ["embed", "linear", "gemm", "gemm90", "rope", "kv", "attention", "sample"]
                .map(|f| kernel(f, f)),
        );
        Ok(all)
    }
}

#[test]
fn the_tiny_geometry_passes_on_the_plain_backend() {
    let (s, _) = run(&CpuBackend::new().expect("cpu backend"), TINY, None);
    assert!(s.ok(), "{}", s.line());
}

#[test]
fn a_row_dependent_linear_fails_gate_3() {
    let (s, lines) = run(&Faulty::new(Fault::RowDependent), TINY, Some(Family::Linear));
    // 5 shapes, 4 with a bias variant: each fails gate 3; every control is still red.
    assert_eq!(count(&lines, "linear", "gate 3", "FAIL"), 9, "{lines:#?}");
    assert_eq!((s.kernels, s.pass, s.fail, s.missed), (9, 0, 9, 0), "{}", s.line());
    assert!(!s.ok());
}

#[test]
fn a_linear_one_percent_off_fails_gate_2() {
    let (s, lines) = run(&Faulty::new(Fault::OnePercentOff), TINY, Some(Family::Linear));
    assert_eq!(count(&lines, "linear", "gate 2", "FAIL"), 9, "{lines:#?}");
    assert_eq!(count(&lines, "linear", "gate 3", "PASS"), 9, "{lines:#?}");
    assert_eq!((s.pass, s.fail), (0, 9), "{}", s.line());
    assert!(!s.ok());
}

#[test]
fn bad_kernels_fail_gates_1_and_4_of_the_units_they_serve() {
    let (s, lines) = run(&Faulty::new(Fault::BadKernels), TINY, None);
    let has = |src: &str, gate: &str, word: &str| {
        lines.iter().any(|l| {
            l.starts_with("kernels") && l.contains(src) && l.contains(gate) && l.contains(word)
        })
    };
    assert!(has("norm", "gate 1", "FAIL") && has("norm", "gate 4", "PASS"), "{lines:#?}");
    assert!(has("elementwise", "gate 4", "FAIL") && has("elementwise", "gate 1", "PASS"));
    assert!(has("sampler", "unclaimed", "FAIL") && has("linear", "gate 1", "PASS"));
    // 3 norm units, swiglu, add and the 10 fused units (they claim norm and elementwise)
    // fail; so does the unclaimed sampler. 33 + 1 kernels.
    assert_eq!((s.kernels, s.fail, s.missed), (34, 16, 0), "{}", s.line());
}

#[test]
fn the_fused_units_see_a_faulty_linear_through_the_default_composition() {
    // The CPU runs the trait's default fused ops, so a broken `linear` breaks q/k/v (with and
    // without bias), gate/up+swiglu, both norm-fused products and both q/k/v + rope + kv
    // units; add_rms_norm and rope+kv_store (two styles) have no product and pass.
    let (s, lines) = run(&Faulty::new(Fault::RowDependent), TINY, Some(Family::Fused));
    assert_eq!(count(&lines, "fused", "gate 3", "FAIL"), 7, "{lines:#?}");
    assert_eq!((s.kernels, s.pass, s.fail, s.missed), (10, 3, 7, 0), "{}", s.line());
    let (s, lines) = run(&Faulty::new(Fault::OnePercentOff), TINY, Some(Family::Fused));
    assert_eq!(count(&lines, "fused", "gate 2", "FAIL"), 7, "{lines:#?}");
    assert_eq!((s.pass, s.fail), (3, 7), "{}", s.line());
}

#[test]
fn an_argmax_breaking_ties_the_wrong_way_fails_gate_2() {
    let (s, lines) = run(&Faulty::new(Fault::ArgmaxTiesHigh), TINY, Some(Family::Sample));
    assert_eq!(count(&lines, "sample", "gate 2", "FAIL"), 1, "{lines:#?}");
    assert_eq!(count(&lines, "sample", "gate 3", "PASS"), 1, "{lines:#?}");
    assert_eq!((s.kernels, s.pass, s.fail, s.missed), (1, 0, 1, 0), "{}", s.line());
    // The plain backend passes the same unit.
    let (ok, _) = run(&CpuBackend::new().expect("cpu backend"), TINY, Some(Family::Sample));
    assert!(ok.ok(), "{}", ok.line());
}

#[test]
fn a_sampler_dropping_penalties_fails_gate_2() {
    let (s, lines) = run(&Faulty::new(Fault::PenaltiesDropped), TINY, Some(Family::Sample));
    assert_eq!(count(&lines, "sample", "gate 2", "FAIL"), 1, "{lines:#?}");
    assert_eq!(count(&lines, "sample", "gate 3", "PASS"), 1, "{lines:#?}");
    assert_eq!((s.kernels, s.pass, s.fail, s.missed), (1, 0, 1, 0), "{}", s.line());
}

#[test]
fn a_sampler_drawing_with_one_minus_u_fails_gate_2() {
    let (s, lines) = run(&Faulty::new(Fault::SampleMirrored), TINY, Some(Family::Sample));
    assert_eq!(count(&lines, "sample", "gate 2", "FAIL"), 1, "{lines:#?}");
    assert_eq!(count(&lines, "sample", "gate 3", "PASS"), 1, "{lines:#?}");
    assert_eq!((s.kernels, s.pass, s.fail, s.missed), (1, 0, 1, 0), "{}", s.line());
}
