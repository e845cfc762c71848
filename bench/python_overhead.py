"""Host overhead of a flexjit launch from Python over the same launch from C++ (issue 30's target:
<= 10 us). Tiny shapes, so the GPU keeps up with the host and each figure is host time per
launch: the median over rounds of `--launches` back-to-back launches.

    python3 bench/python_overhead.py [--launches 2000] [--rounds 7]

Columns: C++ (Kernel::forward with its arguments read once, in the extension), the extension's
forward (arguments read from Python objects; outputs preallocated), flexjit.flex_attention (the
string API: allocates o), the drop-in flexjit.torch.flex_attention (a translated callable), and
the path autograd takes (q requires grad: an autograd.Function in eager mode, the custom op under
torch.compile). Prints a markdown table. The last two columns are the GPU time of the string API's and the
drop-in's kernels per call (torch.profiler): the two translate a mod to one kernel, so they should agree; where the
kernel time exceeds a host figure, back-to-back launches of that row measure the kernel, not the host."""
import argparse
import statistics
import time

import torch

import flexjit
import flexjit.torch as fjt
from flexjit import _flexjit as ext


def host_us(fn, launches, rounds):
    for _ in range(50):
        fn()
    samples = []
    for _ in range(rounds):
        torch.cuda.synchronize()
        start = time.perf_counter()
        for _ in range(launches):
            fn()
        samples.append((time.perf_counter() - start) / launches * 1e6)
        torch.cuda.synchronize()
    return statistics.median(samples)


def kernel_us(fn, launches=50):
    """GPU kernel time per call of `fn`, from the profiler's device-side records (not CUDA events around back-to-back
    launches: when the host is slower than the kernels, those measure the host)."""
    for _ in range(10):
        fn()
    torch.cuda.synchronize()
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
        for _ in range(launches):
            fn()
        torch.cuda.synchronize()
    return sum(e.self_device_time_total for e in prof.key_averages()) / launches


def make_mods(S):
    W = int(S ** 0.5)
    rel_h = torch.randn(1, 1, S, W, device="cuda", dtype=torch.bfloat16)
    rel_w = torch.randn(1, 1, S, W, device="cuda", dtype=torch.bfloat16)

    def sam(score, b, h, q_idx, kv_idx):
        return score + rel_h[b, h, q_idx, kv_idx // W] + rel_w[b, h, q_idx, kv_idx % W]

    def causal(b, h, q_idx, kv_idx):
        return q_idx >= kv_idx

    return [
        ("no mods", None, None, None, None, None),
        ("causal mask", None, "q >= kv", None, None, causal),
        ("SAM rel-pos (2 buffers)", f"score + rel_h[b, h, q, kv // {W}] + rel_w[b, h, q, kv % {W}]", None, {"rel_h": rel_h, "rel_w": rel_w},
         sam, None),
    ]


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--launches", type=int, default=2000)
    p.add_argument("--rounds", type=int, default=7)
    args = p.parse_args()
    S, D = 256, 64
    q, k, v = (torch.randn(1, 1, S, D, device="cuda", dtype=torch.bfloat16) for _ in range(3))
    o = torch.empty_like(q)
    qg = q.clone().requires_grad_(True)
    stream = torch.cuda.current_stream().cuda_stream
    rows = []
    for name, score, mask, buffers, score_fn, mask_fn in make_mods(S):
        n, r = args.launches, args.rounds
        cpp = statistics.median(ext.time_forward(score, mask, buffers, None, q, k, v, o, None, 0.0, stream, n) for _ in range(r))
        binding = host_us(lambda: ext.forward(score, mask, buffers, None, None, q, k, v, o, None, 0.0, None, stream), n, r)
        api_call = lambda: flexjit.flex_attention(q, k, v, score_mod=score, mask_mod=mask, buffers=buffers)
        api = host_us(api_call, n, r)
        bm = fjt.create_block_mask(mask_fn, None, None, S, S) if mask_fn else None
        dropin_call = lambda: fjt.flex_attention(q, k, v, score_mod=score_fn, block_mask=bm)
        dropin = host_us(dropin_call, n, r)
        op = host_us(lambda: flexjit.flex_attention(qg, k, v, score_mod=score, mask_mod=mask, buffers=buffers), n, r)
        rows.append((name, cpp, binding, api, dropin, op, kernel_us(api_call), kernel_us(dropin_call)))
    sdpa = host_us(lambda: torch.nn.functional.scaled_dot_product_attention(q, k, v), args.launches, args.rounds)
    print(f"| {torch.cuda.get_device_name()} | C++ launch | extension forward | flexjit.flex_attention | over C++ | drop-in | over C++ | "
          "with autograd | over C++ | kernel time: string API | drop-in |")
    print("|---|---|---|---|---|---|---|---|---|---|---|")
    for name, cpp, binding, api, dropin, op, api_gpu, dropin_gpu in rows:
        print(f"| {name} | {cpp:.2f} us | {binding:.2f} | {api:.2f} | **{api - cpp:+.2f}** | {dropin:.2f} | {dropin - cpp:+.2f} | "
              f"{op:.2f} | {op - cpp:+.2f} | {api_gpu:.2f} | {dropin_gpu:.2f} |")
    print(f"\nFor scale: one torch SDPA call (flash) costs {sdpa:.2f} us of host time here. Target: flexjit.flex_attention <= 10 us over C++.")


if __name__ == "__main__":
    main()
