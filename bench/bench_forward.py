"""Forward benchmarks, side by side on one GPU in one run: flexjit (`flexjit bench`) against PyTorch FlexAttention
(torch.compile) with its FLASH backend (FlashAttention-4 kernels, kernel_options={"BACKEND": "FLASH"}) and its Triton
backend, FlashAttention-4 itself (no mods), cuDNN SDPA and SDPA flash, on the cases of issue 31 and ANCHORS.md.
FLOPs = 4 * B * H * Sq * Skv * D * density (unmasked pairs only). Every baseline that cannot run a case (FA4 and SDPA
have no mods; a backend may reject a captured buffer) gets a dash and the reason in bench.json.

FlashAttention-4 and the FLASH backend need the flash-attn-4 package and the CuTe DSL runtime, installed into the
site directory passed with --site (the GPU machine has no package registry: they travel as wheels). Writes bench.json and results_table.md to --out."""
import json
import os
import subprocess
import tempfile

import numpy as np
import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel
from torch.nn.attention.flex_attention import create_block_mask, flex_attention

import torch._dynamo
from bench_common import add_flexjit, bench, error_text, fa4_function, parse_args, table_heading

torch._dynamo.config.recompile_limit = 64
torch._dynamo.config.cache_size_limit = 64
flex = torch.compile(flex_attention, dynamic=False)
dev, dt = "cuda", torch.bfloat16
BASELINES = ("flex_flash", "flex_triton", "fa4", "sdpa_cudnn", "sdpa_flash")




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




def time_baselines(row, q, k, v, sm, mask_mod, causal_only, fa4):
    """Times every baseline that can run the case; records the error of those that cannot."""
    s = q.shape[2]
    bm = None
    if mask_mod is not None:
        bm = create_block_mask(mask_mod, None, None, s, s, device=dev)
    for key, opts in (("flex_flash", {"BACKEND": "FLASH"}), ("flex_triton", None)):
        try:
            f = lambda: flex(q, k, v, score_mod=sm, block_mask=bm, kernel_options=opts)
            f()
            row[key + "_ms"] = bench(f)
        except Exception as e:  # noqa: BLE001
            row[key + "_error"] = error_text(e)
    if sm is not None or (mask_mod is not None and not causal_only):
        return
    causal = mask_mod is not None
    if callable(fa4):
        try:
            qt, kt, vt = (x.transpose(1, 2).contiguous() for x in (q, k, v))  # FA4 takes [B, S, H, D]
            g = lambda: fa4(qt, kt, vt, causal=causal)
            g()
            row["fa4_ms"] = bench(g)
        except Exception as e:  # noqa: BLE001
            row["fa4_error"] = error_text(e)
    else:
        row["fa4_error"] = fa4
    for backend, key in ((SDPBackend.CUDNN_ATTENTION, "sdpa_cudnn"), (SDPBackend.FLASH_ATTENTION, "sdpa_flash")):
        try:
            with sdpa_kernel([backend]):
                g = lambda: F.scaled_dot_product_attention(q, k, v, is_causal=causal)
                g()
                row[key + "_ms"] = bench(g)
        except Exception as e:  # noqa: BLE001
            row[key + "_error"] = error_text(e)


def main():
    args = parse_args("Forward benchmarks against FlexAttention, FlashAttention-4 and SDPA")
    fa4 = fa4_function()
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
    def sinks_window(b, h, q, kv): return (kv < 4) | ((q >= kv) & (q - kv <= W))
    def alibi(s, b, h, q, kv): return s + slopes[h] * (kv - q)
    def softcap(s, b, h, q, kv): return 30.0 * torch.tanh(s / 30.0)

    softcap_flags = ["--score", "cap * tanh(score / cap)"]
    # name, B, H, S, D, torch score_mod, torch mask_mod, flexjit spec flags, loads, sets
    cases = [
        ("full", B, H, S, D, None, None, ["--name", "full"], {}, []),
        ("causal", B, H, S, D, None, causal, ["--mask", "q >= kv", "--name", "causal"], {}, []),
        ("alibi_causal", B, H, S, D, alibi, causal, ["--score", "score + slope[h] * (kv - q)", "--mask", "q >= kv", "--buffer",
                                                      "slope: f32[H]", "--name", "alibi_causal"], {"slope": f"{tmp}/slope.npy"}, []),
        ("softcap30", B, H, S, D, softcap, None, [*softcap_flags, "--const", "cap: float = 30", "--name", "softcap"], {}, []),
        ("softcap_runtime_cap", B, H, S, D, softcap, None, [*softcap_flags, "--param", "cap: float", "--name", "softcap_rt"], {},
         ["cap=30"]),
        ("document_12", B, H, S, D, None, document, ["--mask", "doc[q] == doc[kv]", "--buffer", "doc: i32[Sq]", "--name", "document"],
         {"doc": f"{tmp}/doc.npy"}, []),
        ("sliding_window_1024", B, H, S, D, None, sliding, ["--mask", "q >= kv && q - kv <= 1024", "--name", "sliding"], {}, []),
        ("prefix_lm_1024", B, H, S, D, None, prefix_lm, ["--mask", "kv <= 1024 || q >= kv", "--name", "prefix_lm"], {}, []),
        # StreamingLLM's mask: 4 attention sinks and a sliding window.
        ("sinks4_window_1024", B, H, S, D, None, sinks_window, ["--mask", "kv < 4 || (q >= kv && q - kv <= 1024)", "--name", "sinks_window"],
         {}, []),
        ("sinks4_window_1024_D64", 8, 12, S, 64, None, sinks_window, ["--mask", "kv < 4 || (q >= kv && q - kv <= 1024)", "--name",
                                                                        "sinks_window_d64"], {}, []),
    ]
    for (Bs, Hs, Ds) in [(8, 12, 64), (8, 16, 80)]:
        cases.append((f"sam_relpos_D{Ds}", Bs, Hs, S, Ds, "sam", None,
                      ["--score", "score + rel_h[b, h, q, kv // 64] + rel_w[b, h, q, kv % 64]", "--buffer", "rel_h: bf16[B, H, Sq, 64]",
                       "--buffer", "rel_w: bf16[B, H, Sq, 64]", "--name", f"sam_d{Ds}"], {}, []))
    # The window width as a runtime int parameter (the drop-in's captured int once it changes): flexjit compiles the
    # value in (compiler/specialize.h); FlexAttention sees the same Python int.
    cases.append(("sam_relpos_D64_runtime_W", 8, 12, S, 64, "sam", None,
                  ["--score", "score + rel_h[b, h, q, kv // W] + rel_w[b, h, q, kv % W]", "--buffer", "rel_h: bf16[B, H, Sq, 64]",
                   "--buffer", "rel_w: bf16[B, H, Sq, 64]", "--param", "W: int", "--name", "sam_d64_runtime_w"], {}, ["W=64"]))
    for (Bs, Hs, Ds) in [(8, 12, 64), (4, 16, 80), (4, 16, 96), (4, 16, 192), (4, 16, 256)]:
        cases.append((f"full_D{Ds}", Bs, Hs, S, Ds, None, None, ["--name", f"full_d{Ds}"], {}, []))
    cases.append(("causal_D64", 8, 12, S, 64, None, causal, ["--mask", "q >= kv", "--name", "causal_d64"], {}, []))
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
        density = density_of(mask_mod, s, s)
        row["density"] = density
        flops = 4 * b * h * s * s * d * density
        if not args.flexjit_only:
            time_baselines(row, q, k, v, sm, mask_mod, mask_mod is causal, fa4)
        del q, k, v
        torch.cuda.empty_cache()
        ours = run_flexjit(args.flexjit, flags, [b, h, h, s, s, d], loads, sets)
        add_flexjit(row, ours, flops, BASELINES)
        print(json.dumps(row), flush=True)
        rows.append(row)
    json.dump(rows, open(f"{args.out}/bench.json", "w"), indent=1)
    lines = [table_heading("Forward"),
             "ms · TFLOP/s; ratio = the FLASH backend's time over flexjit's (above 1: flexjit is faster).\n",
             "| case | density | flexjit | Flex FLASH | ratio | Flex Triton | FlashAttention-4 | cuDNN SDPA | SDPA flash | host launch |",
             "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |"]

    def cell(r, key):
        return f"{r[key + '_ms']:.3f} · {r[key + '_tflops']:.0f}" if key + "_ms" in r else "–"
    for r in rows:
        ratio = f"{r['flex_flash_ms'] / r['flexjit_ms']:.2f}×" if "flex_flash_ms" in r and "flexjit_ms" in r else "–"
        launch = f"{r['flexjit']['launch_us']:.1f} µs" if "launch_us" in r.get("flexjit", {}) else "–"
        if "error" in r.get("flexjit", {}):
            launch = "flexjit error: " + r["flexjit"]["error"][:80]
        lines.append(f"| {r['case']} (B{r['B']} H{r['H']} D{r['D']}) | {r['density']:.3f} | {cell(r, 'flexjit')} | {cell(r, 'flex_flash')} | "
                     f"{ratio} | {cell(r, 'flex_triton')} | {cell(r, 'fa4')} | {cell(r, 'sdpa_cudnn')} | {cell(r, 'sdpa_flash')} | {launch} |")
    table = "\n".join(lines) + "\n"
    open(f"{args.out}/results_table.md", "w").write(table)
    print(table)


if __name__ == "__main__":
    main()
