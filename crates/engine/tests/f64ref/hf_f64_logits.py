#!/usr/bin/env python3
"""True float64 reference logits from Hugging Face transformers, for tests/f64ref_model.rs.

Role: an independent float64 implementation of the same model (transformers' modeling_llama on
the GGUF that gguf-py dequantizes to float32, cast once, exactly, to float64) for the engine's
float64 backend (`tf_backend::f64ref`) to match to the last f32 bit.

transformers in float64 is not float64 throughout: LlamaRMSNorm casts its input to float32,
eager attention takes the softmax in float32, and LlamaRotaryEmbedding forms the angles and
cos/sin in float32. This script replaces those three pieces, in this process only, by their
float64 formulas (the same formulas, no float32 step):
- RMSNorm: `w * (x * rsqrt(mean(x^2) + eps))` in float64;
- RoPE: `inv_freq = 1 / theta^(arange(0, d, 2) / d)` and `cos/sin(position * inv_freq)` in
  float64 (default RoPE only: the script refuses any other rope_type);
- eager attention with the softmax in float64.
`--unpatched` skips the patches, to show what they change.

History (64 tokens), from tests/fixtures/reference/greedy_gguf_bf16.json (HF's own chat template
and greedy replies): prompt 0 (France) + its reply, prompt 1's ids after the shared 20-token
system turn (a second user turn) + the first token of prompt 1's reply.

Output: tools/reference/hf_logits.py's format ("tensorfold-ref-logits/1", top-k per position,
float64 log-sum-exp and minimum), plus "patched": true|false. Logits are float64 values written
exactly (repr round-trips).

  .cache/venv-ref/bin/python crates/engine/tests/f64ref/hf_f64_logits.py \
      --out crates/engine/tests/f64ref/hf_f64_chat.json
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[3]
sys.path.insert(0, str(REPO / "tools" / "reference"))
import hf_logits  # its `rows`: top-k, lse, min
import refcommon as rc

FIXTURE = REPO / "tests" / "fixtures" / "reference" / "greedy_gguf_bf16.json"
SYSTEM_TURN = 20


def history() -> list[int]:
    prompts = json.loads(FIXTURE.read_text())["prompts"]
    france, haiku = prompts[0], prompts[1]
    assert "France" in france["messages"][0]["content"]
    assert france["prompt_ids"][:SYSTEM_TURN] == haiku["prompt_ids"][:SYSTEM_TURN]
    return (
        france["prompt_ids"]
        + france["tokens"]
        + haiku["prompt_ids"][SYSTEM_TURN:]
        + haiku["tokens"][:1]
    )


def patch_float64(model) -> None:
    """Replace the float32 steps of modeling_llama by float64 ones (see the module doc)."""
    import torch
    from transformers.models.llama import modeling_llama as ml

    cfg = model.config
    rope = getattr(cfg, "rope_parameters", None) or {}
    if rope.get("rope_type", "default") != "default":
        raise SystemExit(f"error: rope_type {rope.get('rope_type')!r}: only default is patched")
    theta = rope.get("rope_theta", getattr(cfg, "rope_theta", None))
    dim = getattr(cfg, "head_dim", None) or cfg.hidden_size // cfg.num_attention_heads
    inv64 = 1.0 / (theta ** (torch.arange(0, dim, 2, dtype=torch.float64) / dim))

    def rope_forward(x, position_ids):
        freqs = position_ids[..., None].to(torch.float64) * inv64
        emb = torch.cat((freqs, freqs), dim=-1)
        return emb.cos().to(x.dtype), emb.sin().to(x.dtype)

    rotary = model.model.rotary_emb
    rotary.forward = rope_forward

    def norm_forward(self, x):
        assert x.dtype == torch.float64
        var = x.pow(2).mean(-1, keepdim=True)
        return self.weight * (x * torch.rsqrt(var + self.variance_epsilon))

    ml.LlamaRMSNorm.forward = norm_forward

    def eager(module, query, key, value, attention_mask, scaling, dropout=0.0, **kwargs):
        k = ml.repeat_kv(key, module.num_key_value_groups)
        v = ml.repeat_kv(value, module.num_key_value_groups)
        w = torch.matmul(query, k.transpose(2, 3)) * scaling
        if attention_mask is not None:
            w = w + attention_mask
        w = torch.nn.functional.softmax(w, dim=-1, dtype=torch.float64)
        out = torch.matmul(w, v).transpose(1, 2).contiguous()
        return out, w

    ml.eager_attention_forward = eager
    if "eager" in ml.ALL_ATTENTION_FUNCTIONS:
        ml.ALL_ATTENTION_FUNCTIONS["eager"] = eager


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--k", type=int, default=8)
    ap.add_argument("--unpatched", action="store_true", help="transformers' float64 as is")
    ap.add_argument("--threads", type=int, default=2)
    args = ap.parse_args()

    import torch

    rc.setup_torch(args.threads)
    model_path = rc.default_model()
    t0 = time.perf_counter()
    model = rc.load_model(model_path, "float64", "eager")
    if not args.unpatched:
        patch_float64(model)
    ids = history()
    with torch.inference_mode():
        logits, _ = rc.forward(model, torch.tensor([ids], dtype=torch.long), None, 0)
        positions = hf_logits.rows(logits[0], args.k, 0)
    doc = {
        "format": hf_logits.FORMAT,
        "model": model_path.name,
        "dtype": "float64",
        "attn": "eager",
        "patched": not args.unpatched,
        "versions": rc.versions(),
        "k": args.k,
        "vocab_size": model.config.vocab_size,
        "tokens": ids,
        "positions": positions,
    }
    with args.out.open("w") as f:
        f.write("{\n")
        for key, val in doc.items():
            if key != "positions":
                f.write(f" {json.dumps(key)}: {json.dumps(val)},\n")
        f.write(' "positions": [\n')
        f.write(",\n".join("  " + json.dumps(p) for p in positions))
        f.write("\n ]\n}\n")
    print(
        f"{len(ids)} positions in {time.perf_counter() - t0:.1f}s; wrote {args.out}",
        file=sys.stderr,
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
