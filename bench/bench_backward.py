"""Forward+backward benchmarks on one GPU in one run: flexjit (`flexjit bench-backward`) against PyTorch
FlexAttention (torch.compile(flex_attention)) with its FLASH backend (FlashAttention-4 kernels,
kernel_options={"BACKEND": "FLASH"}) and its Triton one, FlashAttention-4 itself, and SDPA (cuDNN and flash), same
shapes, bf16, each where it can run the case. FLOPs of forward+backward = 3.5 * 4 * B * H * Sq * Skv * D * density
(forward 1, backward 2.5: five GEMMs against two); the backward alone 2.5 of them.
FlashAttention-4 and the FLASH backend need the flash-attn-4 package and the CuTe DSL runtime in the site directory
passed with --site (the GPU machine has no package registry: they travel as wheels).
The causal and SAM cases also run each dQ strategy (`--dq atomic`: the KV-major kernel's atomics; `--dq qmajor`:
the query-major pass), plain and deterministic, for the "dQ strategy" table.
Writes backward.json and backward_table.md (date, GPU, commit) to --out, for bench/RESULTS.md.
--no-torch skips FlexAttention and SDPA (flexjit only)."""
import json
import os
import subprocess

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel
from torch.nn.attention.flex_attention import create_block_mask, flex_attention

import torch._dynamo
from bench_common import bench, error_text, fa4_function, parse_args, table_heading

torch._dynamo.config.recompile_limit = 64
torch._dynamo.config.cache_size_limit = 64
flex = torch.compile(flex_attention, dynamic=False)
dev, dt = "cuda", torch.bfloat16

# FlexAttention's numbers for the cases it cannot run in reasonable time (bench/ANCHORS.md).
ANCHOR_NOTES = {
    "learnable_slope": "not rerun: ANCHORS.md 953.6 ms (one atomic per element into 16 addresses)",
    "learnable_bias": "not rerun: ANCHORS.md: fails, its backward needs 233,472 B of shared memory",
}


def time_flex(row, q, k, v, do, sm, mask_mod, s):
    """FlexAttention forward+backward through its FLASH and Triton backends (flex_flash_ms, flex_ms)."""
    bm = create_block_mask(mask_mod, None, None, s, s, device=dev) if mask_mod else None
    for key, opts in (("flex_flash", {"BACKEND": "FLASH"}), ("flex", None)):
        try:
            def f():
                flex(q, k, v, score_mod=sm, block_mask=bm, kernel_options=opts).backward(do)
            f()
            row[key + "_ms"] = bench(f, warmup=10, rep=50)
        except Exception as e:  # noqa: BLE001
            row[key + "_error"] = error_text(e)


def time_dense(row, q, k, v, do, fa4):
    """Causal attention without mods: FlashAttention-4 and SDPA (cuDNN, flash), forward+backward."""
    if callable(fa4):
        try:
            qt, kt, vt = (x.detach().transpose(1, 2).contiguous().requires_grad_(True) for x in (q, k, v))  # FA4 takes [B, S, H, D]
            dot = do.transpose(1, 2).contiguous()
            def g():
                out = fa4(qt, kt, vt, causal=True)
                (out[0] if isinstance(out, tuple) else out).backward(dot)
            g()
            row["fa4_ms"] = bench(g, warmup=10)
        except Exception as e:  # noqa: BLE001
            row["fa4_error"] = error_text(e)
    else:
        row["fa4_error"] = fa4
    for backend, key in ((SDPBackend.FLASH_ATTENTION, "sdpa_flash"), (SDPBackend.CUDNN_ATTENTION, "sdpa_cudnn")):
        try:
            with sdpa_kernel([backend]):
                def g():
                    F.scaled_dot_product_attention(q, k, v, is_causal=True).backward(do)
                g()
                row[key + "_ms"] = bench(g, warmup=10)
        except Exception as e:  # noqa: BLE001
            row[key + "_error"] = error_text(e)


# Cases whose rows also compare the dQ strategies.
DQ_CASES = ("causal", "sam_vitb_rel_grads")


def run_flexjit(flexjit, flags, shape, deterministic=False, dq=None):
    cmd = [flexjit, "bench-backward", *flags, "--shape", ",".join(map(str, shape)), "--json", "--iters", "30", "--warmup", "5"]
    if deterministic:
        cmd.append("--deterministic")
    if dq:
        cmd += ["--dq", dq]
    p = subprocess.run(cmd, capture_output=True, text=True)
    if p.returncode != 0:
        return {"error": (p.stderr or p.stdout).strip()[-400:]}
    return json.loads(p.stdout.strip().splitlines()[-1])


def main():
    def options(ap):
        ap.add_argument("--flex-learnable", action="store_true", help="also run FlexAttention on the learnable slope / bias cases")
        ap.add_argument("--no-torch", action="store_true", help="flexjit only: skip FlexAttention and SDPA")

    args = parse_args("Forward+backward benchmarks against FlexAttention, FlashAttention-4 and SDPA", flexjit_only=False, extra=options)
    fa4 = fa4_function()
    os.makedirs(args.out, exist_ok=True)
    torch.manual_seed(0)
    B, H, S, D = 4, 16, 4096, 128
    slopes = torch.exp2(-8.0 * torch.arange(1, H + 1, device=dev) / H).float()

    def causal(b, h, q, kv): return q >= kv
    def alibi(s, b, h, q, kv): return s + slopes[h] * (kv - q)

    causal_flags = ["--mask", "q >= kv"]
    cases = [
        ("causal", B, H, S, D, None, causal, causal_flags + ["--name", "causal"]),
        ("alibi_causal", B, H, S, D, "alibi", causal,
         ["--score", "score + slope[h] * (kv - q)", "--buffer", "slope: f32[H]", "--name", "alibi_causal"] + causal_flags),
        ("learnable_bias", B, H, S, D, "bias", causal,
         ["--score", "score + bias[h, q - kv + Skv - 1]", "--buffer", "bias: f32[H, L]", "--grad", "bias", "--name", "learnable_bias"]
         + causal_flags),
        ("learnable_slope", B, H, S, D, "slope", causal,
         ["--score", "score + slope[h] * (kv - q)", "--buffer", "slope: f32[H]", "--grad", "slope", "--name", "learnable_slope"] + causal_flags),
        ("causal_d192", B, H, S, 192, None, causal, causal_flags + ["--name", "causal_d192"]),
        ("causal_d256", B, H, S, 256, None, causal, causal_flags + ["--name", "causal_d256"]),
        ("sam_vitb_rel_grads", 8, 12, S, 64, "sam", None,
         ["--score", "score + rel_h[b, h, q, kv // 64] + rel_w[b, h, q, kv % 64]", "--buffer", "rel_h: bf16[B, H, Sq, 64]", "--buffer",
          "rel_w: bf16[B, H, Sq, 64]", "--grad", "rel_h", "--grad", "rel_w", "--name", "sam_vitb"]),
    ]
    rows = []
    for (name, b, h, s, d, kind, mask_mod, flags) in cases:
        if args.only and name not in args.only:
            continue
        torch._dynamo.reset()
        density = 1.0 if mask_mod is None else (s * (s + 1) / 2) / (s * s)
        flops = 3.5 * 4 * b * h * s * s * d * density
        row = {"case": name, "B": b, "H": h, "S": s, "D": d, "density": density}
        ours = run_flexjit(args.flexjit, flags + ["--head-dim", str(d)], [b, h, h, s, s, d])
        row["flexjit"] = ours
        if "fwd_bwd_ms" in ours:
            row["flexjit_ms"] = ours["fwd_bwd_ms"]
            row["flexjit_bwd_tflops"] = flops / 3.5 * 2.5 / ours["bwd_ms"] / 1e9
        det = run_flexjit(args.flexjit, flags + ["--head-dim", str(d)], [b, h, h, s, s, d], deterministic=True)
        row["flexjit_det"] = det
        if name in DQ_CASES:
            row["flexjit_dq"] = {}
            for dq in ("atomic", "qmajor"):
                for deterministic in (False, True):
                    key = dq + ("_det" if deterministic else "")
                    row["flexjit_dq"][key] = run_flexjit(args.flexjit, flags + ["--head-dim", str(d)], [b, h, h, s, s, d], deterministic, dq)
        if args.no_torch:
            if "flexjit_ms" in row:
                row["flexjit_tflops"] = flops / row["flexjit_ms"] / 1e9
            print(json.dumps(row), flush=True)
            rows.append(row)
            continue
        q, k, v = [torch.randn(b, h, s, d, device=dev, dtype=dt, requires_grad=True) for _ in range(3)]
        do = torch.randn(b, h, s, d, device=dev, dtype=dt)
        sm = None
        if kind == "alibi":
            sm = alibi
        elif kind == "slope":
            ls = slopes.clone().requires_grad_(True)
            def sm(sc, bb, hh, qq, kk): return sc + ls[hh] * (kk - qq)
        elif kind == "bias":
            rb = (0.05 * torch.randn(h, 2 * s - 1, device=dev)).requires_grad_(True)
            def sm(sc, bb, hh, qq, kk): return sc + rb[hh, qq - kk + s - 1]
        elif kind == "sam":
            rel_h = torch.randn(b, h, s, 64, device=dev, dtype=dt, requires_grad=True)
            rel_w = torch.randn(b, h, s, 64, device=dev, dtype=dt, requires_grad=True)
            def sm(sc, bb, hh, qq, kk): return sc + rel_h[bb, hh, qq, kk // 64] + rel_w[bb, hh, qq, kk % 64]
        if name in ANCHOR_NOTES and not args.flex_learnable:
            row["flex_note"] = ANCHOR_NOTES[name]
        else:
            time_flex(row, q, k, v, do, sm, mask_mod, s)
        if name.startswith("causal"):
            time_dense(row, q, k, v, do, fa4)
        del q, k, v, do
        torch.cuda.empty_cache()
        for key in ("flexjit_ms", "flex_ms", "flex_flash_ms", "fa4_ms", "sdpa_flash_ms", "sdpa_cudnn_ms"):
            if key in row:
                row[key.replace("_ms", "_tflops")] = flops / row[key] / 1e9
        print(json.dumps(row), flush=True)
        rows.append(row)
    json.dump(rows, open(f"{args.out}/backward.json", "w"), indent=1)
    lines = [table_heading("Forward + backward"),
             "TFLOP/s = 3.5 · 4·B·H·S²·D·density / time (the backward alone: 2.5 ·). flexjit columns: forward / backward / both (ms); "
             "deterministic = backward with fixed-point accumulation. Other columns: forward+backward ms · TFLOP/s; ratio = the "
             "FLASH backend's time over flexjit's (above 1: flexjit is faster).\n",
             "| case | flexjit fwd / bwd / fwd+bwd ms | flexjit TFLOP/s (bwd alone) | deterministic bwd ms | Flex FLASH | ratio | "
             "Flex Triton | FlashAttention-4 | cuDNN SDPA | SDPA flash |",
             "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |"]

    def cell(r, key):
        if key + "_ms" in r:
            return f"{r[key + '_ms']:.3f} · {r[key + '_tflops']:.0f}"
        if key + "_error" in r:
            return "fails: " + r[key + "_error"][:80]
        return r.get("flex_note", "–") if key == "flex" else "–"

    for r in rows:
        fj = r["flexjit"]
        ours = f"{fj['fwd_ms']:.3f} / {fj['bwd_ms']:.3f} / {fj['fwd_bwd_ms']:.3f}" if "fwd_ms" in fj else "fails: " + fj.get("error", "")[:80]
        tf = f"{r['flexjit_tflops']:.0f} ({r['flexjit_bwd_tflops']:.0f})" if "flexjit_tflops" in r else "–"
        det = f"{r['flexjit_det']['bwd_ms']:.3f}" if "bwd_ms" in r.get("flexjit_det", {}) else "–"
        ratio = f"{r['flex_flash_ms'] / r['flexjit_ms']:.2f}×" if "flex_flash_ms" in r and "flexjit_ms" in r else "–"
        lines.append(f"| {r['case']} | {ours} | {tf} | {det} | {cell(r, 'flex_flash')} | {ratio} | {cell(r, 'flex')} | {cell(r, 'fa4')} | "
                     f"{cell(r, 'sdpa_cudnn')} | {cell(r, 'sdpa_flash')} |")
    dq_rows = [r for r in rows if "flexjit_dq" in r]
    if dq_rows:
        lines += ["", "dQ strategy (`--dq`): atomic = the KV-major kernel adds dQ (fp32 atomics or bulk rows; deterministic: "
                  "fixed-point bulk rows on Hopper where they fit, else fixed-point atomics); qmajor = the query-major pass "
                  "(dq without atomics; also the row-owned buffer gradients). ms, forward / backward / both; deterministic backward.",
                  "", "| case | atomic fwd / bwd / fwd+bwd | atomic det bwd | qmajor fwd / bwd / fwd+bwd | qmajor det bwd |",
                  "| --- | --- | --- | --- | --- |"]

        def cell(res):
            return f"{res['fwd_ms']:.3f} / {res['bwd_ms']:.3f} / {res['fwd_bwd_ms']:.3f}" if "fwd_ms" in res else "fails: " + res.get("error", "")[:60]

        def det_cell(res):
            return f"{res['bwd_ms']:.3f}" if "bwd_ms" in res else "fails: " + res.get("error", "")[:60]

        for r in dq_rows:
            m = r["flexjit_dq"]
            lines.append(f"| {r['case']} | {cell(m['atomic'])} | {det_cell(m['atomic_det'])} | {cell(m['qmajor'])} | {det_cell(m['qmajor_det'])} |")
    table = "\n".join(lines) + "\n"
    open(f"{args.out}/backward_table.md", "w").write(table)
    print(table)


if __name__ == "__main__":
    main()
