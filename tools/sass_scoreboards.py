#!/usr/bin/env python3
"""Each SASS instruction of one function with its scoreboard fields, from the control bits
nvdisasm prints in the high word of every 128-bit instruction (sm_70 and later): wb (the
scoreboard a variable-latency instruction sets when its result lands), rb (the one it sets
when its source registers may be reused) and wait (the scoreboards it waits for first).
Session 25 read the decode products' loops with it: ptxas put every global load on one
scoreboard, so the first read of any loaded register waited for all loads in flight.

usage: tools/kernel_regs.py linear.cu sm_90a --sass=/tmp/l.sass   (writes /tmp/l.sass.cubin)
       tools/sass_scoreboards.py /tmp/l.sass.cubin linear_bf16_swiglu_d8 [--all]
Without --all, only loads, stores, shuffles, mma and barriers, and instructions that wait.
"""
import os
import re
import subprocess
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from kernel_regs import nvdisasm  # noqa: E402

KEEP = ("LDG", "STG", "LDS", "STS", "LDGSTS", "SHFL", "HMMA", "HGMMA", "BAR", "DEPBAR", "SYNCS")


def main() -> int:
    args = [a for a in sys.argv[1:] if a != "--all"]
    if len(args) != 2:
        print(__doc__)
        return 2
    cubin, fn = args
    text = subprocess.run([nvdisasm(), "-hex", cubin], capture_output=True, text=True,
                          check=True).stdout.splitlines()
    inside, prev = False, None
    for line in text:
        if line.strip() == f".text.{fn}:":
            inside = True
            continue
        if inside and line.strip().startswith(".text."):
            break
        if not inside:
            continue
        m = re.search(r"/\*([0-9a-f]{4,})\*/\s+(.*?);\s+/\* 0x[0-9a-f]+ \*/", line)
        if m:
            prev = (m.group(1), m.group(2))
            continue
        m = re.search(r"/\* (0x[0-9a-f]+) \*/", line)
        if not (m and prev):
            continue
        hi = int(m.group(1), 16)
        wb, rb, wait = (hi >> 46) & 7, (hi >> 49) & 7, (hi >> 52) & 0x3F
        addr, ins = prev
        prev = None
        if "--all" in sys.argv or wait or any(k in ins for k in KEEP):
            w = "".join(str(b) for b in range(6) if wait >> b & 1) or "-"
            print(f"{addr} wb={'-' if wb == 7 else wb} rb={'-' if rb == 7 else rb} "
                  f"wait={w:6s} {ins}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
