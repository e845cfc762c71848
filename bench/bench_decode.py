"""Decode benchmarks, side by side on one GPU in one run: flexjit (`flexjit bench --decode`) against
FlexDecoding (torch.compile(flex_attention) with one query row) and SDPA flash, on the decode cases of
bench/ANCHORS.md: B8, 32 query heads / 8 KV heads, D128, bf16, one query token. Every timing flushes L2
first (triton's do_bench; flexjit bench --decode does the same). Bytes = K and V read once. The e4m3 / e5m2 rows
time flexjit over an FP8 cache (no FP8 KV path in FlexDecoding or SDPA: compare with the bf16 rows).
Writes decode.json and decode_table.md (rows `decode ...` and `paged ...`, with date, GPU and commit) to --out."""
import datetime
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
from bench_common import bench, parse_args

torch._dynamo.config.recompile_limit = 64
torch._dynamo.config.cache_size_limit = 64
flex = torch.compile(flex_attention, dynamic=False)
dev, dt = "cuda", torch.bfloat16
B, H, HKV, D = 8, 32, 8, 128


def run_flexjit(flexjit, flags, L, page_size, loads, sets, kv="bf16"):
    cmd = [flexjit, "bench", *flags, "--decode", "--shape", f"{B},{H},{HKV},1,{L},{D}", "--page-size", str(page_size), "--json",
           "--iters", "100", "--warmup", "20", "--kv-dtype", kv]
    for k, v in loads.items():
        cmd += ["--load", f"{k}={v}"]
    for s in sets:
        cmd += ["--set", s]
    p = subprocess.run(cmd, capture_output=True, text=True)
    if p.returncode != 0:
        return {"error": (p.stderr or p.stdout).strip()[-400:]}
    return json.loads(p.stdout.strip().splitlines()[-1])


def torch_times(L, score_mod, mask_mod, plain):
    q = torch.randn(B, H, 1, D, device=dev, dtype=dt)
    k = torch.randn(B, HKV, L, D, device=dev, dtype=dt)
    v = torch.randn(B, HKV, L, D, device=dev, dtype=dt)
    out = {}
    try:
        bm = create_block_mask(mask_mod, None, None, 1, L, device=dev) if mask_mod else None
        flex(q, k, v, score_mod=score_mod, block_mask=bm, enable_gqa=True)
        out["flexdecoding_ms"] = bench(lambda: flex(q, k, v, score_mod=score_mod, block_mask=bm, enable_gqa=True))
    except Exception as e:  # noqa: BLE001 - report and go on
        out["flexdecoding_error"] = str(e)[:200]
    if plain:
        try:
            with sdpa_kernel(SDPBackend.FLASH_ATTENTION):
                kk = k.repeat_interleave(H // HKV, dim=1)
                vv = v.repeat_interleave(H // HKV, dim=1)
                F.scaled_dot_product_attention(q, kk, vv)
                out["sdpa_flash_ms"] = bench(lambda: F.scaled_dot_product_attention(q, kk, vv))
        except Exception as e:  # noqa: BLE001
            out["sdpa_error"] = str(e)[:200]
    del q, k, v
    torch.cuda.empty_cache()
    return out


def main():
    args = parse_args("Decode benchmarks against FlexDecoding and SDPA", baselines=False, flexjit_only=False,
                      extra=lambda ap: ap.add_argument("--no-torch", action="store_true", help="flexjit rows only"))
    os.makedirs(args.out, exist_ok=True)
    tmp = tempfile.mkdtemp()
    slopes = torch.exp2(-8.0 * torch.arange(1, H + 1) / H).float()
    np.save(f"{tmp}/slope.npy", slopes.numpy())
    slopes_dev = slopes.to(dev)
    W = 1024

    def alibi(s, b, h, q, kv): return s + slopes_dev[h] * (kv - q)
    def softcap(s, b, h, q, kv): return 30.0 * torch.tanh(s / 30.0)

    plain = ["--name", "plain"]
    alibi_f = ["--score", "score + slope[h] * (kv - q)", "--buffer", "slope: f32[H]", "--name", "alibi"]
    softcap_f = ["--score", "cap * tanh(score / cap)", "--const", "cap: float = 30", "--name", "softcap"]
    window_f = ["--mask", "Skv - 1 - kv < 1024", "--name", "window"]
    # row name, KV length, page size, flexjit flags, loads, torch score_mod, torch mask_mod factory, SDPA too
    cases = []
    for L in (8192, 32768):
        cases += [(f"decode {L}", L, 0, plain, {}, None, None, True),
                  (f"paged ps16 {L}", L, 16, plain, {}, None, None, False),
                  (f"decode alibi {L}", L, 0, alibi_f, {"slope": f"{tmp}/slope.npy"}, alibi, None, False),
                  (f"decode softcap {L}", L, 0, softcap_f, {}, softcap, None, False)]
    cases += [(f"paged ps{ps} 32768", 32768, ps, plain, {}, None, None, False) for ps in (1, 64, 256)]
    cases += [("paged ps16 window 1024 over 32768", 32768, 16, window_f, {}, None, lambda L: (lambda b, h, q, kv: (L - 1 - kv) < W), False)]
    # Masks whose kept tiles are not one range: attention sinks + a window (StreamingLLM), and documents of 2048
    # positions (the current one included) over a paged cache. FlexDecoding's query row is q_idx 0: its masks use L - 1.
    sinks_f = ["--mask", "kv < 4 || q - kv < 1024", "--name", "sinks_window"]
    doc_f = ["--mask", "doc[b, kv] == doc[b, q]", "--buffer", "doc: i32[B, Skv]", "--name", "document"]
    doc = (torch.arange(32768, dtype=torch.int32) // 2048).expand(B, 32768).contiguous()
    np.save(f"{tmp}/doc.npy", doc.numpy())
    doc_dev = doc.to(dev)
    cases += [("paged ps16 sinks 4 + window 1024 over 32768", 32768, 16, sinks_f, {}, None,
               lambda L: (lambda b, h, q, kv: (kv < 4) | ((L - 1 - kv) < W)), False),
              ("paged ps16 document (current 2048) over 32768", 32768, 16, doc_f, {"doc": f"{tmp}/doc.npy"}, None,
               lambda L: (lambda b, h, q, kv: doc_dev[b, kv] == doc_dev[b, L - 1]), False)]
    # FP8 caches (e4m3; e5m2 once): flexjit only (FlexDecoding and SDPA have no FP8 KV path); their bf16 rows above
    # are the same shapes and mods.
    fp8 = [(f"paged ps16 {kv} 32768", 32768, 16, plain, {}, None, None, False, kv) for kv in ("e4m3", "e5m2")]
    fp8 += [("paged ps16 e4m3 alibi 32768", 32768, 16, alibi_f, {"slope": f"{tmp}/slope.npy"}, None, None, False, "e4m3"),
            ("paged ps16 e4m3 softcap 32768", 32768, 16, softcap_f, {}, None, None, False, "e4m3")]
    rows = []
    for (name, L, ps, flags, loads, score_mod, mask_factory, sdpa, *kv) in cases + fp8:
        r = {"case": name, "flexjit": run_flexjit(args.flexjit, flags, L, ps, loads, [], *kv)}
        if kv:
            rows.append(r)
            print(json.dumps(r), flush=True)
            continue
        if not args.no_torch and ps in (0, 16) and (score_mod or mask_factory or sdpa):
            r.update(torch_times(L, score_mod, mask_factory(L) if mask_factory else None, sdpa))
        elif not args.no_torch and name.startswith("paged ps16") and "window" not in name:
            r.update(torch_times(L, None, None, False))
        rows.append(r)
        print(json.dumps(r), flush=True)
    json.dump(rows, open(f"{args.out}/decode.json", "w"), indent=1)
    commit = os.environ.get("FLEXJIT_COMMIT") or subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True,
                                                                text=True).stdout.strip() or "unknown"
    gpu = torch.cuda.get_device_name()
    lines = [f"\n### Decode, {datetime.date.today()}, {gpu}, commit {commit}, torch {torch.__version__}\n",
             "B8, 32 query heads / 8 KV heads, D128, bf16 (e4m3 / e5m2 rows: an FP8 cache, bf16 q and o), one query token; "
             "L2 flushed before every timing; TB/s = K and V bytes / time.\n",
             "| case | flexjit ms | TB/s | splits | FlexDecoding ms | SDPA flash ms |", "| --- | --- | --- | --- | --- | --- |"]
    for r in rows:
        f = r["flexjit"]
        ms = f"{f['ms']:.4f}" if "ms" in f else "error: " + f.get("error", "?")[:80].replace("|", "/")
        tb = f"{f['kv_gbs'] / 1000:.2f}" if "kv_gbs" in f else "-"
        fd = f"{r['flexdecoding_ms']:.4f}" if "flexdecoding_ms" in r else "-"
        sd = f"{r['sdpa_flash_ms']:.4f}" if "sdpa_flash_ms" in r else "-"
        lines.append(f"| {r['case']} | {ms} | {tb} | {f.get('splits', '-')} | {fd} | {sd} |")
    table = "\n".join(lines) + "\n"
    open(f"{args.out}/decode_table.md", "w").write(table)
    print(table)


if __name__ == "__main__":
    main()
