#!/usr/bin/env bash
# GPU receipts for the CUDA issues, run on the GPU machine (no cargo, no network) from the repo
# root with the release binary and its companions carried in .gpu/ (docs/ARCHITECTURE.md, GPU receipts):
#   .gpu/tensorfold        release binary built on a CPU machine
#   .gpu/tok/              tokenizer.json + tokenizer_config.json from any `synth --like smollm2`
#   .gpu/torch_peer.py     ../shared/peers/torch_peer.py
#   .whl/                  openai and its deps (cp312 wheels), for bench_concurrent: tools/gpu/wheels.sh
# Usage: tools/gpu/receipt.sh STAGE...   stages: synth contract check judge judge64 yardstick yardsticks
#        bench products ab attnab s8ab s11ab peer serve conc concab loadbw knobs knobs33
#        breakdown big summary rope sample wsab wsserve stepbw envab ahead serveab cold
# (yardstick = HF against itself for the judge; yardsticks = copy bandwidth + cuBLAS on the
# model's shapes for the speed receipt; summary = tools/gpu/summary.py over this call's logs)
# Everything is printed and also written as <stage>.log under $WORK/out; when $OUT is set
# (the device tool's folder, which returns at most 8 files) they also land in $OUT/logs.tar.
set -uo pipefail
B=${B:-.gpu/tensorfold}
W=${WORK:-/tmp/tfgpu}
export TENSORFOLD_CACHE=$W/cache TENSORFOLD_BIN=$B
OUTD=$W/out
mkdir -p "$W" "$OUTD"
log() { echo "== $* ($(date +%T))"; }
# check exact's verdicts and fingerprints on llama3-8b (extra arguments: env assignments).
fingerprints() {
  env "$@" $B check exact -m $W/l8b --device cuda --tokens 320 |
    grep -o '^[A-Z]* [a-z]*:\|fingerprint [0-9a-f]*' | tr '\n' ' '; echo
}
# bench's decode tok/s of model dir $1 for $2 generated tokens (then env assignments).
decode_rates() {
  local m=$1 tg=$2; shift 2
  env "$@" $B bench -m $W/$m --device cuda --pp 128 --tg $tg --reps 2 2>&1 |
    grep -o '"tg_tok_s":[0-9.]*' | tr '\n' ' '
}
# The 33B geometry (~62 GiB): more than this machine's disk holds beside the rest, so its
# shards are spread over RAM (/dev/shm) and disk with `synth --shard-dir`.
synth_n33() {
  [ -f $W/n33/config.json ] || $B synth --like nanbeige-33b --seed 1 --out $W/n33 \
    --tokenizer-from .gpu/tok --shard-dir /dev/shm/n33 --shard-dir $W/n33s
}
stage_synth() {
  nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader
  [ -f $W/smol/config.json ] || $B synth --like smollm2 --seed 1 --out $W/smol --tokenizer-from .gpu/tok
  [ -f $W/l8b/config.json ] || $B synth --like llama3-8b --seed 1 --out $W/l8b --tokenizer-from .gpu/tok
}
stage_contract() { $B contract --device cuda --like all; echo "contract rc=$?"; }
stage_check() {
  $B check exact -m $W/smol --device cuda; echo "check smol rc=$?"
  $B check exact -m $W/l8b --device cuda --tokens 320; echo "check l8b rc=$?"
}
stage_judge() {
  H=tools/reference/history/history.json
  for m in smol l8b; do
    python3 tools/reference/hf_logits.py --model $W/$m --history $H --device cuda \
      --out $W/ref_$m.json --full-out $W/ref_$m.bin >/dev/null || echo "hf_logits $m failed"
  done
  $B judge -m $W/smol --device cuda --reference $W/ref_smol.json --reference-logits $W/ref_smol.bin \
    --max-positions 1024 --f64 --threads 16 | tail -4; echo "judge smol rc=$?"
  $B judge -m $W/l8b --device cuda --reference $W/ref_l8b.json --reference-logits $W/ref_l8b.bin \
    --max-positions 1024 | tail -4; echo "judge l8b rc=$?"
}
# Issue 5: CUDA against HF bf16 AND the CPU float64 pass on the 8B geometry (512 positions).
stage_judge64() {
  H=tools/reference/history/history.json
  [ -f $W/ref_l8b.json ] || python3 tools/reference/hf_logits.py --model $W/l8b --history $H --device cuda \
    --out $W/ref_l8b.json --full-out $W/ref_l8b.bin >/dev/null || echo "hf_logits l8b failed"
  $B judge -m $W/l8b --device cuda --reference $W/ref_l8b.json --reference-logits $W/ref_l8b.bin \
    --max-positions 512 --f64 --threads 16 | tail -4; echo "judge l8b f64 rc=$?"
}
# How far HF is from itself on the same card (eager vs sdpa attention): the yardstick that
# says what the judge's figures above mean on random-weight checkpoints.
stage_yardstick() {
  H=tools/reference/history/history.json
  for m in smol l8b; do
    for attn in sdpa eager; do
      python3 tools/reference/hf_logits.py --model $W/$m --history $H --device cuda --attn $attn \
        --out $W/y_${m}_$attn.json --full-out $W/y_${m}_$attn.bin >/dev/null || echo "hf_logits $m $attn failed"
    done
    $B judge -m $W/$m --reference $W/y_${m}_sdpa.json --reference-logits $W/y_${m}_sdpa.bin \
      --candidate $W/y_${m}_eager.json --candidate-logits $W/y_${m}_eager.bin --max-positions 1024 | tail -1
  done
}
stage_bench() {
  $B bench -m $W/l8b --device cuda --pp 128 --tg 256 --reps 3
  # Prefill moves ~3% between reps of one process: 2,048 and 8,192 take the median of 3 warm
  # reps (summary.py leaves rep 0 out), 32,768 (2.3 s a rep) of 1.
  for pp in 2048 8192; do $B bench -m $W/l8b --device cuda --pp $pp --tg 0 --reps 4; done
  $B bench -m $W/l8b --device cuda --pp 32768 --tg 0 --reps 2
}
# The served prefill GEMM alone on the model's shapes (summary weighs it against yardsticks'
# cuBLAS): needs the cuda_wgmma test binary as .gpu/cuda_wgmma.
stage_products() {
  TF_WG_KERNELS=linear_bf16_ws timeout 300 .gpu/cuda_wgmma --ignored --nocapture wg_linear_speed | grep "TFLOP"
}
stage_peer() { python3 .gpu/torch_peer.py --ckpt $W/l8b --prefill 2048,8192,32768 ${PEER_ARGS:-}; }
stage_yardsticks() { python3 tools/gpu/yardsticks.py --ckpt $W/l8b --tokens 2048,8192; }
# Issue 6: aggregate decode at 16 and 64 streams, every reply equal to the same request alone.
stage_conc() {
  python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl && export PYTHONPATH=/tmp/site
  python3 tools/bench_concurrent.py --levels 1,16,64 --alone --max-tokens 64 \
    --model $W/l8b --serve-args "--device cuda --context 2048"; echo "bench_concurrent rc=$?"
}
# The 33B geometry: its yardsticks and decode.
stage_big() {
  df -h /tmp /dev/shm | cat
  synth_n33
  python3 tools/gpu/yardsticks.py --ckpt $W/n33 --tokens 2048
  $B bench -m $W/n33 --device cuda --pp 128 --tg 128 --reps 2
}
# What each of this session's speed switches is worth, same binary and call: decode and
# prefill with one of them off (TENSORFOLD_PDL=0: serialized launches; TENSORFOLD_WGMMA=0:
# the mma.sync prefill tiles; TENSORFOLD_DECODE_ATTN=0: the general attention kernel for decode).
stage_ab() {
  for env in TENSORFOLD_PDL=0 TENSORFOLD_DECODE_ATTN=0; do
    echo "-- $env"; env $env $B bench -m $W/l8b --device cuda --pp 128 --tg 256 --reps 2
  done
  echo "-- TENSORFOLD_WGMMA=0"
  for pp in 2048 8192; do TENSORFOLD_WGMMA=0 $B bench -m $W/l8b --device cuda --pp $pp --tg 0 --reps 1; done
  echo "-- TENSORFOLD_PDL=0 (prefill)"
  for pp in 2048 32768; do TENSORFOLD_PDL=0 $B bench -m $W/l8b --device cuda --pp $pp --tg 0 --reps 1; done
}
# Session 7's decode-attention switches (docs/ARCHITECTURE.md, CUDA section): each must give
# check exact's fingerprints of the default (same values, other addresses or CTAs), then its
# decode speed beside the default's, with bench's small pool and with serve's default pool
# for llama3-8b (40,960 positions: the split grid is sized by the pool).
stage_attnab() {
  for env in TENSORFOLD_AB=default TENSORFOLD_KV_LAYOUT=layer TENSORFOLD_KERNEL_DEFINES=TF_SPLIT_LOOP=1; do
    echo "-- $env"
    fingerprints $env
    for kv in 384 40960; do
      env $env $B bench -m $W/l8b --device cuda --pp 128 --tg 256 --reps 2 --kv-positions $kv
    done
  done
  TENSORFOLD_KV_LAYOUT=layer $B contract --device cuda --like llama3-8b | grep SUMMARY
  TENSORFOLD_KERNEL_DEFINES=TF_SPLIT_LOOP=1 $B contract --device cuda --like llama3-8b | grep SUMMARY
}
# Session 8's decode-attention knobs (docs/ARCHITECTURE.md, CUDA section), each against the
# default in the same call: TF_DEC_EARLY=0 and TF_DEC_TMA=0 must give the default's check exact
# fingerprints (same values, other timing); TF_SPLIT=256 gives session 7's reference ones
# (docs/bench/2026-12-01-h200.md), TF_SPLIT=64 others of its own (the split is part of the
# definition). Then decode speed at bench's pool and at serve's default pool.
stage_s8ab() {
  for d in "" TF_DEC_EARLY=0 TF_DEC_TMA=0 TF_SPLIT=256 TF_SPLIT=64; do
    echo "-- TENSORFOLD_KERNEL_DEFINES=$d"
    fingerprints TENSORFOLD_KERNEL_DEFINES="$d"
    for kv in 384 40960; do
      TENSORFOLD_KERNEL_DEFINES="$d" $B bench -m $W/l8b --device cuda --pp 128 --tg 256 --reps 2 --kv-positions $kv
    done
  done
}
# Session 11's open questions, each against the default in the same call: the general linear
# entries regrouping weights once for all token tiles (TF_REGROUP_ONCE=1: must keep check
# exact's fingerprints; 16/64 streams fell 6% / 15% with the consecutive-k definition) and the
# one-token-tile q/k/v entry (TENSORFOLD_GROUP_D8=1), on decode and aggregate decode.
stage_s11ab() {
  python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl && export PYTHONPATH=/tmp/site
  for env in TENSORFOLD_AB=default TENSORFOLD_KERNEL_DEFINES=TF_REGROUP_ONCE=1 TENSORFOLD_GROUP_D8=1; do
    echo "-- $env"
    fingerprints $env
    env $env $B bench -m $W/l8b --device cuda --pp 128 --tg 256 --reps 2
    env $env python3 tools/bench_concurrent.py --levels 16,64 --max-tokens 64 \
      --model $W/l8b --serve-args "--device cuda"
  done
}
stage_summary() { python3 tools/gpu/summary.py "$OUTD"; }
# Session 19's open question: 16 / 64 streams with and without the decode CTA's spread and
# rope's early trigger, alternated twice (one burst a level is noisy).
stage_concab() {
  for r in 1 2; do
    for d in X=1 TF_ROPE_TRIGGER=0 TF_DEC_SPREAD=0; do
      echo "-- $d"; TENSORFOLD_KERNEL_DEFINES=$d stage_conc 2>&1 | grep -E "^level|equal"
    done
  done
}
# Decode ahead in the serve scheduler (session 35: a lone greedy lane's steps run ahead of
# the host): streams with it on and off (TENSORFOLD_DECODE_AHEAD=0), two alternated rounds.
stage_serveab() {
  for r in 1 2; do
    for d in X=1 TENSORFOLD_DECODE_AHEAD=0; do
      echo "-- $d"; (export "$d"; stage_conc) 2>&1 | grep -E "^level|equal"
    done
  done
}
# Session 20's open questions: the read rate of the decode load pattern alone (needs
# .gpu/loadbw.cubin from `tools/gpu/loadbw.py --build .gpu/loadbw.cubin` on the CPU machine),
# then the decode knobs re-measured with line-sized fetches (TF_L2_128), two alternated rounds
# on llama3-8b, one on the 33B geometry (TENSORFOLD_LINEAR_WARPS changes the bits).
stage_loadbw() { python3 tools/gpu/loadbw.py .gpu/loadbw.cubin; }
# One 2,048 prefill by kernel: tensorfold's by ncu (direct launches, serialized), PyTorch's by
# torch.profiler (session 22: the products and attention are where PyTorch is ahead).
stage_breakdown() {
  TENSORFOLD_CUDA_GRAPHS=0 timeout 200 /usr/local/cuda/bin/ncu --clock-control none --csv \
    --metrics gpu__time_duration.sum,dram__bytes_read.sum \
    $B bench -m $W/l8b --device cuda --pp 2048 --tg 1 --reps 1 2>/dev/null |
    python3 tools/gpu/breakdown.py ncu
  python3 tools/gpu/breakdown.py torch $W/l8b 2048 2>&1 | grep -v -i warn
}
stage_knobs() {
  local e
  for r in 1 2; do
    for e in X=1 TENSORFOLD_KERNEL_DEFINES=TF_D8_U=3 TENSORFOLD_KERNEL_DEFINES=TF_D8_U=5 \
        TENSORFOLD_NORM_FUSE=all TENSORFOLD_NORM_FUSE=0 TENSORFOLD_KERNEL_DEFINES=TF_L2_128=0; do
      echo "$e decode $(decode_rates l8b 256 $e)"
    done
  done
}
# The 33B geometry's knobs (its own stage: with the 8B's they pass one call's 600 s).
stage_knobs33() {
  local e
  synth_n33 | tail -1
  for e in X=1 TENSORFOLD_LINEAR_WARPS=4096 TENSORFOLD_KERNEL_DEFINES=TF_D8_U=5; do
    echo "$e 33B decode $(decode_rates n33 128 $e)"
  done
}
# Session 27's q/k/v + rope + KV-write launch (kernels/linear_rope.cu): its bitwise test and
# speed at one row (needs .gpu/cuda_fused_rope), check exact's fingerprints without it (must
# equal the default's), then bench decode alternated with TENSORFOLD_ROPE_FUSE=0.
stage_rope() {
  timeout 300 .gpu/cuda_fused_rope --ignored --nocapture --test-threads 1 2>&1 |
    grep -E "bit for bit at 8|control|us a call|test result|panicked|differ"
  echo "default:           $(fingerprints X=1)"
  echo "ROPE_FUSE=0:       $(fingerprints TENSORFOLD_ROPE_FUSE=0)"
  local e
  for r in 1 2 3; do
    for e in X=1 TENSORFOLD_ROPE_FUSE=0; do echo "$e decode $(decode_rates l8b 256 $e)"; done
  done
}
# Session 28's sampling penalties on the GPU (kernels/sample.cu penalize_rows): the sampling
# tests (needs .gpu/cuda_sample: host == device tokens, penalized values exact by ties), then
# bench decode greedy, greedy with a repetition penalty, and sampled with presence and
# frequency penalties, alternated (before session 28 a penalized row read its logits back).
stage_sample() {
  timeout 300 .gpu/cuda_sample --ignored --nocapture --test-threads 1 2>&1 |
    grep -E "gpu == host|us a call|us per row|by ties|test result|panicked|MISMATCH" | head -40
  local o
  for r in 1 2; do
    for o in "" "--repetition-penalty 1.3" \
      "--temperature 0.8 --top-p 0.95 --presence-penalty 0.5 --frequency-penalty 0.3"; do
      echo "[$o] decode $($B bench -m $W/l8b --device cuda --pp 128 --tg 256 --reps 2 $o 2>&1 |
        grep -o '"tg_tok_s":[0-9.]*' | tr '\n' ' ')"
    done
  done
}
# The prefill product's two-accumulator loop and consumer stagger (kernels/gemm90ws.cu:
# TF_WS_ACC2, TF_WS_STAGGER; built in session 30, measured and made the default in session 31)
# against the earlier loop (both 0). wsab (no model needed): the bitwise tests
# (linear_bf16_ws against linear_bf16 on every case shape; q/k/v and gate/up in one launch
# against three, needs .gpu/cuda_fused) in each setting, then the products' TFLOP/s.
# wsserve (after synth): check exact's fingerprints (equal in each setting), the contract, and
# served prefill 2,048 / 8,192 alternated, 3 rounds.
WS_OLD="TENSORFOLD_KERNEL_DEFINES=TF_WS_ACC2=0 TF_WS_STAGGER=0"
stage_wsab() {
  local e
  for e in X=1 "$WS_OLD"; do
    echo "-- $e"
    env "$e" TF_WG_KERNELS=linear_bf16_ws timeout 300 .gpu/cuda_wgmma --ignored --nocapture \
      wg_linear_equals 2>&1 | grep -E "compared|test result|panicked|differ" | head -20
    env "$e" timeout 200 .gpu/cuda_fused --ignored --nocapture fused_ops_equal 2>&1 |
      grep -E "test result|panicked|differ" | head -10
    env "$e" TF_WG_KERNELS=linear_bf16_ws timeout 200 .gpu/cuda_wgmma --ignored --nocapture \
      wg_linear_speed 2>&1 | grep "TFLOP"
  done
}
stage_wsserve() {
  local e r pp
  echo "default: $(fingerprints X=1)"
  echo "ACC2=0 STAGGER=0: $(fingerprints "$WS_OLD")"
  $B contract --device cuda --like llama3-8b | grep SUMMARY
  for r in 1 2 3; do
    for e in X=1 "$WS_OLD"; do
      for pp in 2048 8192; do
        echo "$e prefill $pp: $(env "$e" $B bench -m $W/l8b --device cuda --pp $pp --tg 0 --reps 3 2>&1 |
          grep -o '"pp_tok_s":[0-9.]*' | tr '\n' ' ')"
      done
    done
  done
}
# What a persistent step would gain on weight streaming alone (tools/gpu/stepbw.py; needs
# .gpu/stepbw.cubin): launches, grid barriers, and since session 30 the weights through a
# shared-memory ring filled by bulk copies (ring0, ring2), with latency phases of 4 and 8 us.
stage_stepbw() { python3 tools/gpu/stepbw.py .gpu/stepbw.cubin --delay 4 8; }
# Any switches against the default, on llama3-8b: AB="ENV=V ENV2=V2 ..." (each one setting;
# X=1 is the default). Fingerprints in each setting, then bench decode alternated, 3 rounds.
stage_envab() {
  local r e
  for e in ${AB:?set AB to the settings to compare}; do echo "$e: $(fingerprints "$e")"; done
  for r in 1 2 3; do
    for e in X=1 $AB; do echo "$e l8b: $(decode_rates l8b 256 "$e")"; done
  done
}
# Decode ahead (the next step issued before the host reads this one's token): the GPU test,
# every generated id of bench decode (llama3-8b, smol) with it on and off, then decode speed
# against TENSORFOLD_DECODE_AHEAD=0.
stage_ahead() {
  .gpu/cuda_ahead --ignored --nocapture 2>&1 | grep -E "start|test result|panicked|differ"
  echo "cuda_ahead rc=${PIPESTATUS[0]}"
  local m e
  for m in l8b smol; do
    for e in X=1 TENSORFOLD_DECODE_AHEAD=0; do
      echo "$m $e: $(env $e $B bench -m $W/$m --device cuda --pp 128 --tg 256 --reps 1 |
        grep -o '"tokens_fnv":"[0-9a-f]*"')"
    done
  done
  AB="TENSORFOLD_DECODE_AHEAD=0" stage_envab
}
# Session 36: a cold start (a fresh machine's cost) with the kernel cache and NVIDIA's ~/.nv
# removed first: bench's first token (rep 0 counts from opening the checkpoint), then serve's
# time until /health answers (it listens once every compile unit is ready). Sessions 32-35
# saw 16-22 s to the first token before the compile units were split.
stage_cold() {
  rm -rf "$TENSORFOLD_CACHE/kernels" ~/.nv
  $B bench -m $W/l8b --device cuda --pp 128 --tg 16 --reps 1 2>&1 | grep -o '"first_token_s":[0-9.]*'
  rm -rf "$TENSORFOLD_CACHE/kernels" ~/.nv
  python3 - "$W" <<'PY'
import sys, time
sys.path.insert(0, "tools")
from serverlib import Server  # TENSORFOLD_BIN is $B
t0 = time.time()
with Server(["--device", "cuda", "--context", "2048"], model=f"{sys.argv[1]}/l8b") as s:
    print(f"serve listening after {time.time() - t0:.2f} s")
    print("".join(l for l in open(s.log_path) if "kernels ready" in l))
PY
}
stage_serve() {
  python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl && export PYTHONPATH=/tmp/site
  python3 tools/bench_concurrent.py --levels 1,4,16 --alone --serial --max-tokens 32 \
    --model $W/l8b --serve-args "--device cuda --context 2048"; echo "bench_concurrent rc=$?"
}
for s in "$@"; do
  log "$s"
  "stage_$s" 2>&1 | tee "$OUTD/$s.log"
done
log done
if [ -n "${OUT:-}" ]; then tar -C "$OUTD" -cf "$OUT/logs.tar" .; fi
