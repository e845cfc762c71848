"""Forward benchmarks, side by side on one GPU in one run: flexjit (`flexjit bench`) against
PyTorch FlexAttention (torch.compile) and SDPA (flash, cuDNN) on the cases of
../shared/ANCHORS.md. FLOPs = 4 * B * H * Sq * Skv * D * density (unmasked pairs only).
Writes bench.json and a markdown table (results_table.md) to --out; the table is appended
to bench/RESULTS.md by whoever runs it (the GPU machine's files do not persist)."""
import argparse
import datetime
import json
import os
import subprocess
import tempfile

import numpy as np
import torch
import torch.nn.functional as F
import triton.testing as tt
from torch.nn.attention import SDPBackend, sdpa_kernel
from torch.nn.attention.flex_attention import create_block_mask, flex_attention

import torch._dynamo

torch._dynamo.config.recompile_limit = 64
torch._dynamo.config.cache_size_limit = 64
flex = torch.compile(flex_attention, dynamic=False)
dev, dt = "cuda", torch.bfloat16


def bench(fn, rep=100):
    return tt.do_bench(fn, warmup=25, rep=rep, return_mode="median")


def density_of(mm, Sq, S):
    if mm is None:
        return 1.0
    qi = torch.arange(Sq, device=dev)[:, None]
    ki = torch.arange(S, device=dev)[None, :]
    return mm(0, 0, qi, ki).float().mean().item()


def run_flexjit(flexjit, spec_args, shape, loads, sets):
    cmd = [flexjit, "bench", *spec_args, "--shape", ",".join(map(str, shape)), "--json", "--iters", "100", "--warmup", "20"]
    for k, v in loads.items():
        cmd += ["--load", f"{k}={v}"]
    for s in sets:
        cmd += ["--set", s]
    p = subprocess.run(cmd, capture_output=True, text=True)
    if p.returncode != 0:
        return {"error": (p.stderr or p.stdout).strip()[-400:]}
    return json.loads(p.stdout.strip().splitlines()[-1])


def to_npy(t, path):
    if t.dtype == torch.bfloat16:
        np.save(path, t.view(torch.int16).cpu().numpy().view(np.uint16))
    else:
        np.save(path, t.cpu().numpy())


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--flexjit", required=True)
    ap.add_argument("--out", required=True)
    ap.add_argument("--only", nargs="*", default=None)
    args = ap.parse_args()
    os.makedirs(args.out, exist_ok=True)
    tmp = tempfile.mkdtemp()
    torch.manual_seed(0)
    B, H, S, D = 4, 16, 4096, 128
    W, P = 1024, 1024
    doc = torch.sort(torch.randint(0, 12, (S,), device=dev)).values.to(torch.int32)
    to_npy(doc, f"{tmp}/doc.npy")
    slopes = torch.exp2(-8.0 * torch.arange(1, H + 1, device=dev) / H).float()
    to_npy(slopes, f"{tmp}/slope.npy")

    def causal(b, h, q, kv): return q >= kv
    def sliding(b, h, q, kv): return (q >= kv) & (q - kv <= W)
    def document(b, h, q, kv): return doc[q] == doc[kv]
    def prefix_lm(b, h, q, kv): return (kv <= P) | (q >= kv)
    def alibi(s, b, h, q, kv): return s + slopes[h] * (kv - q)
    def softcap(s, b, h, q, kv): return 30.0 * torch.tanh(s / 30.0)

    # name, B, H, S, D, torch score_mod, torch mask_mod, flexjit spec flags, loads, sets
    cases = [
        ("full", B, H, S, D, None, None, ["--name", "full"], {}, []),
        ("causal", B, H, S, D, None, causal, ["--mask", "q >= kv", "--name", "causal"], {}, []),
        ("sliding_window_1024", B, H, S, D, None, sliding, ["--mask", "q >= kv && q - kv <= 1024", "--name", "sliding"], {}, []),
        ("document_12", B, H, S, D, None, document, ["--mask", "doc[q] == doc[kv]", "--buffer", "doc: i32[Sq]", "--name", "document"],
         {"doc": f"{tmp}/doc.npy"}, []),
        ("prefix_lm_1024", B, H, S, D, None, prefix_lm, ["--mask", "kv <= 1024 || q >= kv", "--name", "prefix_lm"], {}, []),
        ("alibi_causal", B, H, S, D, alibi, causal, ["--score", "score + slope[h] * (kv - q)", "--mask", "q >= kv", "--buffer",
                                                      "slope: f32[H]", "--name", "alibi_causal"], {"slope": f"{tmp}/slope.npy"}, []),
        ("softcap30", B, H, S, D, softcap, None, ["--score", "cap * tanh(score / cap)", "--const", "cap: float = 30", "--name", "softcap"], {}, []),
    ]
    for (Bs, Hs, Ds) in [(8, 12, 64), (8, 16, 80)]:
        cases.append((f"sam_relpos_D{Ds}", Bs, Hs, S, Ds, "sam", None,
                      ["--score", "score + rel_h[b, h, q, kv // 64] + rel_w[b, h, q, kv % 64]", "--buffer", "rel_h: bf16[B, H, Sq, 64]",
                       "--buffer", "rel_w: bf16[B, H, Sq, 64]", "--name", f"sam_d{Ds}"], {}, []))
    rows = []
    for (name, b, h, s, d, score_mod, mask_mod, flags, loads, sets) in cases:
        if args.only and name not in args.only:
            continue
        torch._dynamo.reset()
        row = {"case": name, "B": b, "H": h, "S": s, "D": d}
        q, k, v = [torch.randn(b, h, s, d, device=dev, dtype=dt) for _ in range(3)]
        sm = score_mod
        if score_mod == "sam":
            rel_h = torch.randn(b, h, s, 64, device=dev, dtype=dt)
            rel_w = torch.randn(b, h, s, 64, device=dev, dtype=dt)
            def sm(sc, bb, hh, qq, kk): return sc + rel_h[bb, hh, qq, kk // 64] + rel_w[bb, hh, qq, kk % 64]
            bias_fn = lambda: F.scaled_dot_product_attention(q, k, v, attn_mask=(rel_h[:, :, :, :, None] + rel_w[:, :, :, None, :]).reshape(b, h, s, s))
            try:
                row["sdpa_bias_ms"] = bench(bias_fn, rep=50)
            except Exception as e:  # noqa: BLE001
                row["sdpa_bias_error"] = str(e)[:120]
        density = density_of(mask_mod, s, s)
        row["density"] = density
        flops = 4 * b * h * s * s * d * density
        try:
            bm = create_block_mask(mask_mod, None, None, s, s, device=dev) if mask_mod else None
            f = lambda: flex(q, k, v, score_mod=sm, block_mask=bm)
            f()
            row["flex_ms"] = bench(f)
        except Exception as e:  # noqa: BLE001
            row["flex_error"] = str(e)[:200]
        if name in ("full", "causal"):
            for backend, key in ((SDPBackend.FLASH_ATTENTION, "sdpa_flash_ms"), (SDPBackend.CUDNN_ATTENTION, "sdpa_cudnn_ms")):
                try:
                    with sdpa_kernel([backend]):
                        g = lambda: F.scaled_dot_product_attention(q, k, v, is_causal=(name == "causal"))
                        g()
                        row[key] = bench(g)
                except Exception as e:  # noqa: BLE001
                    row[key.replace("_ms", "_error")] = str(e)[:120]
        del q, k, v
        torch.cuda.empty_cache()
        ours = run_flexjit(args.flexjit, flags, [b, h, h, s, s, d], loads, sets)
        row["flexjit"] = ours
        if "ms" in ours:
            row["flexjit_ms"] = ours["ms"]
            row["flexjit_tflops"] = flops / ours["ms"] / 1e9
        for key in ("flex_ms", "sdpa_flash_ms", "sdpa_cudnn_ms", "sdpa_bias_ms"):
            if key in row:
                row[key.replace("_ms", "_tflops")] = flops / row[key] / 1e9
        print(json.dumps(row), flush=True)
        rows.append(row)
    json.dump(rows, open(f"{args.out}/bench.json", "w"), indent=1)
    gpu = torch.cuda.get_device_name()
    commit = os.environ.get("FLEXJIT_COMMIT", "unknown")
    lines = [f"\n### Forward, {datetime.date.today()}, {gpu}, commit {commit}, torch {torch.__version__}\n",
             "| case | density | flexjit ms · TFLOP/s | FlexAttention ms · TFLOP/s | flexjit / Flex speed | SDPA flash | SDPA cuDNN | notes |",
             "| --- | --- | --- | --- | --- | --- | --- | --- |"]
    def cell(r, key):
        return f"{r[key + '_ms']:.3f} · {r[key + '_tflops']:.0f}" if key + "_ms" in r else "–"
    for r in rows:
        ratio = f"{r['flex_ms'] / r['flexjit_ms']:.2f}×" if "flex_ms" in r and "flexjit_ms" in r else "–"
        note = r["flexjit"].get("error", "")[:80] if "error" in r.get("flexjit", {}) else ""
        if "sdpa_bias_ms" in r:
            note += f"SDPA + materialised bias {r['sdpa_bias_ms']:.2f} ms"
        if "flexjit" in r and "launch_us" in r["flexjit"]:
            note += f" host launch {r['flexjit']['launch_us']:.1f} µs"
        lines.append(f"| {r['case']} | {r['density']:.3f} | {cell(r, 'flexjit')} | {cell(r, 'flex')} | {ratio} | {cell(r, 'sdpa_flash')} | "
                     f"{cell(r, 'sdpa_cudnn')} | {note.strip()} |")
    table = "\n".join(lines) + "\n"
    open(f"{args.out}/results_table.md", "w").write(table)
    print(table)


if __name__ == "__main__":
    main()
