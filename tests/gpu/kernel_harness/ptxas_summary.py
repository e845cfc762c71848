#!/usr/bin/env python3
"""Summarises the ptxas -v logs of build.sh: registers and spills per kernel instantiation."""
import glob
import os
import re
import sys

out = sys.argv[1] if len(sys.argv) > 1 else os.path.join(os.path.dirname(__file__), "../../../.device/harness")
rows = []
for log in sorted(glob.glob(os.path.join(out, "ptxas_d*.log"))):
    name = arch = None
    spill = ""
    for line in open(log):
        m = re.search(r"Compiling entry function '(\S+)' for '(\w+)'", line)
        if m:
            name, arch = m.group(1), m.group(2)
            t = re.search(r"FlexForwardTraitsILi(\d+)ELi(\d+)ELi(\d+)ELi(\d+)E(\w+?)E\d+(\w+?)ILb(\d)E(?:Lb(\d)E)?", name)
            if t:
                d, bm, bn, w, el, var, chk, apx = t.groups()
                el = "bf16" if "bfloat" in el else "fp16"
                var = var.replace("Variant", "") + ("~" if apx == "1" else "")
                name = f"D{d} {bm}x{bn}x{w}w {el} {var}{' chk' if chk == '1' else ''}"
            continue
        m = re.search(r"(\d+) bytes stack frame, (\d+) bytes spill stores, (\d+) bytes spill loads", line)
        if m:
            spill = f"stack {m.group(1)} spill st {m.group(2)} ld {m.group(3)}"
            continue
        m = re.search(r"Used (\d+) registers", line)
        if m and name:
            rows.append((arch, name, int(m.group(1)), spill))
            name = None
for arch, name, regs, spill in rows:
    print(f"{arch:7s} {name:40s} {regs:4d} regs  {spill}")
