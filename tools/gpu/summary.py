#!/usr/bin/env python3
"""The CUDA speed receipt (issue 6) as one table, from the stage logs `tools/gpu/receipt.sh`
wrote in one call (default: $OUT, else /tmp/tfgpu/out):

    python3 tools/gpu/summary.py [LOG_DIR]

Reads yardsticks.log (tools/gpu/yardsticks.py: copy bandwidth, roofline, cuBLAS on the model's
shapes), products.log (the cuda_wgmma test binary's wg_linear_speed lines), bench.log (`tensorfold bench` JSON lines: decode and prefill), peer.log
(torch_peer.py JSON lines, the last one holds every figure), conc.log (bench_concurrent) and
big.log (the 33B geometry), and prints each figure beside its target: % of roofline, % of
cuBLAS, and the ratio to PyTorch measured in the same call. A missing log leaves its rows out;
nothing is filled in from elsewhere.
"""
import json
import os
import pathlib
import re
import statistics
import sys


def json_lines(path):
    out = []
    if path.is_file():
        for line in path.read_text(errors="replace").splitlines():
            line = line.strip()
            if line.startswith("{"):
                try:
                    out.append(json.loads(line))
                except json.JSONDecodeError:
                    pass
    return out


def med(xs):
    return statistics.median(xs) if xs else None


def bench_figures(rows):
    """{(pp, tg): (median pp tok/s, median tg tok/s, load s, first token s)} of tensorfold
    bench lines. Rep 0 (first-use compilation) is left out of the medians when later reps
    exist; its first_token_s is the cold start figure."""
    by = {}
    for r in rows:
        if r.get("engine") == "tensorfold":
            by.setdefault((r["pp"], r["tg"]), []).append(r)
    out = {}
    for k, v in by.items():
        warm = [r for r in v if r.get("rep", 0) > 0] or v
        first = [r["first_token_s"] for r in v if r.get("first_token_s") is not None]
        out[k] = (med([r["pp_tok_s"] for r in warm]), med([r["tg_tok_s"] for r in warm if r["tg"]]),
                  min(r["load_s"] for r in v), first[0] if first else None)
    return out


def products(path, y):
    """The served prefill GEMM (linear_bf16_ws) on the model's shapes, from the
    `cuda_wgmma wg_linear_speed` lines: {rows: (FLOP-weighted TFLOP/s, cuBLAS's)}."""
    if not path.is_file() or not y.get("gemm"):
        return {}
    rate = {}
    for m in re.finditer(r"wg TFLOP/s (\d+)x(\d+) linear_bf16_ws\s*:(.*)", path.read_text()):
        for r, t in re.findall(r"r(\d+): (\d+)", m.group(3)):
            rate[(int(m.group(1)), int(m.group(2)), r)] = float(t)
    out = {}
    for rows, g in y["gemm"].items():
        flops = [(2 * s["n"] * s["k"], rate.get((s["n"], s["k"], rows))) for s in g["shapes"]]
        if flops and all(t for _, t in flops):
            ours = sum(f for f, _ in flops) / sum(f / t for f, t in flops)
            out[rows] = (ours, g["model_TFLOPs"])
    return out


def line(what, ours, peer=None, note=""):
    f = lambda v: "-" if v is None else (f"{v:,.1f}" if isinstance(v, float) else str(v))
    ratio = f"{ours / peer:.2f}x" if ours and peer else "-"
    print(f"| {what} | {f(ours)} | {f(peer)} | {ratio} | {note} |")


def main():
    d = pathlib.Path(sys.argv[1] if len(sys.argv) > 1 else os.environ.get("OUT", "/tmp/tfgpu/out"))
    ys = json_lines(d / "yardsticks.log")
    y = ys[-1] if ys else {}
    peer = (json_lines(d / "peer.log") or [{}])[-1]
    bench = bench_figures(json_lines(d / "bench.log"))
    print(f"device: {y.get('device', '?')}; logs: {d}")
    print("| what | tensorfold | PyTorch (same call) | ratio | note |\n|---|---|---|---|---|")
    roof = y.get("roofline_tok_s")
    if y:
        line("copy bandwidth TB/s", y["copy_TBps"], None, "read + write, 4 GiB")
    dec = [v for (pp, tg), v in bench.items() if tg > 0]
    if dec:
        tg = dec[0][1]
        pct = f"{100 * tg / roof:.1f}% of the {roof:.1f} tok/s roofline" if roof else ""
        line("decode tok/s, batch 1", tg, peer.get("decode_graph_eager_tok_s"), pct)
        if peer.get("decode_graph_compiled_tok_s"):
            line("decode vs torch.compile", tg, peer["decode_graph_compiled_tok_s"], "")
        line("load to ready, s", dec[0][2], None, "file in page cache")
        if dec[0][3] is not None:
            line("load to first token, s", dec[0][3], None, "rep 0: kernels compiled unless cached")
    for rows, (ours, cublas) in sorted(products(d / "products.log", y).items()):
        line(f"prefill GEMM at {rows} rows, TFLOP/s", ours, None,
             f"{100 * ours / cublas:.0f}% of cuBLAS's {cublas:.0f} on the model's shapes")
    for (pp, tg), v in sorted(bench.items()):
        if tg:
            continue
        g = y.get("gemm", {}).get(str(pp))
        note = ""
        if g:
            flops_tok = 2 * sum(s["n"] * s["k"] for s in g["shapes"])
            cublas_tok_s = g["model_TFLOPs"] * 1e12 / flops_tok / y.get("layers", 1)
            note = (f"linears at {v[0] * flops_tok * y.get('layers', 1) / 1e12:.0f} TFLOP/s = "
                    f"{100 * v[0] / cublas_tok_s:.0f}% of cuBLAS on these shapes "
                    f"({g['model_TFLOPs']:.0f} TFLOP/s)")
        line(f"prefill {pp} tok/s", v[0], peer.get(f"prefill_{pp}_tok_s"), note)
    conc = d / "conc.log"
    if conc.is_file():
        for m in re.finditer(r"level\s+(\d+): .* = \s*([\d.]+) tok/s", conc.read_text()):
            line(f"aggregate decode, {m.group(1)} streams", float(m.group(2)))
        for m in re.finditer(r"vs (\w+): equal (\d+)/(\d+)", conc.read_text()):
            print(f"| replies equal to {m.group(1)} | {m.group(2)}/{m.group(3)} | | | |")
    big = bench_figures(json_lines(d / "big.log"))
    by = [json.loads(m) for m in re.findall(r"^(\{.*roofline.*\})$", (d / "big.log").read_text(), re.M)] \
        if (d / "big.log").is_file() else []
    for (pp, tg), v in big.items():
        if tg:
            r = by[-1]["roofline_tok_s"] if by else None
            pct = f"{100 * v[1] / r:.1f}% of the {r:.1f} tok/s roofline" if r else ""
            line("33B geometry decode tok/s, batch 1", v[1], None, pct)
            line("33B load to ready, s", v[2], None, "")


if __name__ == "__main__":
    main()
