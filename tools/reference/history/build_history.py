#!/usr/bin/env python3
"""Builds the judge's fixed token history from the texts beside this script.

Role: the token history that both sides of the teacher-forced judge (DESIGN.md section 2) read,
as exact token ids, so the engine and Hugging Face transformers see identical input whatever
their tokenizers do. Three segments, concatenated in this order:

  chat   chat.json rendered with the model's chat template (transformers
         `apply_chat_template`, every turn including the assistant's, no generation prompt)
  code   code.py.txt, tokenized as plain text (no special tokens added)
  prose  prose.txt, tokenized as plain text (no special tokens added)

All three texts were written for tensorfold (no third-party text). Outputs:

  history.json        the full history (>= 1,500 positions)
  history_short.json  the first --short tokens of each segment, concatenated: the history of
                      the small committed judge fixture (tests/fixtures/judge/)

Format ("tensorfold-history/1"):
  {format, model, pre_tokenizer, versions, segments: [{name, source, start, len}], tokens: [ids]}
`segments[i].start` indexes `tokens`; the segments tile `tokens` in order. hf_logits.py
`--history` and `tensorfold judge` read `tokens`.

SmolLM2's pre-tokenizer: the model's own tokenizer.json (and llama.cpp's `smollm` pre-type,
recorded in the GGUF as tokenizer.ggml.pre) splits digits one by one (Digits, individual) before
the GPT-2 byte-level regex; transformers' GGUF converter drops the Digits step, which changes
the ids of whitespace before a digit (":\n\n1" gives 198 198 instead of 1116). When the GGUF
says `smollm`, this script restores the Digits step on the transformers tokenizer, so the ids
are the model's real tokenization (tensorfold's tokenizer gives the same ids, checked by
crates/engine/tests/judge_history.rs).

Alternative rejected: tokenizing the joined text in one call (the ids at segment boundaries
would depend on BPE merges across them; separate calls keep each segment's ids its own).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))
import refcommon as rc

FORMAT = "tensorfold-history/1"


def gguf_pre(model: Path) -> str | None:
    """The GGUF's tokenizer.ggml.pre (None for an HF directory or when absent)."""
    if model.suffix != ".gguf":
        return None
    import gguf

    field = gguf.GGUFReader(str(model)).fields.get("tokenizer.ggml.pre")
    return None if field is None else bytes(field.parts[field.data[0]]).decode()


def restore_smollm_digits(tok) -> None:
    """Digits(individual) then ByteLevel(GPT-2 regex), as SmolLM2's tokenizer.json has it."""
    from tokenizers import pre_tokenizers as pt

    tok.backend_tokenizer.pre_tokenizer = pt.Sequence(
        [
            pt.Digits(individual_digits=True),
            pt.ByteLevel(add_prefix_space=False, trim_offsets=True, use_regex=True),
        ]
    )


def segments(tok) -> list[tuple[str, str, list[int]]]:
    """(name, source file, ids) of each segment, in history order."""
    chat = json.loads((HERE / "chat.json").read_text())["messages"]
    ids = tok.apply_chat_template(chat, add_generation_prompt=False, tokenize=True, return_dict=False)
    if hasattr(ids, "keys"):
        ids = ids["input_ids"]
    out = [("chat", "chat.json", [int(t) for t in ids])]
    for name, src in (("code", "code.py.txt"), ("prose", "prose.txt")):
        text = (HERE / src).read_text()
        out.append((name, src, [int(t) for t in tok.encode(text, add_special_tokens=False)]))
    return out


def document(model: Path, segs: list[tuple[str, str, list[int]]], digits: bool) -> dict:
    tokens, table = [], []
    for name, src, ids in segs:
        table.append({"name": name, "source": src, "start": len(tokens), "len": len(ids)})
        tokens += ids
    return {
        "format": FORMAT,
        "model": model.name,
        "pre_tokenizer": "smollm: Digits(individual) + ByteLevel (restored)" if digits else "as loaded",
        "versions": rc.versions(),
        "segments": table,
        "tokens": tokens,
    }


def write(path: Path, doc: dict) -> None:
    with path.open("w") as f:
        f.write("{\n")
        for key in ("format", "model", "pre_tokenizer", "versions", "segments"):
            f.write(f" {json.dumps(key)}: {json.dumps(doc[key])},\n")
        f.write(' "tokens": [\n')
        toks = doc["tokens"]
        lines = [", ".join(str(t) for t in toks[i : i + 16]) for i in range(0, len(toks), 16)]
        f.write(",\n".join("  " + line for line in lines))
        f.write("\n ]\n}\n")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", type=Path, help="tokenizer source (default: the test model GGUF)")
    ap.add_argument("--short", type=int, default=128, help="tokens per segment in history_short")
    ap.add_argument("--out-dir", type=Path, default=HERE)
    args = ap.parse_args()

    model = args.model or rc.default_model()
    tok = rc.load_tokenizer(model)
    pre = gguf_pre(model)
    if pre == "smollm":
        restore_smollm_digits(tok)
    segs = segments(tok)
    digits = pre == "smollm"
    full = document(model, segs, digits)
    short = document(model, [(n, s, ids[: args.short]) for n, s, ids in segs], digits)
    write(args.out_dir / "history.json", full)
    write(args.out_dir / "history_short.json", short)
    for name, doc in (("history.json", full), ("history_short.json", short)):
        lens = ", ".join(f"{s['name']} {s['len']}" for s in doc["segments"])
        print(f"{name}: {len(doc['tokens'])} tokens ({lens})", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
