"""Ragged-prefill benchmarks, side by side on one GPU in one run: flexjit (`flexjit bench --varlen`, B packed sequences
without padding) against FlashAttention-4's varlen entry (flash_attn_varlen_func: causal and windows, no other mods),
PyTorch FlexAttention (torch.compile, FLASH and Triton backends) over the packed batch as one sequence with a
document mask (the way FlexAttention users run ragged batches; the block mask is built once, outside the timing),
and PyTorch's varlen SDPA (torch.nn.attention.varlen) under its flash and cuDNN backends where this torch offers
them. Chunked prefill: fewer query rows than KV rows, the queries the last positions of each sequence (flexjit's
--queries-at-kv-end). GQA: H32 Hkv8, D128, bf16. FLOPs = 4 * B * H * Sq * Skv * D * density (unmasked pairs of one
sequence). --backward times the backward alone instead (flexjit's Kernel::backward_varlen; the baselines' autograd
backward of one forward, kept for every timed run), over the cases without a chunked prefill; FLOPs 2.5 times the
forward's.
A baseline that cannot run a case gets a dash and the reason in bench.json.

FlashAttention-4 and the FLASH backend need the flash-attn-4 package (--site, see bench_forward.py). Writes bench.json
and results_table.md to --out."""
import inspect
import json
import os
import subprocess

import torch
from torch.nn.attention import SDPBackend, sdpa_kernel
from torch.nn.attention.flex_attention import create_block_mask, flex_attention

import torch._dynamo
from bench_common import add_flexjit, bench, error_text, fa4_function, parse_args, table_heading

torch._dynamo.config.recompile_limit = 64
torch._dynamo.config.cache_size_limit = 64
flex = torch.compile(flex_attention, dynamic=False)
dev, dt = "cuda", torch.bfloat16
H, HKV, D = 32, 8, 128
BASELINES = ("fa4", "flex_flash", "flex_triton", "sdpa_varlen", "sdpa_cudnn")


def run_flexjit(flexjit, flags, b, sq, skv, sets, backward):
    cmd = [flexjit, "bench", "--varlen", *(["--backward"] if backward else []), *flags, "--shape", f"{b},{H},{HKV},{sq},{skv},{D}", "--json", "--iters", "100", "--warmup", "20"]
    for x in sets:
        cmd += ["--set", x]
    p = subprocess.run(cmd, capture_output=True, text=True)
    if p.returncode != 0:
        return {"error": (p.stderr or p.stdout).strip()[-400:]}
    return json.loads(p.stdout.strip().splitlines()[-1])


def timed(row, key, f, inputs, backward):
    """The median ms of f() into row[key + "_ms"], or with backward that of the gradients of one f() (its output, or its
    first output) with respect to inputs; a failure's reason into row[key + "_error"]."""
    try:
        if backward:
            out = f()
            out = out[0] if isinstance(out, tuple) else out
            grad = torch.randn_like(out)
            g = lambda: torch.autograd.grad(out, inputs, grad, retain_graph=True)
        else:
            g = f
        g()
        row[key + "_ms"] = bench(g)
    except Exception as e:  # noqa: BLE001
        row[key + "_error"] = error_text(e)


def time_baselines(row, b, sq, skv, causal, window, fa4, backward):
    """q [B * Sq, H, D], k, v [B * Skv, Hkv, D] packed with cu_seqlens, as flexjit takes them. With Sq < Skv the queries
    are each sequence's last Sq positions (a chunked prefill; FlashAttention-4's causal aligns them so too)."""
    tq, tk = b * sq, b * skv
    q = torch.randn(tq, H, D, device=dev, dtype=dt, requires_grad=backward)
    k, v = (torch.randn(tk, HKV, D, device=dev, dtype=dt, requires_grad=backward) for _ in range(2))
    inputs = (q, k, v)
    cu_q = torch.arange(0, tq + 1, sq, device=dev, dtype=torch.int32)
    cu = torch.arange(0, tk + 1, skv, device=dev, dtype=torch.int32)

    if callable(fa4):
        win = (window - 1, 0) if window else (None, None)
        timed(row, "fa4", lambda: fa4(q, k, v, cu_seqlens_q=cu_q, cu_seqlens_k=cu, max_seqlen_q=sq, max_seqlen_k=skv, causal=causal,
                                       window_size=win), inputs, backward)
    else:
        row["fa4_error"] = fa4

    # FlexAttention: the packed batch as one sequence of queries and one of keys, each row's sequence id its document
    # and its position within the sequence (the queries at the end of their KV) what the mask compares.
    q_seq, kv_seq = torch.arange(tq, device=dev) // sq, torch.arange(tk, device=dev) // skv
    q_pos, kv_pos = torch.arange(tq, device=dev) % sq + (skv - sq), torch.arange(tk, device=dev) % skv

    def mask(bb, hh, qq, kk):
        keep = q_seq[qq] == kv_seq[kk]
        if causal:
            keep = keep & (q_pos[qq] >= kv_pos[kk])
        if window:
            keep = keep & (q_pos[qq] - kv_pos[kk] < window)
        return keep
    try:
        bm = create_block_mask(mask, None, None, tq, tk, device=dev)
        qf, kf, vf = (x.transpose(0, 1).unsqueeze(0) for x in (q, k, v))  # [1, heads, total, D]
        for key, opts in (("flex_flash", {"BACKEND": "FLASH"}), ("flex_triton", None)):
            timed(row, key, lambda: flex(qf, kf, vf, block_mask=bm, enable_gqa=True, kernel_options=opts), inputs, backward)
    except Exception as e:  # noqa: BLE001
        row["flex_flash_error"] = row["flex_triton_error"] = error_text(e)

    # PyTorch's varlen SDPA, under its flash and its cuDNN backends. Its keywords changed across releases: causal is
    # `is_causal` in some and a window of (-1, 0) in others; GQA is `enable_gqa` where it exists.
    for backend, key in ((SDPBackend.FLASH_ATTENTION, "sdpa_varlen"), (SDPBackend.CUDNN_ATTENTION, "sdpa_cudnn")):
        try:
            from torch.nn.attention.varlen import varlen_attn  # noqa: PLC0415
            params = inspect.signature(varlen_attn).parameters
            kw, kk, vv = {}, k, v
            if "enable_gqa" in params:
                kw["enable_gqa"] = True
            else:
                kk, vv = (x.repeat_interleave(H // HKV, dim=1) for x in (k, v))
            if "window_size" in params:
                kw["window_size"] = (window - 1 if window else -1, 0 if causal else -1)
            elif window:
                raise RuntimeError("this torch's varlen_attn has no window")
            else:
                kw["is_causal"] = causal
        except Exception as e:  # noqa: BLE001
            row[key + "_error"] = error_text(e)
            continue
        with sdpa_kernel([backend]):
            timed(row, key, lambda: varlen_attn(q, kk, vv, cu_q, cu, sq, skv, **kw), inputs, backward)


def density(sq, skv, causal, window):
    qi = torch.arange(sq, device=dev)[:, None] + (skv - sq)
    ki = torch.arange(skv, device=dev)[None, :]
    keep = torch.ones(sq, skv, dtype=torch.bool, device=dev)
    if causal:
        keep &= qi >= ki
    if window:
        keep &= qi - ki < window
    return keep.float().mean().item()


def main():
    args = parse_args("Ragged-prefill benchmarks against FlashAttention-4's varlen entry, FlexAttention and varlen SDPA",
                      extra=lambda ap: ap.add_argument("--backward", action="store_true", help="time the backward alone"))
    fa4 = fa4_function("flash_attn_varlen_func")
    os.makedirs(args.out, exist_ok=True)
    torch.manual_seed(0)
    # name, sequences, query rows, KV rows, causal, window, flexjit spec flags, --set values. Fewer query rows than KV
    # rows: a chunked prefill, the queries the last positions of their sequence (--queries-at-kv-end).
    causal_flags = ["--mask", "q >= kv", "--name", "causal"]
    cases = [
        ("full_8x4096", 8, 4096, 4096, False, 0, ["--name", "full"], []),
        ("causal_8x4096", 8, 4096, 4096, True, 0, causal_flags, []),
        ("causal_64x512", 64, 512, 512, True, 0, causal_flags, []),
        ("causal_2x16384", 2, 16384, 16384, True, 0, causal_flags, []),
        ("sliding_window_1024_8x4096", 8, 4096, 4096, True, 1024, ["--mask", "q >= kv && q - kv < window", "--param", "window: int",
                                                                   "--name", "sliding"], ["window=1024"]),
        ("chunked_causal_8x512_of_4096", 8, 512, 4096, True, 0, [*causal_flags, "--queries-at-kv-end"], []),
        ("chunked_causal_32x2048_of_8192", 32, 2048, 8192, True, 0, [*causal_flags, "--queries-at-kv-end"], []),
    ]
    rows = []
    for (name, b, sq, skv, causal, window, flags, sets) in cases:
        if (args.only and name not in args.only) or (args.backward and sq != skv):
            continue
        torch._dynamo.reset()
        row = {"case": name, "B": b, "Sq": sq, "Skv": skv, "density": density(sq, skv, causal, window)}
        if not args.flexjit_only:
            time_baselines(row, b, sq, skv, causal, window, fa4, args.backward)
        torch.cuda.empty_cache()
        ours = run_flexjit(args.flexjit, flags, b, sq, skv, sets, args.backward)
        if args.backward and "bwd_ms" in ours:
            ours = {**ours, "forward_ms": ours["ms"], "ms": ours["bwd_ms"]}
        add_flexjit(row, ours, (2.5 if args.backward else 1) * 4 * b * H * sq * skv * D * row["density"], BASELINES)
        print(json.dumps(row), flush=True)
        rows.append(row)
    json.dump(rows, open(f"{args.out}/bench.json", "w"), indent=1)
    lines = [table_heading("Ragged backward" if args.backward else "Ragged prefill"),
             f"H{H} Hkv{HKV} D{D} bf16, B sequences packed " + ("(the backward alone; FLOPs 2.5 forwards)" if args.backward else
                                                                "(chunked: Sq new tokens at the end of Skv)") +
             ". ms · TFLOP/s; ratio = FlashAttention-4's time over flexjit's (above 1: flexjit is faster).\n",
             "| case | density | flexjit | FlashAttention-4 varlen | ratio | Flex FLASH | Flex Triton | SDPA varlen flash | SDPA varlen cuDNN |",
             "| --- | --- | --- | --- | --- | --- | --- | --- | --- |"]

    def cell(r, key):
        return f"{r[key + '_ms']:.3f} · {r[key + '_tflops']:.0f}" if key + "_ms" in r else "–"
    for r in rows:
        ratio = f"{r['fa4_ms'] / r['flexjit_ms']:.2f}×" if "fa4_ms" in r and "flexjit_ms" in r else "–"
        lines.append(f"| {r['case']} | {r['density']:.3f} | {cell(r, 'flexjit')} | {cell(r, 'fa4')} | {ratio} | {cell(r, 'flex_flash')} | "
                     f"{cell(r, 'flex_triton')} | {cell(r, 'sdpa_varlen')} | {cell(r, 'sdpa_cudnn')} |")
    open(f"{args.out}/results_table.md", "w").write("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
