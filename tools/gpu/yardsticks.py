#!/usr/bin/env python3
"""Device yardsticks for the CUDA speed receipts (issue 6), measured by PyTorch/cuBLAS in the
same call as tensorfold: copy bandwidth, and bf16 GEMM on the checkpoint's OWN linear shapes at
the prefill lengths, so "prefill >= 60% of what cuBLAS reaches on the model's shapes" has a
figure to hold it to.

    python3 tools/gpu/yardsticks.py --ckpt DIR [--tokens 2048,8192]

Reads only DIR/config.json (no weights). Prints one JSON line:
- copy_TBps: y.copy_(x) of 4 GiB bf16, read + write bytes / time (torch_peer.py's method);
- weight_bytes_read_per_token and roofline_tok_s: bf16 bytes of every matrix a decode step
  streams (all layers' projections, the final norm and the LM head; not the embedding table,
  which is gathered) / copy bandwidth;
- gemm[T]: for each prefill length T, per shape (name, N, K) the cuBLAS time and TFLOP/s of
  x[T, K] @ W[N, K]^T, and `model_TFLOPs`: the layer's matrices together (q, k, v, o, gate,
  up, down, each once) = their summed FLOPs / summed times: the rate a prefill whose linears all
  ran at cuBLAS speed would reach on this model. The LM head is left out (prefill computes
  logits for the last row only).
Timings: CUDA events around 20 repetitions after 3 warm-ups; random inputs.
"""
import argparse
import json
import pathlib

import torch


def timed(fn, reps=20, warm=3):
    for _ in range(warm):
        fn()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    torch.cuda.synchronize()
    start.record()
    for _ in range(reps):
        fn()
    end.record()
    torch.cuda.synchronize()
    return start.elapsed_time(end) / 1e3 / reps


def shapes(cfg):
    h, i = cfg["hidden_size"], cfg["intermediate_size"]
    hd = cfg.get("head_dim") or h // cfg["num_attention_heads"]
    q, kv = cfg["num_attention_heads"] * hd, cfg["num_key_value_heads"] * hd
    return [("q_proj", q, h), ("k_proj", kv, h), ("v_proj", kv, h), ("o_proj", h, q),
            ("gate_proj", i, h), ("up_proj", i, h), ("down_proj", h, i)]


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--ckpt", required=True, help="checkpoint directory (config.json is read)")
    ap.add_argument("--tokens", default="2048,8192", help="prefill lengths (GEMM rows)")
    a = ap.parse_args()
    cfg = json.loads((pathlib.Path(a.ckpt) / "config.json").read_text())
    dev = "cuda"
    res = {"device": torch.cuda.get_device_name(0), "torch": torch.__version__}
    x = torch.empty(2 * 1024**3, dtype=torch.bfloat16, device=dev)
    y = torch.empty_like(x)
    res["copy_TBps"] = 2 * x.numel() * 2 / timed(lambda: y.copy_(x), 10, 2) / 1e12
    # Read alone (a sum of the same 4 GiB): the rate a weight-streaming decode product could
    # reach, beside the copy's read + write.
    res["read_TBps"] = x.numel() * 2 / timed(lambda: x.sum(dtype=torch.float32), 10, 2) / 1e12
    del x, y
    layer = shapes(cfg)
    h, v, layers = cfg["hidden_size"], cfg["vocab_size"], cfg["num_hidden_layers"]
    read = 2 * (layers * (sum(n * k for _, n, k in layer) + 2 * h) + h + v * h)
    res["layers"] = layers
    res["weight_bytes_read_per_token"] = read
    res["roofline_tok_s"] = res["copy_TBps"] * 1e12 / read
    # cuBLAS at one row (a decode product) on each shape, 8 copies of the weight in turn so L2
    # holds none of them: bytes of weight read / time.
    res["gemv_TBps"] = {}
    for name, n, k in layer + [("lm_head", v, h)]:
        xa = torch.randn(1, k, dtype=torch.bfloat16, device=dev)
        ws = [torch.randn(n, k, dtype=torch.bfloat16, device=dev) for _ in range(8 if n * k < 2**28 else 2)]
        it = iter(range(10**9))
        s = timed(lambda: xa @ ws[next(it) % len(ws)].t(), 40, 4)
        res["gemv_TBps"][name] = n * k * 2 / s / 1e12
        del xa, ws
    res["gemm"] = {}
    for t in [int(s) for s in a.tokens.split(",") if s]:
        rows, flops, secs = [], 0.0, 0.0
        for name, n, k in layer:
            xa = torch.randn(t, k, dtype=torch.bfloat16, device=dev)
            w = torch.randn(n, k, dtype=torch.bfloat16, device=dev)
            s = timed(lambda: xa @ w.t())
            f = 2.0 * t * n * k
            rows.append({"name": name, "n": n, "k": k, "s": s, "TFLOPs": f / s / 1e12})
            flops, secs = flops + f, secs + s
            del xa, w
        res["gemm"][str(t)] = {"shapes": rows, "model_TFLOPs": flops / secs / 1e12,
                               "layer_linear_s": secs}
    print(json.dumps(res), flush=True)


if __name__ == "__main__":
    main()
