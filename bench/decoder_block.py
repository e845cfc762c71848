"""A decoder block with a custom mask under torch.compile(fullgraph=True): RMSNorm, grouped-query
attention (16 query heads, 4 KV heads of 128) with a sliding window of 1024 plus 4 attention-sink
tokens, and a SwiGLU MLP, at batch 4 x 4096 tokens, bf16. Attention through
  flexjit  the drop-in flexjit.torch.flex_attention with a block mask from flexjit.torch.create_block_mask,
  flex     torch FlexAttention with the same mask_mod,
  sdpa     torch SDPA with the mask materialised as a [S, S] bool tensor;
timed forward (no grad) and forward+backward, in tokens/s. Prints a markdown table.

    python3 bench/decoder_block.py [--batch 4] [--seq 4096] [--iters 10]
"""
import argparse

import torch
import torch.nn.functional as F
from torch import nn
from torch.nn.attention import flex_attention as torch_flex

import flexjit.torch as fjt
from cuda_timing import median_ms

DIM, HEADS, KV_HEADS, HIDDEN, WINDOW, SINK = 2048, 16, 4, 5632, 1024, 4


def sliding_window_with_sink(window, sink):
    def mask_mod(b, h, q_idx, kv_idx):
        return (q_idx >= kv_idx) & ((q_idx - kv_idx < window) | (kv_idx < sink))

    return mask_mod


class DecoderBlock(nn.Module):
    def __init__(self, attend):
        super().__init__()
        self.head_dim = DIM // HEADS
        self.norm1, self.norm2 = nn.RMSNorm(DIM), nn.RMSNorm(DIM)
        self.wq, self.wkv, self.wo = nn.Linear(DIM, DIM, bias=False), nn.Linear(DIM, 2 * KV_HEADS * self.head_dim, bias=False), \
            nn.Linear(DIM, DIM, bias=False)
        self.w1, self.w3, self.w2 = nn.Linear(DIM, HIDDEN, bias=False), nn.Linear(DIM, HIDDEN, bias=False), nn.Linear(HIDDEN, DIM, bias=False)
        self.attend = attend

    def forward(self, x):
        b, s, _ = x.shape
        h = self.norm1(x)
        q = self.wq(h).view(b, s, HEADS, self.head_dim).transpose(1, 2)
        k, v = self.wkv(h).view(b, s, 2, KV_HEADS, self.head_dim).permute(2, 0, 3, 1, 4)
        o = self.attend(q, k, v)
        x = x + self.wo(o.transpose(1, 2).reshape(b, s, DIM))
        h = self.norm2(x)
        return x + self.w2(F.silu(self.w1(h)) * self.w3(h))


def attention_backends(seq):
    mask_mod = sliding_window_with_sink(WINDOW, SINK)
    flexjit_mask = fjt.create_block_mask(mask_mod, None, None, seq, seq)
    torch_mask = torch_flex.create_block_mask(mask_mod, None, None, seq, seq, device="cuda")
    i = torch.arange(seq, device="cuda")
    dense = mask_mod(None, None, i[:, None], i[None, :])
    return {
        "flexjit": lambda q, k, v: fjt.flex_attention(q, k, v, block_mask=flexjit_mask, enable_gqa=True),
        "flex": lambda q, k, v: torch_flex.flex_attention(q, k, v, block_mask=torch_mask, enable_gqa=True),
        "sdpa": lambda q, k, v: F.scaled_dot_product_attention(q, k, v, attn_mask=dense, enable_gqa=True),
    }


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--batch", type=int, default=4)
    p.add_argument("--seq", type=int, default=4096)
    p.add_argument("--iters", type=int, default=10)
    args = p.parse_args()
    x = torch.randn(args.batch, args.seq, DIM, device="cuda", dtype=torch.bfloat16)
    results, outputs = {}, {}
    tokens = args.batch * args.seq
    for name, attend in attention_backends(args.seq).items():
        torch.manual_seed(0)
        block = torch.compile(DecoderBlock(attend).to("cuda", torch.bfloat16), fullgraph=True)
        try:
            with torch.no_grad():
                outputs[name] = block(x).float()
                fwd = median_ms(lambda: block(x), args.iters)
            xg = x.clone().requires_grad_(True)
            bwd = median_ms(lambda: block(xg).float().square().mean().backward(), args.iters)
        except Exception as e:  # one failing backend must not hide the others
            print(f"{name}: failed: {type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}", flush=True)
            results[name] = (float("nan"), float("nan"))
            continue
        results[name] = (tokens / fwd * 1e3, tokens / bwd * 1e3)
        print(f"{name}: forward {fwd:.3f} ms, forward+backward {bwd:.3f} ms", flush=True)
    for name in ("flexjit", "flex"):
        if name in outputs and "sdpa" in outputs:
            print(f"check: {name} vs sdpa max |diff| {(outputs[name] - outputs['sdpa']).abs().max().item():.3g}")
    print(f"\n| decoder block, window {WINDOW} + {SINK} sinks, {args.batch}x{args.seq}, {torch.cuda.get_device_name()} | "
          "flexjit | flex | sdpa | flexjit / flex | flexjit / sdpa |")
    print("|---|---|---|---|---|---|")
    for i, mode in enumerate(("forward (tokens/s)", "forward+backward (tokens/s)")):
        fj, fx, sd = (results[n][i] for n in ("flexjit", "flex", "sdpa"))
        print(f"| {mode} | {fj:,.0f} | {fx:,.0f} | {sd:,.0f} | {fj / fx:.2f}x | {fj / sd:.2f}x |")


if __name__ == "__main__":
    main()
