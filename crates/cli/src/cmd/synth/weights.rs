//! The weights of a synthetic checkpoint: which tensors, how each element is drawn, and how
//! they are laid out in safetensors shards and written.
//!
//! Draw: element `i` of tensor `t` is a pure function of `(seed, t's name, i)`: a splitmix64
//! hash of the tensor's key and the element index gives 64 bits, whose four 16-bit lanes are
//! summed (Irwin-Hall, n = 4) into an approximately normal `z` (unit variance, bounded at
//! +-3.46); the value is `mean + std * row_factor * z`, rounded once to bf16 (RNE). The bytes
//! therefore depend on neither the thread count nor the chunking, and a layer's tensors are the
//! same whatever `--layers` says.
//!
//! Scales (so that a forward pass through 52 layers stays finite and its logits informative):
//! RMSNorm weights `1 + 0.05 z`; q/k/v/gate/up `z / sqrt(hidden)` (their outputs have unit
//! RMS after a norm); embedding rows `LOGIT_RMS / sqrt(hidden)`; o_proj and down_proj scaled so
//! each sublayer adds about `ALPHA` times the embedding RMS to the residual. An untied LM head
//! has rows of the embedding's scale times a log-normal factor `exp(TAU z_row - TAU^2)` (mean
//! square 1), so logits have RMS ~`LOGIT_RMS`: plain Gaussian logits over a 50k-170k
//! vocabulary put the top two within one bf16 step at ~12% of positions, the row factors (some
//! tokens "frequent", as in a trained model) bring that to ~5%. A tied head cannot have them:
//! a frequent token's large embedding row would then predict itself, and greedy decoding
//! repeats it forever. `ALPHA` = 2 is large for the same reason: with tied embeddings, logit
//! `t` holds the input token's own share of the final residual times `sqrt(hidden)`, so that
//! share must be small (at `ALPHA` = 0.2 SmolLM2's geometry predicted its input token at 44%
//! of positions, at 2 at 2%). Measured with transformers on these recipes (30 and 52 layers):
//! logits finite, RMS 2.5, max 12-47; bf16 vs float32 top-1 agreement 88-97% and RMS logit
//! difference 3-5% of the logit RMS, like the real SmolLM2 on text (95%, 2.4%); the last
//! logits row changes with the earlier context and with the last token (correlation < 0.4).
//!
//! Writing: every shard file is sized up front, its header written, then the data is filled by
//! rayon tasks of at most `CHUNK_ELEMS` elements, each drawn into a thread-local buffer and
//! written with one positioned write (`pwrite`), so memory stays at one buffer per thread
//! whatever the model size. Files are written as `NAME.part` and renamed when complete.
//! Rejected: `tf_checkpoint::write` (it takes every tensor's bytes in memory: 62 GiB for the
//! 33B geometry) and a writable mmap (same speed here, but needs `unsafe` and turns a full disk
//! into SIGBUS instead of an error).

use std::fs::File;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use anyhow::{Context, Result};
use half::bf16;
use rayon::prelude::*;
use serde_json::{json, Map, Value as Json};

use super::Geometry;

/// Each sublayer's output RMS, as a multiple of the embedding RMS.
const ALPHA: f32 = 2.0;
/// RMS of the logits (and scale of the embedding rows) with a unit-RMS final hidden state.
const LOGIT_RMS: f32 = 2.5;
/// Spread of the log-normal row factor of an untied LM head.
const TAU: f32 = 0.5;
/// Spread of RMSNorm weights around 1.
const NORM_STD: f32 = 0.05;
/// RMS of `silu(g) * u` for independent unit normals g, u: sqrt(E[silu(g)^2]) ~ 0.6.
const SWIGLU_RMS: f32 = 0.6;
/// Elements per write task (4 MiB of bf16).
const CHUNK_ELEMS: usize = 1 << 21;
/// Shard size limit: transformers' `max_shard_size="5GB"` (decimal).
pub const MAX_SHARD_BYTES: u64 = 5_000_000_000;

/// How a tensor's elements are drawn: `mean + std * row_factor * z`.
#[derive(Clone, Copy, Debug)]
pub struct Dist {
    pub mean: f32,
    pub std: f32,
    /// Spread of the per-row log-normal factor; 0 for none.
    pub row_tau: f32,
}

/// One tensor of the checkpoint.
#[derive(Clone, Debug)]
pub struct TensorPlan {
    pub name: String,
    /// HF order: (out_features, in_features) for a matrix, (hidden,) for a norm.
    pub shape: Vec<usize>,
    pub dist: Dist,
}

impl TensorPlan {
    pub fn numel(&self) -> u64 {
        self.shape.iter().map(|&d| d as u64).product()
    }

    pub fn bytes(&self) -> u64 {
        self.numel() * 2
    }
}

/// Every tensor of a llama checkpoint of geometry `g`, in HF module order.
pub fn plan_tensors(g: &Geometry) -> Vec<TensorPlan> {
    let (h, q, kv, i) = (g.hidden, g.heads * g.head_dim, g.kv_heads * g.head_dim, g.intermediate);
    let rsq = |n: usize| 1.0 / (n as f32).sqrt();
    let emb_std = LOGIT_RMS * rsq(h);
    let plain = |std: f32| Dist { mean: 0.0, std, row_tau: 0.0 };
    let norm = Dist { mean: 1.0, std: NORM_STD, row_tau: 0.0 };
    let head = Dist { mean: 0.0, std: emb_std, row_tau: TAU };
    let t = |name: String, shape: Vec<usize>, dist: Dist| TensorPlan { name, shape, dist };
    let mut out = vec![t("model.embed_tokens.weight".into(), vec![g.vocab, h], plain(emb_std))];
    for l in 0..g.layers {
        let p = format!("model.layers.{l}");
        out.extend([
            t(format!("{p}.self_attn.q_proj.weight"), vec![q, h], plain(rsq(h))),
            t(format!("{p}.self_attn.k_proj.weight"), vec![kv, h], plain(rsq(h))),
            t(format!("{p}.self_attn.v_proj.weight"), vec![kv, h], plain(rsq(h))),
            t(format!("{p}.self_attn.o_proj.weight"), vec![h, q], plain(ALPHA * emb_std * rsq(q))),
            t(format!("{p}.mlp.gate_proj.weight"), vec![i, h], plain(rsq(h))),
            t(format!("{p}.mlp.up_proj.weight"), vec![i, h], plain(rsq(h))),
            t(
                format!("{p}.mlp.down_proj.weight"),
                vec![h, i],
                plain(ALPHA * emb_std * rsq(i) / SWIGLU_RMS),
            ),
            t(format!("{p}.input_layernorm.weight"), vec![h], norm),
            t(format!("{p}.post_attention_layernorm.weight"), vec![h], norm),
        ]);
    }
    out.push(t("model.norm.weight".into(), vec![h], norm));
    if !g.tied {
        out.push(t("lm_head.weight".into(), vec![g.vocab, h], head));
    }
    out
}

/// splitmix64's output function (Steele, Lea, Flood, "Fast splittable pseudorandom number
/// generators", OOPSLA 2014): a bijective 64-bit mixer.
fn mix64(mut z: u64) -> u64 {
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

const GOLDEN: u64 = 0x9e37_79b9_7f4a_7c15;

/// Element `i` of the stream `key`: approximately N(0, 1), in [-3.47, 3.47].
fn unit_normal(key: u64, i: u64) -> f32 {
    let h = mix64(key.wrapping_add(i.wrapping_add(1).wrapping_mul(GOLDEN)));
    let s = (h & 0xffff) + ((h >> 16) & 0xffff) + ((h >> 32) & 0xffff) + (h >> 48);
    // Sum of 4 uniform u16: mean 4 * 65535/2, variance 4 * (65536^2 - 1) / 12.
    const MEAN: f64 = 2.0 * 65535.0;
    const SD: f64 = 37_837.2;
    ((s as f64 - MEAN) / SD) as f32
}

/// The key of a tensor's stream: FNV-1a of its name, mixed with the seed.
fn tensor_key(seed: u64, name: &str) -> u64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for b in name.bytes() {
        h = (h ^ b as u64).wrapping_mul(0x0000_0100_0000_01b3);
    }
    mix64(mix64(seed) ^ h)
}

/// Draws elements `start..start + out.len()/2` of tensor `t` into `out` as bf16 LE bytes.
fn fill(t: &TensorPlan, key: u64, start: u64, out: &mut [u8]) {
    let cols = *t.shape.last().unwrap_or(&1) as u64; // shapes are never empty (plan_tensors)
    let row_key = mix64(key ^ 0x726f_775f_6661_6374); // "row_fact"
    let d = t.dist;
    let mut row = u64::MAX;
    let mut scale = d.std;
    for (j, pair) in out.chunks_exact_mut(2).enumerate() {
        let i = start + j as u64;
        if d.row_tau != 0.0 && i / cols != row {
            row = i / cols;
            let z = unit_normal(row_key, row);
            scale = d.std * (d.row_tau * z - d.row_tau * d.row_tau).exp();
        }
        let v = d.mean + scale * unit_normal(key, i);
        pair.copy_from_slice(&bf16::from_f32(v).to_le_bytes());
    }
}

/// One output file: its tensors (indices into the plan) and where each one's data starts
/// relative to the data section.
pub struct Shard {
    pub file_name: String,
    pub tensors: Vec<(usize, u64)>,
    pub header: Vec<u8>,
    pub data_bytes: u64,
}

impl Shard {
    fn file_bytes(&self) -> u64 {
        8 + self.header.len() as u64 + self.data_bytes
    }
}

/// Packs the tensors in order into shards of at most `max_bytes` of data (a larger tensor
/// gets a shard of its own) and builds each header. One shard is `model.safetensors`; more are
/// `model-0000i-of-0000n.safetensors`, as transformers names them.
pub fn plan_shards(tensors: &[TensorPlan], max_bytes: u64) -> Vec<Shard> {
    let mut groups: Vec<Vec<(usize, u64)>> = vec![Vec::new()];
    let mut used = 0u64;
    for (ti, t) in tensors.iter().enumerate() {
        let last_nonempty = groups.last().is_some_and(|g| !g.is_empty());
        if last_nonempty && used + t.bytes() > max_bytes {
            groups.push(Vec::new());
            used = 0;
        }
        if let Some(g) = groups.last_mut() {
            g.push((ti, used));
        }
        used += t.bytes();
    }
    let n = groups.len();
    groups
        .into_iter()
        .enumerate()
        .map(|(k, entries)| {
            let file_name = if n == 1 {
                "model.safetensors".to_string()
            } else {
                format!("model-{:05}-of-{n:05}.safetensors", k + 1)
            };
            let data_bytes = entries.iter().map(|&(ti, _)| tensors[ti].bytes()).sum();
            let header = header_bytes(tensors, &entries);
            Shard { file_name, tensors: entries, header, data_bytes }
        })
        .collect()
}

/// The JSON header of one shard, padded with spaces to a multiple of 8 bytes.
fn header_bytes(tensors: &[TensorPlan], entries: &[(usize, u64)]) -> Vec<u8> {
    let mut map = Map::new();
    map.insert("__metadata__".into(), json!({"format": "pt"}));
    for &(ti, off) in entries {
        let t = &tensors[ti];
        map.insert(
            t.name.clone(),
            json!({"dtype": "BF16", "shape": t.shape, "data_offsets": [off, off + t.bytes()]}),
        );
    }
    let mut bytes = Json::Object(map).to_string().into_bytes();
    while !bytes.len().is_multiple_of(8) {
        bytes.push(b' ');
    }
    bytes
}

/// `model.safetensors.index.json` for more than one shard.
pub fn index_json(tensors: &[TensorPlan], shards: &[Shard]) -> Json {
    let mut map = Map::new();
    for s in shards {
        for &(ti, _) in &s.tensors {
            map.insert(tensors[ti].name.clone(), Json::String(s.file_name.clone()));
        }
    }
    let total: u64 = tensors.iter().map(TensorPlan::bytes).sum();
    let params: u64 = tensors.iter().map(TensorPlan::numel).sum();
    json!({"metadata": {"total_size": total, "total_parameters": params}, "weight_map": map})
}

/// One write task: elements `start..start + len` of tensor `tensor`, at `file_off` of shard
/// `shard`.
struct Job {
    shard: usize,
    tensor: usize,
    start: u64,
    len: usize,
    file_off: u64,
}

fn jobs(tensors: &[TensorPlan], shards: &[Shard]) -> Vec<Job> {
    let mut out = Vec::new();
    for (si, s) in shards.iter().enumerate() {
        let data_start = 8 + s.header.len() as u64;
        for &(ti, off) in &s.tensors {
            let n = tensors[ti].numel();
            let mut start = 0u64;
            while start < n {
                let len = (n - start).min(CHUNK_ELEMS as u64) as usize;
                let file_off = data_start + off + 2 * start;
                out.push(Job { shard: si, tensor: ti, start, len, file_off });
                start += len as u64;
            }
        }
    }
    out
}

/// Where shard files go: `out`, or round-robin over `spread` with links in `out`.
pub struct ShardDirs<'a> {
    pub out: &'a Path,
    pub spread: &'a [PathBuf],
}

impl ShardDirs<'_> {
    /// The directory that holds shard `k`'s bytes.
    fn home(&self, k: usize) -> &Path {
        if self.spread.is_empty() {
            self.out
        } else {
            &self.spread[k % self.spread.len()]
        }
    }
}

/// Writes every shard; returns the bytes written. Progress goes to stderr.
pub fn write_shards(
    dirs: &ShardDirs<'_>,
    seed: u64,
    tensors: &[TensorPlan],
    shards: &[Shard],
) -> Result<u64> {
    let mut files = Vec::with_capacity(shards.len());
    for (k, s) in shards.iter().enumerate() {
        let part = dirs.home(k).join(format!("{}.part", s.file_name));
        let f = File::create(&part).with_context(|| format!("creating {}", part.display()))?;
        f.set_len(s.file_bytes()).with_context(|| format!("sizing {}", part.display()))?;
        let mut head = (s.header.len() as u64).to_le_bytes().to_vec();
        head.extend_from_slice(&s.header);
        f.write_all_at(&head, 0).with_context(|| format!("writing {}", part.display()))?;
        files.push((f, part));
    }
    let keys: Vec<u64> = tensors.iter().map(|t| tensor_key(seed, &t.name)).collect();
    let work = jobs(tensors, shards);
    let total: u64 = shards.iter().map(Shard::file_bytes).sum();
    let done = AtomicU64::new(0);
    let finished = AtomicBool::new(false);
    let res = std::thread::scope(|scope| {
        scope.spawn(|| progress(&done, &finished, total));
        let r = work.par_iter().try_for_each_init(
            || vec![0u8; 2 * CHUNK_ELEMS],
            |buf, job| {
                let out = &mut buf[..2 * job.len];
                fill(&tensors[job.tensor], keys[job.tensor], job.start, out);
                let (f, path) = &files[job.shard];
                f.write_all_at(out, job.file_off)
                    .with_context(|| format!("writing {}", path.display()))?;
                done.fetch_add(out.len() as u64, Ordering::Relaxed);
                anyhow::Ok(())
            },
        );
        finished.store(true, Ordering::Relaxed);
        r
    });
    res?;
    for (k, ((_, part), s)) in files.iter().zip(shards).enumerate() {
        let fin: PathBuf = dirs.home(k).join(&s.file_name);
        std::fs::rename(part, &fin).with_context(|| format!("renaming to {}", fin.display()))?;
        if !dirs.spread.is_empty() {
            let link = dirs.out.join(&s.file_name);
            let target = std::path::absolute(&fin)
                .with_context(|| format!("resolving {}", fin.display()))?;
            std::os::unix::fs::symlink(&target, &link)
                .with_context(|| format!("linking {} to {}", link.display(), target.display()))?;
        }
    }
    Ok(total)
}

/// Prints a line to stderr every two seconds until `finished`.
fn progress(done: &AtomicU64, finished: &AtomicBool, total: u64) {
    let start = Instant::now();
    let mut last = Instant::now();
    while !finished.load(Ordering::Relaxed) {
        std::thread::sleep(Duration::from_millis(100));
        if last.elapsed() >= Duration::from_secs(2) {
            last = Instant::now();
            let d = done.load(Ordering::Relaxed);
            let secs = start.elapsed().as_secs_f64();
            eprintln!(
                "synth: {:.2} / {:.2} GB ({:.0}%), {:.2} GB/s",
                d as f64 / 1e9,
                total as f64 / 1e9,
                100.0 * d as f64 / total.max(1) as f64,
                d as f64 / 1e9 / secs
            );
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Mean and variance of the Irwin-Hall draw over many elements: 0 and 1 within sampling
    /// error (a wrong SD constant or lane extraction shifts these by far more).
    #[test]
    fn unit_normal_has_unit_variance() {
        let n = 1_000_000u64;
        let (mut s, mut s2, mut lo, mut hi) = (0f64, 0f64, 0f32, 0f32);
        for i in 0..n {
            let z = unit_normal(12345, i);
            s += z as f64;
            s2 += (z as f64) * (z as f64);
            lo = lo.min(z);
            hi = hi.max(z);
        }
        let mean = s / n as f64;
        let var = s2 / n as f64 - mean * mean;
        assert!(mean.abs() < 0.005, "mean {mean}");
        assert!((var - 1.0).abs() < 0.01, "variance {var}");
        assert!(lo > -3.47 && hi < 3.47 && lo < -3.0 && hi > 3.0, "range [{lo}, {hi}]");
    }

    /// A tensor's bytes do not depend on how the elements are split into tasks.
    #[test]
    fn fill_is_independent_of_chunking() {
        let t = TensorPlan {
            name: "x".into(),
            shape: vec![7, 13],
            dist: Dist { mean: 0.0, std: 1.0, row_tau: TAU },
        };
        let mut whole = vec![0u8; 2 * 91];
        fill(&t, 9, 0, &mut whole);
        let mut parts = vec![0u8; 2 * 91];
        let (a, b) = parts.split_at_mut(2 * 40);
        fill(&t, 9, 0, a);
        fill(&t, 9, 40, b);
        assert_eq!(whole, parts);
        let mut other = vec![0u8; 2 * 91];
        fill(&t, 10, 0, &mut other);
        assert_ne!(whole, other);
    }

    /// Shards respect the limit, keep the tensor order, and give an oversized tensor its own.
    #[test]
    fn shards_pack_in_order_under_the_limit() {
        let d = Dist { mean: 0.0, std: 1.0, row_tau: 0.0 };
        let t = |n: &str, e: usize| TensorPlan { name: n.into(), shape: vec![e], dist: d };
        let ts = vec![t("a", 30), t("b", 30), t("c", 100), t("d", 10)];
        let shards = plan_shards(&ts, 120);
        let got: Vec<Vec<(usize, u64)>> = shards.iter().map(|s| s.tensors.clone()).collect();
        assert_eq!(got, vec![vec![(0, 0), (1, 60)], vec![(2, 0)], vec![(3, 0)]]);
        assert_eq!(shards[2].file_name, "model-00003-of-00003.safetensors");
        assert_eq!(plan_shards(&ts, 1 << 20)[0].file_name, "model.safetensors");
    }
}
