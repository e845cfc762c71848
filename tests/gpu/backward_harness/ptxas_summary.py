#!/usr/bin/env python3
"""Summarises the ptxas -v logs of build.sh: registers and spills per main-kernel instantiation."""
import glob
import os
import re
import sys

out = sys.argv[1] if len(sys.argv) > 1 else os.path.join(os.path.dirname(__file__), "../../../.device/backward_sm90")
KERNELS = {"0": "sm90", "1": "sm90-nodq", "2": "mma.sync"}
rows = []
for log in sorted(glob.glob(os.path.join(out, "ptxas_d*.log")), key=lambda p: int(re.search(r"d(\d+)", os.path.basename(p)).group(1))):
    name = None
    spill = ""
    for line in open(log):
        m = re.search(r"Compiling entry function '(\S+)' for '(\w+)'", line)
        if m:
            name = None
            t = re.search(r"harness_bwd_mainI18FlexBackwardTraitsILi(\d+)E\w*?(__nv_bfloat16|__half)E\d+(\w+?)ILb(\d)EELb(\d)EL10KernelKind(\d)E", m.group(1))
            if t:
                d, el, var, chk, det, kern = t.groups()
                el = "bf16" if "bfloat" in el else "fp16"
                name = f"D{d:<3} {KERNELS[kern]:9s} {el} {var.replace('Grad', ''):8s} {'det' if det == '1' else 'atomic':6s} {'chk' if chk == '1' else 'bench'}"
            continue
        m = re.search(r"(\d+) bytes stack frame, (\d+) bytes spill stores, (\d+) bytes spill loads", line)
        if m:
            spill = f"stack {m.group(1)} spill st {m.group(2)} ld {m.group(3)}"
            continue
        m = re.search(r"Used (\d+) registers", line)
        if m and name:
            rows.append((name, int(m.group(1)), spill))
            name = None
    for line in open(log):
        if "wgmma" in line and ("serialized" in line or "Performance" in line):
            rows.append(("WARNING " + os.path.basename(log), 0, line.strip()))
for name, regs, spill in rows:
    print(f"{name:48s} {regs:4d} regs  {spill}")
