"""Shared helpers for the Hugging Face reference tools in tools/reference/.

Role: resolve the test model's path the way scripts/fetch-model.sh does, load a model and its
tokenizer with transformers (an HF checkpoint directory, or a GGUF file that transformers
dequantizes), define the bf16 step ("one bf16 ulp at that magnitude") that every near-tie test
uses, and record the library versions a reference was made with.

Invariants:
- A GGUF is loaded with transformers' own loader. For llama, transformers 5.x still routes it
  through the legacy path (modeling_gguf_pytorch_utils.load_gguf_checkpoint): gguf-py dequantizes
  each tensor to float32 with numpy, the llama q/k rows are un-permuted, then the tensor is cast
  to the requested dtype once. The newer "packed" GGUF path (GgufLinear) only covers a few
  architectures; `load_model` checks that no packed module ended up in the model, so a future
  transformers that keeps weights packed is refused rather than silently used.
- The near-tie test is symmetric and uses the bf16 ulp of the larger magnitude of the two
  logits, whatever dtype the logits were computed in.
- CPU only; the thread count is fixed so runs are reproducible on one machine.

Alternatives rejected: `model.generate` (its logits processors and generation config from the
GGUF are implicit; the explicit loop in hf_greedy.py is easier to audit), and `torch.topk` for the
top-2 (its order among equal values is unspecified; argmax takes the lowest id among equals,
which is the rule the engine is expected to follow too).
"""

from __future__ import annotations

import math
import os
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
GGUF_NAME = "SmolLM2-135M-Instruct.Q4_1.gguf"

DTYPES = ("bf16", "float32", "float64")


def cache_dir() -> Path:
    """TENSORFOLD_CACHE, else <repo>/.cache (the same rule as scripts/fetch-model.sh)."""
    env = os.environ.get("TENSORFOLD_CACHE")
    return Path(env) if env else REPO / ".cache"


def default_model() -> Path:
    """The test model's GGUF path; exits with a message naming fetch-model.sh if absent."""
    path = cache_dir() / "models" / GGUF_NAME
    if not path.is_file():
        sys.exit(f"error: test model {path} not found; run scripts/fetch-model.sh first")
    return path


def torch_dtype(name: str):
    import torch

    table = {"bf16": torch.bfloat16, "float32": torch.float32, "float64": torch.float64}
    if name not in table:
        raise ValueError(f"unknown dtype {name!r}; expected one of {DTYPES}")
    return table[name]


def bf16_step(x: float) -> float:
    """One bf16 ulp at |x|'s magnitude: 2^(floor(log2|x|) - 7); bf16 keeps 8 significant bits.

    Zero and subnormal magnitudes use the ulp of the smallest normal bf16 (2^-133)."""
    ax = abs(x)
    if not math.isfinite(ax):
        raise ValueError(f"bf16_step of a non-finite value {x}")
    if ax < 2.0**-126:
        return 2.0**-133
    _, e = math.frexp(ax)  # ax = m * 2^e, m in [0.5, 1)  =>  floor(log2 ax) = e - 1
    return math.ldexp(1.0, e - 1 - 7)


def near_tie(a: float, b: float) -> bool:
    """True when a and b are within one bf16 step (at the larger magnitude) of each other."""
    if not (math.isfinite(a) and math.isfinite(b)):
        return False
    return abs(a - b) <= bf16_step(max(abs(a), abs(b)))


def versions() -> dict:
    from importlib.metadata import PackageNotFoundError, version

    import torch
    import transformers

    out = {"torch": torch.__version__, "transformers": transformers.__version__}
    try:
        out["gguf"] = version("gguf")
    except PackageNotFoundError:  # gguf is only needed for GGUF inputs
        out["gguf"] = None
    return out


def setup_torch(threads: int) -> None:
    import torch

    torch.set_num_threads(threads)
    torch.manual_seed(0)


def _split_model_path(model: Path) -> tuple[str, dict]:
    """(directory, extra from_pretrained kwargs) for an HF dir or a .gguf file."""
    if model.is_file() and model.suffix == ".gguf":
        return str(model.parent), {"gguf_file": model.name}
    if model.is_dir():
        return str(model), {}
    raise FileNotFoundError(f"{model}: neither a .gguf file nor an HF checkpoint directory")


def load_tokenizer(model: Path):
    from transformers import AutoTokenizer

    src, extra = _split_model_path(model)
    return AutoTokenizer.from_pretrained(src, **extra)


def load_model(model: Path, dtype: str, attn: str):
    """Load a causal LM on CPU in `dtype` with attention `attn` (sdpa or eager), in eval mode."""
    from transformers import AutoModelForCausalLM

    src, extra = _split_model_path(model)
    m = AutoModelForCausalLM.from_pretrained(
        src, dtype=torch_dtype(dtype), attn_implementation=attn, **extra
    )
    m.eval()
    packed = [n for n, mod in m.named_modules() if type(mod).__name__.startswith("Gguf")]
    if packed:
        raise RuntimeError(
            f"{model}: transformers kept GGUF weights packed in {packed[:3]}...; "
            "the reference needs dequantized dense weights"
        )
    wrong = [n for n, p in m.named_parameters() if p.dtype != torch_dtype(dtype)]
    if wrong:
        raise RuntimeError(f"{model}: parameters not in {dtype}: {wrong[:5]}")
    return m


def chat_ids(tokenizer, messages: list) -> list[int]:
    """The prompt's token ids: the chat template rendered with add_generation_prompt=True."""
    ids = tokenizer.apply_chat_template(
        messages, add_generation_prompt=True, tokenize=True, return_dict=False
    )
    if hasattr(ids, "keys"):  # older/newer transformers may return a BatchEncoding
        ids = ids["input_ids"]
    return [int(t) for t in ids]


def forward(model, ids, cache, logits_to_keep: int = 0):
    """One forward pass over `ids` (a [1, n] LongTensor) extending `cache` (None to start).

    Returns (logits [1, n or logits_to_keep, vocab], cache). transformers 5.x renamed the
    forward's `past_key_values` argument (and output field) to `cache`; both are handled."""
    import inspect

    params = inspect.signature(model.forward).parameters
    name = "cache" if "cache" in params else "past_key_values"
    out = model(input_ids=ids, use_cache=True, logits_to_keep=logits_to_keep, **{name: cache})
    new = getattr(out, "cache", None)
    if new is None:
        new = getattr(out, "past_key_values", None)
    return out.logits, new


def eos_ids(model, tokenizer) -> list[int]:
    """Token ids that end a reply: the generation config's eos ids plus the tokenizer's eos."""
    ids = set()
    gen = getattr(model, "generation_config", None)
    for src in (
        getattr(gen, "eos_token_id", None),
        model.config.eos_token_id,
        tokenizer.eos_token_id,
    ):
        if src is None:
            continue
        ids.update(src if isinstance(src, (list, tuple)) else [src])
    return sorted(int(i) for i in ids)
