#!/usr/bin/env python3
"""Kernel time of one prefill by kernel, on the GPU machine (receipt.sh's `breakdown` stage).

  breakdown.py ncu < ncu.csv     tensorfold's kernels: ncu's `--csv` rows (metrics
                                 gpu__time_duration.sum and dram__bytes_read.sum) summed by
                                 (kernel, grid, block): calls, us a call, MB read a call, and
                                 each family's share of the total
  breakdown.py torch CKPT [ROWS] PyTorch's: torch.profiler over two prefills of ROWS (2,048)
                                 tokens of the checkpoint as ../shared/peers/torch_peer.py
                                 times them (use_cache=False, logits_to_keep=1), after three
                                 warm-ups; kernel time a prefill by kernel name

Both print ms a prefill, so the two engines' products, attention and small kernels can be set
side by side (docs/bench/2026-12-04-h200.md, session 22 calls 1 and 8).
"""
import collections
import csv
import sys


def ncu(stream) -> None:
    rows = list(csv.reader(line for line in stream if line.startswith('"')))
    if not rows:
        sys.exit("breakdown: no ncu CSV rows on stdin")
    hdr = rows[0]
    col = {name: hdr.index(name) for name in
           ("ID", "Kernel Name", "Grid Size", "Block Size", "Metric Name", "Metric Value")}
    per = collections.OrderedDict()
    for r in rows[1:]:
        key = (r[col["Kernel Name"]].split("(")[0], r[col["Grid Size"]], r[col["Block Size"]])
        d = per.setdefault(r[col["ID"]], {"key": key})
        d[r[col["Metric Name"]]] = float(r[col["Metric Value"]].replace(",", ""))
    agg = collections.OrderedDict()
    for d in per.values():
        agg.setdefault(d["key"], []).append(d)
    total = sum(d.get("gpu__time_duration.sum", 0.0) for d in per.values())
    print(f"total kernel time: {total / 1e6:.2f} ms ({len(per)} launches)")
    for (name, grid, block), ds in agg.items():
        t = sum(d.get("gpu__time_duration.sum", 0.0) for d in ds)
        mb = sum(d.get("dram__bytes_read.sum", 0.0) for d in ds) / len(ds) / 1e6
        share, each = 100 * t / total, t / len(ds) / 1e3
        print(f"{t / 1e6:8.2f} ms {share:5.1f}%  {len(ds):4d} x {each:8.2f} us {mb:8.2f} MB"
              f"  {name} {grid} {block}")


def torch_prefill(ckpt: str, rows: int) -> None:
    import torch
    from transformers import LlamaForCausalLM

    model = LlamaForCausalLM.from_pretrained(ckpt, dtype=torch.bfloat16, device_map="cuda").eval()
    ids = torch.randint(0, min(model.config.vocab_size, 49152), (1, rows), device="cuda")
    reps = 2
    with torch.no_grad():
        for _ in range(3):
            model(ids, use_cache=False, logits_to_keep=1)
        torch.cuda.synchronize()
        acts = [torch.profiler.ProfilerActivity.CUDA]
        with torch.profiler.profile(activities=acts) as prof:
            for _ in range(reps):
                model(ids, use_cache=False, logits_to_keep=1)
            torch.cuda.synchronize()
    time, calls = collections.Counter(), collections.Counter()
    for e in prof.events():
        if e.device_type == torch.autograd.DeviceType.CUDA:
            time[e.name[:90]] += e.device_time
            calls[e.name[:90]] += 1
    total = sum(time.values())
    print(f"total kernel time a prefill of {rows}: {total / reps / 1e3:.2f} ms")
    for name, t in time.most_common(20):
        share = 100 * t / total
        print(f"{t / reps / 1e3:8.2f} ms {share:5.1f}%  {calls[name] // reps:4d} x  {name}")


def main() -> None:
    if len(sys.argv) >= 2 and sys.argv[1] == "ncu":
        ncu(sys.stdin)
    elif len(sys.argv) >= 3 and sys.argv[1] == "torch":
        torch_prefill(sys.argv[2], int(sys.argv[3]) if len(sys.argv) > 3 else 2048)
    else:
        sys.exit(__doc__)


if __name__ == "__main__":
    main()
