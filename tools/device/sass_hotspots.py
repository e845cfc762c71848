#!/usr/bin/env python3
"""Summarises an ncu SASS source page (tools/device/profile.sh with SASS=1): executed warp instructions and warp
stall samples by opcode, and the hottest straight-line stretches of code.

Usage: sass_hotspots.py sass_<tag>.csv [--top N] [--dump FROM TO]
"""
import csv
import sys
from collections import defaultdict


def load(path):
    with open(path, newline="") as f:
        rows = list(csv.reader(f))
    header_at = next(i for i, r in enumerate(rows) if r and r[0] == "Address")
    header = rows[header_at]
    col = {name: i for i, name in enumerate(header)}
    out = []
    for r in rows[header_at + 1:]:
        if len(r) < len(header):
            continue
        def num(name):
            v = r[col[name]].replace(",", "") if name in col else ""
            try:
                return float(v)
            except ValueError:
                return 0.0
        out.append({"addr": r[col["Address"]], "src": r[col["Source"]].strip(), "exec": num("Instructions Executed"),
                    "samples": num("Warp Stall Sampling (All Samples)"),
                    "stalls": {k: num(k) for k in header if k.startswith("stall_") and "Not Issued" not in k}})
    return out


def opcode(src):
    s = src.split()
    if s and s[0].startswith("@"):
        s = s[1:]
    return s[0].split(".")[0] if s else "?"


def main():
    args = sys.argv[1:]
    rows = load(args[0])
    top = int(args[args.index("--top") + 1]) if "--top" in args else 25
    if "--dump" in args:
        i = args.index("--dump")
        lo, hi = int(args[i + 1]), int(args[i + 2])
        for n, r in enumerate(rows[lo:hi], lo):
            print(f"{n:5d} {r['exec']:>12.0f} {r['samples']:>7.0f}  {r['src']}")
        return
    tot_exec = sum(r["exec"] for r in rows)
    tot_samp = sum(r["samples"] for r in rows) or 1
    print(f"instructions executed {tot_exec:.0f}, stall samples {tot_samp:.0f}")
    by_op = defaultdict(lambda: [0.0, 0.0])
    for r in rows:
        by_op[opcode(r["src"])][0] += r["exec"]
        by_op[opcode(r["src"])][1] += r["samples"]
    print("\nby opcode (executed %, samples %):")
    for op, (e, s) in sorted(by_op.items(), key=lambda kv: -kv[1][0])[:top]:
        print(f"  {op:12s} {100 * e / tot_exec:6.2f} {100 * s / tot_samp:6.2f}")
    # Stretches of 32 instructions, ranked by stall samples.
    win = 32
    spans = []
    for start in range(0, len(rows), win):
        chunk = rows[start:start + win]
        spans.append((sum(r["samples"] for r in chunk), sum(r["exec"] for r in chunk), start))
    print(f"\nhottest {win}-instruction stretches (row, samples %, executed %, first opcodes):")
    for s, e, start in sorted(spans, reverse=True)[:top]:
        ops = " ".join(opcode(r["src"]) for r in rows[start:start + 8])
        print(f"  {start:5d} {100 * s / tot_samp:6.2f} {100 * e / tot_exec:6.2f}  {ops}")


if __name__ == "__main__":
    main()
