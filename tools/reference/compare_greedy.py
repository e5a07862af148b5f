#!/usr/bin/env python3
"""Compare an engine's greedy generations with a reference from hf_greedy.py.

Role: the verdict of the greedy fidelity check. For each prompt it reports "equal", or the first
position where the token sequences differ and whether that difference is a near-tie: the
engine's token and the reference's token are the reference's top-2 contenders at that step and
their logits are within one bf16 step (refcommon.near_tie) on the reference side; when the
engine's JSON carries step logits, the same must hold on the engine's side (its top-2 are the
same two tokens, within one bf16 step). Only the first difference is judged: after it the two
sides continue from different contexts.

Exit status: 0 when every prompt is equal or differs first at a near-tie; 1 on any other
difference (a wide-margin flip, a token outside the top-2, different prompt ids, a different
length with no differing token, a different prompt count); 2 on unreadable input.

Engine JSON: {prompts:[{tokens:[...], prompt_ids: optional [...], steps: optional
[{top:[[id, logit],[id, logit]]}]}]}, prompts in the reference's order.

--self-test plants controls and fails unless each is judged as it must be: an identical run
passes, a flipped token at a wide margin fails, a near-tie passes, a near-tie on the reference
side but a wide margin on the engine side fails, a token outside the top-2 fails, a truncated
run fails, and different prompt ids fail. When the committed fixture exists it also flips a
wide-margin step of the real reference and demands a failure.

Alternative rejected: comparing decoded text: tokenization ambiguities would hide or invent
differences; ids are what the engine produces.
"""

from __future__ import annotations

import argparse
import copy
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import refcommon as rc

FIXTURE = rc.REPO / "tests" / "fixtures" / "reference" / "greedy_gguf_bf16.json"


def side_tie(step: dict | None, a: int, b: int) -> tuple[bool, str]:
    """Whether tokens a and b are this side's top-2 and within one bf16 step; and why not."""
    if step is None or "top" not in step or len(step["top"]) < 2:
        return False, "no top-2 logits recorded"
    (i1, l1), (i2, l2) = step["top"][0], step["top"][1]
    if {int(i1), int(i2)} != {a, b}:
        return False, f"top-2 are {int(i1)}, {int(i2)}, not {a}, {b}"
    if rc.near_tie(float(l1), float(l2)):
        return (
            True,
            f"{l1} vs {l2}, gap {abs(l1 - l2):.4g} <= {rc.bf16_step(max(abs(l1), abs(l2)))}",
        )
    return (
        False,
        f"{l1} vs {l2}, gap {abs(l1 - l2):.4g} > bf16 step {rc.bf16_step(max(abs(l1), abs(l2)))}",
    )


def judge_prompt(ref: dict, eng: dict) -> tuple[bool, str]:
    """(ok, message) for one prompt."""
    if "prompt_ids" in eng and [int(t) for t in eng["prompt_ids"]] != ref["prompt_ids"]:
        return False, "prompt ids differ (tokenizer or chat template mismatch)"
    rt, et = ref["tokens"], [int(t) for t in eng["tokens"]]
    j = next((k for k in range(min(len(rt), len(et))) if rt[k] != et[k]), None)
    if j is None:
        if len(rt) == len(et):
            return True, f"equal ({len(rt)} tokens)"
        return False, (
            f"lengths differ with no differing token: reference {len(rt)}, engine "
            f"{len(et)} (same max tokens and stop ids?)"
        )
    a, b = rt[j], et[j]
    ok_ref, why_ref = side_tie(ref["steps"][j] if j < len(ref["steps"]) else None, a, b)
    msg = f"first difference at step {j}: reference {a}, engine {b}; reference side: {why_ref}"
    esteps = eng.get("steps")
    if esteps is None:
        return ok_ref, msg + (
            "; NEAR-TIE (reference side only: engine gave no logits)"
            if ok_ref
            else "; NOT a near-tie"
        )
    ok_eng, why_eng = side_tie(esteps[j] if j < len(esteps) else None, a, b)
    msg += f"; engine side: {why_eng}"
    return ok_ref and ok_eng, msg + (
        "; NEAR-TIE on both sides" if ok_ref and ok_eng else "; NOT a near-tie"
    )


def judge(ref: dict, eng: dict) -> tuple[bool, list[str]]:
    rp, ep = ref["prompts"], eng["prompts"]
    if len(rp) != len(ep):
        return False, [f"prompt count differs: reference {len(rp)}, engine {len(ep)}"]
    lines, ok_all = [], True
    for i, (r, e) in enumerate(zip(rp, ep)):
        ok, msg = judge_prompt(r, e)
        ok_all &= ok
        q = r.get("messages", [{}])[-1].get("content", "")
        lines.append(f"prompt {i} {q!r}: {'ok' if ok else 'FAIL'}: {msg}")
    return ok_all, lines


def synthetic_reference() -> dict:
    """Two prompts; prompt 0 step 2 is an exact-adjacent bf16 near-tie, the rest are wide."""
    steps = [
        {"top": [[10, 20.0], [11, 15.0]]},
        {"top": [[12, 18.0], [13, 10.0]]},
        {"top": [[14, 16.25], [15, 16.125]]},
        {"top": [[2, 30.0], [16, 12.0]]},
    ]
    steps2 = [{"top": [[20, 9.0], [21, 3.0]]}, {"top": [[2, 25.0], [22, 1.0]]}]
    return {
        "prompts": [
            {
                "messages": [{"role": "user", "content": "a"}],
                "prompt_ids": [1, 2, 3],
                "tokens": [10, 12, 14, 2],
                "steps": steps,
            },
            {
                "messages": [{"role": "user", "content": "b"}],
                "prompt_ids": [1, 4],
                "tokens": [20, 2],
                "steps": steps2,
            },
        ]
    }


def engine_from(ref: dict, with_steps: bool) -> dict:
    out = {"prompts": []}
    for p in ref["prompts"]:
        e = {"tokens": list(p["tokens"]), "prompt_ids": list(p["prompt_ids"])}
        if with_steps:
            e["steps"] = copy.deepcopy(p["steps"])
        out["prompts"].append(e)
    return out


def planted_cases(ref: dict) -> list[tuple[str, dict, bool]]:
    """(name, engine json, expected ok) controls against the synthetic reference."""
    cases = [
        ("identical, no logits", engine_from(ref, False), True),
        ("identical, with logits", engine_from(ref, True), True),
    ]
    e = engine_from(ref, False)
    e["prompts"][0]["tokens"][1] = 13  # second contender at a margin of 8.0
    cases.append(("wide-margin flip", e, False))
    e = engine_from(ref, False)
    e["prompts"][0]["tokens"][2:] = [15, 2]  # second contender, 0.125 below at 16.25
    cases.append(("near-tie flip, reference side", e, True))
    e = engine_from(ref, True)
    e["prompts"][0]["tokens"][2:] = [15, 2]
    e["prompts"][0]["steps"][2]["top"] = [[15, 16.25], [14, 16.125]]
    cases.append(("near-tie flip, both sides", e, True))
    e = engine_from(ref, True)
    e["prompts"][0]["tokens"][2:] = [15, 2]
    e["prompts"][0]["steps"][2]["top"] = [[15, 17.0], [14, 16.125]]
    cases.append(("near-tie on reference, wide on engine", e, False))
    e = engine_from(ref, False)
    e["prompts"][1]["tokens"][0] = 99  # not among the reference's top-2
    cases.append(("token outside top-2", e, False))
    e = engine_from(ref, False)
    e["prompts"][0]["tokens"] = e["prompts"][0]["tokens"][:3]
    cases.append(("truncated run", e, False))
    e = engine_from(ref, False)
    e["prompts"][1]["prompt_ids"] = [1, 5]
    cases.append(("different prompt ids", e, False))
    e = engine_from(ref, False)
    e["prompts"].pop()
    cases.append(("missing prompt", e, False))
    return cases


def fixture_case() -> tuple[str, dict, dict, bool] | None:
    """Flip the real fixture's widest-margin step to its runner-up: must fail."""
    if not FIXTURE.is_file():
        return None
    ref = json.loads(FIXTURE.read_text())

    def margin(ps: tuple[int, int]) -> float:
        top = ref["prompts"][ps[0]]["steps"][ps[1]]["top"]
        return top[0][1] - top[1][1]

    pairs = [(p, s) for p, pr in enumerate(ref["prompts"]) for s in range(len(pr["steps"]))]
    best = max(pairs, key=margin)
    e = engine_from(ref, False)
    p, s = best
    e["prompts"][p]["tokens"][s] = ref["prompts"][p]["steps"][s]["top"][1][0]
    e["prompts"][p]["tokens"] = e["prompts"][p]["tokens"][: s + 1]
    return f"real fixture: widest-margin flip at prompt {p} step {s}", ref, e, False


def self_test() -> int:
    checks = [
        (rc.bf16_step(16.0), 0.125),
        (rc.bf16_step(15.99), 0.0625),
        (rc.bf16_step(-1.0), 2**-7),
        (rc.near_tie(16.0, 15.9375), True),
        (rc.near_tie(16.25, 16.0), False),
        (rc.near_tie(16.125, 16.0), True),
        (rc.near_tie(1.0, 1.0), True),
        (rc.near_tie(float("nan"), 1.0), False),
    ]
    failures = [
        f"unit check {i}: got {got}, want {want}"
        for i, (got, want) in enumerate(checks)
        if got != want
    ]
    ref = synthetic_reference()
    cases = [(n, ref, e, want) for n, e, want in planted_cases(ref)]
    real = fixture_case()
    if real is not None:
        cases.append(real)
    for name, r, e, want in cases:
        ok, lines = judge(r, e)
        status = "as required" if ok == want else "WRONG"
        print(
            f"[{status}] {name}: judged {'pass' if ok else 'fail'}, required "
            f"{'pass' if want else 'fail'}"
        )
        if ok != want:
            failures.append(name)
            for line in lines:
                print("    " + line)
    print(
        f"self-test: {len(checks) + len(cases) - len(failures)} passed, {len(failures)} failed"
        + ("" if real else " (fixture absent: real-fixture control skipped)")
    )
    return 1 if failures else 0


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("reference", nargs="?", type=Path)
    ap.add_argument("engine", nargs="?", type=Path)
    ap.add_argument("--self-test", action="store_true")
    args = ap.parse_args()
    if args.self_test:
        return self_test()
    if args.reference is None or args.engine is None:
        ap.error("need REFERENCE and ENGINE json files (or --self-test)")
    try:
        ref = json.loads(args.reference.read_text())
        eng = json.loads(args.engine.read_text())
        ok, lines = judge(ref, eng)
    except (OSError, ValueError, KeyError, TypeError, IndexError) as err:
        print(
            f"error: cannot compare {args.reference} with {args.engine}: {err!r}", file=sys.stderr
        )
        return 2
    for line in lines:
        print(line)
    print(
        f"{'PASS' if ok else 'FAIL'}: {sum(1 for x in lines if ': ok:' in x)} of {len(lines)} "
        "prompts equal or first differing at a near-tie"
    )
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
