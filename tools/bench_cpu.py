#!/usr/bin/env python3
"""CPU speed receipt: tensorfold vs llama.cpp on the same GGUF, in one run, A B A B.

Each round runs `tensorfold bench` (prefill a 512-token prompt in one chunk, then decode 128
greedy tokens) and the same work through llama.cpp (llama-cpp-python, 2 threads: eval of the
512 tokens with n_batch 512, then 128 single-token evals with greedy choice). Prints each
measurement, the medians, and the ratios tensorfold / llama.cpp.

    pip install llama-cpp-python==0.3.36   # builds llama.cpp from source (minutes)
    python3 tools/bench_cpu.py [--model PATH] [--rounds 3] [--threads 2]
"""
import argparse
import json
import os
import statistics
import subprocess
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def default_model():
    out = subprocess.run([os.path.join(ROOT, "scripts", "fetch-model.sh")], check=True,
                         capture_output=True, text=True)
    return out.stdout.strip()


def run_tensorfold(binary, model, pp, tg, threads):
    cmd = [binary, "bench", "-m", model, "--pp", str(pp), "--tg", str(tg), "--reps", "1",
           "--threads", str(threads)]
    out = subprocess.run(cmd, check=True, capture_output=True, text=True).stdout
    rec = json.loads(out.strip().splitlines()[-1])
    return rec["pp_tok_s"], rec["tg_tok_s"]


def last_logits_argmax(llm, vocab):
    """Greedy choice from the logits of the last evaluated token, read through the C API.

    With logits_all=False, llama-cpp-python 0.3.x never copies logits into `llm.scores` (its
    `eval` leaves them in the context; `scores` is also only n_batch rows long, so indexing it
    by position fails past the first batch): read the context's last output row instead.
    """
    import llama_cpp
    import numpy as np
    ptr = llama_cpp.llama_get_logits_ith(llm.ctx, -1)
    return int(np.ctypeslib.as_array(ptr, shape=(vocab,)).argmax())


def run_llamacpp(llm, vocab, pp, tg):
    prompt = [(i * 7919 + 13) % vocab for i in range(pp)]
    llm.reset()
    t0 = time.perf_counter()
    llm.eval(prompt)
    tok = last_logits_argmax(llm, vocab)
    t1 = time.perf_counter()
    for _ in range(tg):
        llm.eval([tok])
        tok = last_logits_argmax(llm, vocab)
    t2 = time.perf_counter()
    return pp / (t1 - t0), tg / (t2 - t1)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model")
    ap.add_argument("--binary", default=os.path.join(ROOT, "target", "release", "tensorfold"))
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--pp", type=int, default=512)
    ap.add_argument("--tg", type=int, default=128)
    a = ap.parse_args()
    model = a.model or default_model()
    load0 = os.getloadavg()[0]
    print(f"load average before: {load0:.2f} ({os.cpu_count()} CPUs)", flush=True)
    if load0 > 0.5:
        # llama.cpp's OpenMP threads spin at barriers: with another process on the cores a
        # descheduled thread stalls the rest, so a busy machine slows it far more than
        # tensorfold and the ratios are meaningless (seen: ~40 pp512 / ~5 tg128 at load 6).
        print("WARNING: the machine is busy; take the receipt on a quiet machine", flush=True)
    from llama_cpp import Llama, __version__ as lcpp_version
    n_ctx = max(1024, a.pp + a.tg + 8)
    llm = Llama(model_path=model, n_threads=a.threads, n_threads_batch=a.threads, n_ctx=n_ctx,
                n_batch=a.pp, n_ubatch=a.pp, logits_all=False, verbose=False)
    vocab = llm.n_vocab()
    res = {"tensorfold": {"pp": [], "tg": []}, "llama.cpp": {"pp": [], "tg": []}}
    for r in range(a.rounds):
        pp, tg = run_tensorfold(a.binary, model, a.pp, a.tg, a.threads)
        res["tensorfold"]["pp"].append(pp)
        res["tensorfold"]["tg"].append(tg)
        print(f"round {r} A tensorfold  pp{a.pp} {pp:8.1f} tok/s  tg{a.tg} {tg:7.1f} tok/s", flush=True)
        pp, tg = run_llamacpp(llm, vocab, a.pp, a.tg)
        res["llama.cpp"]["pp"].append(pp)
        res["llama.cpp"]["tg"].append(tg)
        print(f"round {r} B llama.cpp   pp{a.pp} {pp:8.1f} tok/s  tg{a.tg} {tg:7.1f} tok/s", flush=True)
    med = {k: {m: statistics.median(v[m]) for m in v} for k, v in res.items()}
    print(f"load average after: {os.getloadavg()[0]:.2f}", flush=True)
    print(f"\nmedians over {a.rounds} rounds ({a.threads} threads, {os.path.basename(model)}, "
          f"llama-cpp-python {lcpp_version}):")
    for k in med:
        print(f"  {k:11s} pp{a.pp} {med[k]['pp']:8.1f} tok/s  tg{a.tg} {med[k]['tg']:7.1f} tok/s")
    rp = med["tensorfold"]["pp"] / med["llama.cpp"]["pp"]
    rt = med["tensorfold"]["tg"] / med["llama.cpp"]["tg"]
    print(f"  ratio tensorfold/llama.cpp: prompt {rp:.2f}x (target >= 0.8), decode {rt:.2f}x (target >= 1.0)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
