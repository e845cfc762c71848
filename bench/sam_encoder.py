"""The SAM ViT-B image encoder (seed 004) end to end, in plain PyTorch with random weights, timed in
images/s with its attention through
  sdpa     torch SDPA with the decomposed rel-pos bias materialised ([B, heads, N, N]),
  flex     torch FlexAttention with the bias as a score_mod (the model under torch.compile),
  flexjit  flexjit.flex_attention with the bias as buffers rel_h / rel_w (flexjit's SAM spec),
  none     no attention (v passed on): not a default backend, the ceiling that attention work leaves;
forward at batch 32 (no grad) and forward+backward at batch 8, bf16. ViT-B: 1024x1024 images,
16x16 patches (64x64 tokens), width 768, 12 heads of 64, 12 blocks of which 2, 5, 8 and 11
attend globally (4096 tokens) and the others in 14x14 windows (the grid padded to 70x70).

    python3 bench/sam_encoder.py [--backends sdpa,flex,flexjit] [--modes fwd,fwdbwd] [--compile flex|all|none]
                                 [--iters 10] [--check]

--compile flex (default) compiles only the FlexAttention model (FlexAttention needs it);
all compiles every backend's model too (adds rows "... compiled"). --check compares the three
attention paths on one block first. Prints a markdown table (images/s, and flexjit against each).
"""
import argparse

import torch
import torch.nn.functional as F
from torch import nn

import flexjit
from cuda_timing import median_ms

WINDOW, GLOBAL_BLOCKS, DEPTH, DIM, HEADS, IMG, PATCH = 14, (2, 5, 8, 11), 12, 768, 12, 1024, 16


def relative_table(size, table):
    """table [2 * size - 1, C] read at (q - k) + size - 1 for every query and key coordinate: [size, size, C]."""
    coords = torch.arange(size, device=table.device)
    return table[(coords[:, None] - coords[None, :] + size - 1)]


def decomposed_rel_pos(q, table_h, table_w, hs, ws):
    """SAM's decomposed relative position terms for q [B, heads, hs * ws, C]: rel_h [B, heads, N, hs]
    and rel_w [B, heads, N, ws] (the bias of query (y, x) and key (ky, kx) is rel_h[.., ky] + rel_w[.., kx])."""
    b, h, n, c = q.shape
    r_q = q.reshape(b, h, hs, ws, c)
    rel_h = torch.einsum("bnyxc,ykc->bnyxk", r_q, relative_table(hs, table_h)).reshape(b, h, n, hs)
    rel_w = torch.einsum("bnyxc,xkc->bnyxk", r_q, relative_table(ws, table_w)).reshape(b, h, n, ws)
    return rel_h, rel_w


def sdpa_attention(q, k, v, rel_h, rel_w, hs, ws):
    b, h, n, _ = q.shape
    bias = (rel_h[..., :, None] + rel_w[..., None, :]).reshape(b, h, n, n)
    return F.scaled_dot_product_attention(q, k, v, attn_mask=bias)


def flex_attention(q, k, v, rel_h, rel_w, hs, ws):
    from torch.nn.attention.flex_attention import flex_attention as flex

    def score_mod(score, b, h, q_idx, kv_idx):
        return score + rel_h[b, h, q_idx, kv_idx // ws] + rel_w[b, h, q_idx, kv_idx % ws]

    return flex(q, k, v, score_mod=score_mod)


def flexjit_attention(q, k, v, rel_h, rel_w, hs, ws):
    return flexjit.flex_attention(q, k, v, score_mod=f"score + rel_h[b, h, q, kv // {ws}] + rel_w[b, h, q, kv % {ws}]",
                                  buffers={"rel_h": rel_h, "rel_w": rel_w})


def no_attention(q, k, v, rel_h, rel_w, hs, ws):
    """v itself, with the attention's output shape: the encoder's speed with attention costing nothing."""
    return v


ATTENTION = {"sdpa": sdpa_attention, "flex": flex_attention, "flexjit": flexjit_attention, "none": no_attention}


class Attention(nn.Module):
    def __init__(self, size, attend):
        super().__init__()
        head_dim = DIM // HEADS
        self.qkv, self.proj = nn.Linear(DIM, 3 * DIM), nn.Linear(DIM, DIM)
        self.rel_pos_h = nn.Parameter(torch.randn(2 * size - 1, head_dim) * 0.02)
        self.rel_pos_w = nn.Parameter(torch.randn(2 * size - 1, head_dim) * 0.02)
        self.attend = attend

    def forward(self, x):
        b, hs, ws, _ = x.shape
        # q, k, v [B, heads, N, 64] are strided views of one projection (no copy).
        q, k, v = self.qkv(x).reshape(b, hs * ws, 3, HEADS, DIM // HEADS).permute(2, 0, 3, 1, 4)
        rel_h, rel_w = decomposed_rel_pos(q, self.rel_pos_h, self.rel_pos_w, hs, ws)
        o = self.attend(q, k, v, rel_h, rel_w, hs, ws)
        return self.proj(o.transpose(1, 2).reshape(b, hs, ws, DIM))


def window_partition(x, w):
    b, hs, ws, c = x.shape
    ph, pw = (w - hs % w) % w, (w - ws % w) % w
    x = F.pad(x, (0, 0, 0, pw, 0, ph))
    hp, wp = hs + ph, ws + pw
    x = x.view(b, hp // w, w, wp // w, w, c).permute(0, 1, 3, 2, 4, 5).reshape(-1, w, w, c)
    return x, (hp, wp)


def window_unpartition(x, w, padded, size, b):
    hp, wp = padded
    x = x.view(b, hp // w, wp // w, w, w, -1).permute(0, 1, 3, 2, 4, 5).reshape(b, hp, wp, -1)
    return x[:, :size[0], :size[1]].contiguous()


class Block(nn.Module):
    def __init__(self, window, attend):
        super().__init__()
        self.window = window
        self.norm1, self.norm2 = nn.LayerNorm(DIM), nn.LayerNorm(DIM)
        self.attn = Attention(window if window else IMG // PATCH, attend)
        self.mlp = nn.Sequential(nn.Linear(DIM, 4 * DIM), nn.GELU(), nn.Linear(4 * DIM, DIM))

    def forward(self, x):
        shortcut = x
        x = self.norm1(x)
        if self.window:
            b, hs, ws, _ = x.shape
            x, padded = window_partition(x, self.window)
            x = window_unpartition(self.attn(x), self.window, padded, (hs, ws), b)
        else:
            x = self.attn(x)
        x = shortcut + x
        return x + self.mlp(self.norm2(x))


class LayerNorm2d(nn.Module):
    def __init__(self, c):
        super().__init__()
        self.weight, self.bias = nn.Parameter(torch.ones(c)), nn.Parameter(torch.zeros(c))

    def forward(self, x):
        u = x.mean(1, keepdim=True)
        s = (x - u).pow(2).mean(1, keepdim=True)
        return self.weight[:, None, None] * ((x - u) / torch.sqrt(s + 1e-6)) + self.bias[:, None, None]


class ImageEncoderViTB(nn.Module):
    def __init__(self, attend):
        super().__init__()
        grid = IMG // PATCH
        self.patch_embed = nn.Conv2d(3, DIM, PATCH, stride=PATCH)
        self.pos_embed = nn.Parameter(torch.randn(1, grid, grid, DIM) * 0.02)
        self.blocks = nn.ModuleList(Block(0 if i in GLOBAL_BLOCKS else WINDOW, attend) for i in range(DEPTH))
        self.neck = nn.Sequential(nn.Conv2d(DIM, 256, 1, bias=False), LayerNorm2d(256), nn.Conv2d(256, 256, 3, padding=1, bias=False),
                                  LayerNorm2d(256))

    def forward(self, images):
        x = self.patch_embed(images).permute(0, 2, 3, 1) + self.pos_embed
        for block in self.blocks:
            x = block(x)
        return self.neck(x.permute(0, 3, 1, 2))


def make_model(backend, compiled):
    torch.manual_seed(0)
    model = ImageEncoderViTB(ATTENTION[backend]).to("cuda", torch.bfloat16)
    return torch.compile(model, dynamic=False) if compiled else model


def images_per_s(model, mode, iters):
    batch = 32 if mode == "fwd" else 8
    images = torch.randn(batch, 3, IMG, IMG, device="cuda", dtype=torch.bfloat16)
    if mode == "fwd":
        def step():
            with torch.no_grad():
                model(images)
    else:
        def step():
            model(images).float().square().mean().backward()
    ms = median_ms(step, iters)
    return batch / ms * 1e3


def check_block():
    """The three attention paths agree on one global-attention layer (bf16 tolerance)."""
    torch.manual_seed(1)
    x = torch.randn(2, 64, 64, DIM, device="cuda", dtype=torch.bfloat16)
    layer = Attention(64, sdpa_attention).to("cuda", torch.bfloat16)
    outs = {}
    for name in ("sdpa", "flex", "flexjit"):
        attend = ATTENTION[name]
        layer.attend = torch.compile(attend) if name == "flex" else attend
        outs[name] = layer(x).float()
    for name in ("flex", "flexjit"):
        err = (outs[name] - outs["sdpa"]).abs().max().item()
        print(f"check: {name} vs sdpa max |diff| {err:.3g}")
        assert err < 0.1, f"{name} disagrees with sdpa"


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--backends", default="sdpa,flex,flexjit")
    p.add_argument("--modes", default="fwd,fwdbwd")
    p.add_argument("--compile", default="flex", choices=["flex", "all", "none"])
    p.add_argument("--iters", type=int, default=10)
    p.add_argument("--check", action="store_true")
    args = p.parse_args()
    if args.check:
        try:
            check_block()
        except Exception as e:
            print(f"check: failed: {type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}", flush=True)
    backends = args.backends.split(",")
    modes = args.modes.split(",")
    runs = [(b, b == "flex" and args.compile != "none") for b in backends]
    if args.compile == "all":
        runs += [(b, True) for b in backends if b != "flex"]
    results = {}
    for backend, compiled in runs:
        model = make_model(backend, compiled)
        for mode in modes:
            label = backend + (" compiled" if compiled else "")
            try:
                results[label, mode] = images_per_s(model, mode, args.iters)
            except Exception as e:  # one failing backend (out of memory, a compile error) must not hide the others
                print(f"{label} {mode}: failed: {type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}", flush=True)
                results[label, mode] = float("nan")
            print(f"{label} {mode}: {results[label, mode]:.1f} images/s", flush=True)
            torch.cuda.empty_cache()
        del model
    labels = list(dict.fromkeys(label for label, _ in results))
    names = {"fwd": "forward, batch 32", "fwdbwd": "forward+backward, batch 8"}
    print(f"\n| SAM ViT-B encoder, {torch.cuda.get_device_name()}, bf16 | " + " | ".join(labels) + " | flexjit / sdpa | flexjit / flex |")
    print("|---|" + "---|" * (len(labels) + 2))
    for mode in modes:
        row = [results.get((label, mode), float("nan")) for label in labels]
        fj = results.get(("flexjit", mode), float("nan"))
        sd = results.get(("sdpa", mode), float("nan"))
        fx = results.get(("flex compiled", mode), results.get(("flex", mode), float("nan")))
        print(f"| {names[mode]} (images/s) | " + " | ".join(f"{x:.1f}" for x in row) + f" | {fj / sd:.2f}x | {fj / fx:.2f}x |")


if __name__ == "__main__":
    main()
