"""Cross-checks the gallery against PyTorch's flex_attention on the same GPU and inputs:
an independent implementation. Runs `flexjit run` on .npy files and compares O and LSE."""
import argparse
import json
import os
import subprocess
import tempfile

import numpy as np
import torch
from torch.nn.attention.flex_attention import create_block_mask, flex_attention


def to_bf16_bits(t):
    return t.to(torch.bfloat16).view(torch.int16).cpu().numpy().view(np.uint16)


def from_bits(a, dtype):
    return torch.from_numpy(a.view(np.int16)).view(dtype)


def cases(S, H, dev):
    doc = torch.sort(torch.randint(0, 5, (S,), device=dev)).values.to(torch.int32)
    slope = torch.exp2(-8.0 * torch.arange(1, H + 1, device=dev) / H).float()
    bias = torch.randn(H, 2 * S - 1, device=dev)
    rel_h = torch.randn(2, H, S, 64, device=dev).to(torch.bfloat16)
    rel_w = torch.randn(2, H, S, 64, device=dev).to(torch.bfloat16)
    offset = torch.randint(0, 64, (S,), device=dev).to(torch.int32)
    nbias = torch.randn(64, device=dev)
    sb = torch.randn(H, 256, device=dev)
    dist = torch.randint(0, 256, (2, S, S), device=dev).to(torch.uint8)
    W, P, cap = 40, 70, 30.0
    return {
        "causal": (None, lambda b, h, q, kv: q >= kv, {}, []),
        "sliding_window": (None, lambda b, h, q, kv: (q >= kv) & (q - kv < W), {}, [f"window={W}"]),
        "prefix_lm": (None, lambda b, h, q, kv: (kv < P) | (q >= kv), {}, [f"prefix={P}"]),
        "document": (None, lambda b, h, q, kv: doc[q] == doc[kv], {"doc": doc}, []),
        "alibi": (lambda s, b, h, q, kv: s + slope[h] * (kv - q), None, {"slope": slope}, []),
        "alibi_causal": (lambda s, b, h, q, kv: s + slope[h] * (kv - q), lambda b, h, q, kv: q >= kv, {"slope": slope}, []),
        "softcap": (lambda s, b, h, q, kv: cap * torch.tanh(s / cap), None, {}, []),
        "relative_bias": (lambda s, b, h, q, kv: s + bias[h, q - kv + S - 1], None, {"bias": bias}, []),
        "sam_relpos": (lambda s, b, h, q, kv: s + rel_h[b, h, q, kv // 64] + rel_w[b, h, q, kv % 64], None,
                       {"rel_h": rel_h, "rel_w": rel_w}, []),
        "offset_bias": (lambda s, b, h, q, kv: s + nbias[offset[q]], None, {"bias": nbias, "offset": offset}, []),
        "graphormer": (lambda s, b, h, q, kv: s + sb[h, dist[b, q, kv].int()], None, {"sb": sb, "dist": dist}, []),
    }


def save(path, t):
    if t.dtype == torch.bfloat16:
        np.save(path, to_bf16_bits(t))
    else:
        np.save(path, t.cpu().numpy())


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--flexjit", required=True)
    ap.add_argument("--out", required=True)
    args = ap.parse_args()
    dev = "cuda"
    torch.manual_seed(0)
    B, H, S, D = 2, 4, 256, 64
    results, failed = [], 0
    tmp = tempfile.mkdtemp()
    for name, (score_mod, mask_mod, buffers, sets) in cases(S, H, dev).items():
        q, k, v = [torch.randn(B, H, S, D, device=dev).to(torch.bfloat16) for _ in range(3)]
        bm = create_block_mask(mask_mod, B, H, S, S, device=dev) if mask_mod else None
        ref, lse = flex_attention(q.float(), k.float(), v.float(), score_mod=score_mod, block_mask=bm, return_lse=True)
        for n, t in (("q", q), ("k", k), ("v", v)):
            save(f"{tmp}/{n}.npy", t)
        cmd = [args.flexjit, "run", f"examples/gallery/{name}.json", "--q", f"{tmp}/q.npy", "--k", f"{tmp}/k.npy", "--v",
               f"{tmp}/v.npy", "--out", f"{tmp}/o.npy", "--lse", f"{tmp}/lse.npy", "--device", "cuda:0"]
        for bname, t in buffers.items():
            save(f"{tmp}/{bname}.npy", t)
            cmd += ["--load", f"{bname}={tmp}/{bname}.npy"]
        for s in sets:
            cmd += ["--set", s]
        p = subprocess.run(cmd, capture_output=True, text=True)
        if p.returncode != 0:
            print(f"{name}: flexjit failed: {p.stderr.strip()}")
            failed += 1
            results.append({"case": name, "error": p.stderr.strip()})
            continue
        o = from_bits(np.load(f"{tmp}/o.npy"), torch.bfloat16).float().to(dev)
        our_lse = torch.from_numpy(np.load(f"{tmp}/lse.npy")).to(dev)
        rel = ((o - ref).norm() / ref.norm()).item()
        finite = torch.isfinite(lse)
        lse_err = (our_lse[finite] - lse[finite]).abs().max().item() if finite.any() else 0.0
        ok = rel < 2e-2 and lse_err < 5e-2 and not torch.isnan(o).any().item()
        failed += not ok
        print(f"{name:16s} rel_l2 {rel:.2e} lse_max_err {lse_err:.2e} {'ok' if ok else 'MISMATCH'}")
        results.append({"case": name, "rel_l2": rel, "lse_max_err": lse_err, "ok": ok})
    json.dump(results, open(args.out, "w"), indent=1)
    print(f"{len(results) - failed} passed, {failed} failed")
    raise SystemExit(1 if failed else 0)


if __name__ == "__main__":
    main()
