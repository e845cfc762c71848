"""The DSL gallery (examples/gallery/) and attention-gym style mods, each as flexjit text and as
the Python callables FlexAttention takes, with random captured tensors, for the torch tests."""
from typing import Callable, NamedTuple, Optional

import torch


class Case(NamedTuple):
    name: str
    score_text: Optional[str]
    mask_text: Optional[str]
    buffers: dict               # name -> tensor, for the text
    params: dict                # name -> value, for the text
    score_mod: Optional[Callable]
    mask_mod: Optional[Callable]
    grads: tuple = ()           # buffers that may require grad


def launch(case, api, q, k, v):
    """Attention of a case through the string API ("string") or the drop-in ("drop-in")."""
    import flexjit
    import flexjit.torch as fjt

    if api == "string":
        return flexjit.flex_attention(q, k, v, score_mod=case.score_text, mask_mod=case.mask_text, buffers=case.buffers, params=case.params)
    S, S_kv = q.shape[2], k.shape[2]
    bm = fjt.create_block_mask(case.mask_mod, None, None, S, S_kv) if case.mask_mod else None
    return fjt.flex_attention(q, k, v, score_mod=case.score_mod, block_mask=bm)


def gallery(B, H, S, device, dtype=torch.float32, seed=0, requires_grad=False, exact=False):
    """Cases for q [B, H, S, D] and k, v [B, H, S, D]; S must be a square (SAM's token grid).
    requires_grad: the float buffers a case lists in `grads` require grad (the callables capture
    the same tensors as the text's buffers).
    exact: the float buffers hold the same values (rounded to `dtype`) in float64, for a reference:
    torch computes `slope[h] * (kv - q)` in the buffer's dtype, flexjit in fp32 at least."""
    g = torch.Generator(device="cpu").manual_seed(seed)

    def randn(*shape):
        values = torch.randn(*shape, generator=g).to(device=device, dtype=dtype)
        return values.double() if exact else values

    W = int(round(S ** 0.5))
    assert W * W == S, "S must be a square"
    window, prefix, cap = S // 4, S // 3, 20.0
    doc = torch.sort(torch.randint(0, 4, (S,), generator=g)).values.to(device=device, dtype=torch.int32)
    slope = (randn(H) * 0.1).requires_grad_(requires_grad)
    bias = randn(H, 2 * S - 1).requires_grad_(requires_grad)
    rel_h, rel_w = randn(B, H, S, W).requires_grad_(requires_grad), randn(B, H, S, W).requires_grad_(requires_grad)
    table, offset = randn(64).requires_grad_(requires_grad), torch.randint(0, 64, (S,), generator=g).to(device=device, dtype=torch.int32)
    spatial = randn(H, 256).requires_grad_(requires_grad)
    dist = torch.randint(0, 256, (B, S, S), generator=g).to(device=device, dtype=torch.uint8)

    def causal(b, h, q, kv):
        return q >= kv

    def sliding(b, h, q, kv):
        return (q >= kv) & (q - kv < window)

    def prefix_lm(b, h, q, kv):
        return (kv < prefix) | (q >= kv)

    def document(b, h, q, kv):
        return doc[q] == doc[kv]

    def alibi(score, b, h, q, kv):
        return score + slope[h] * (kv - q)

    def softcap(score, b, h, q, kv):
        return cap * torch.tanh(score / cap)

    def relative(score, b, h, q, kv):
        return score + bias[h, q - kv + S - 1]

    def sam(score, b, h, q, kv):
        return score + rel_h[b, h, q, kv // W] + rel_w[b, h, q, kv % W]

    def offset_bias(score, b, h, q, kv):
        return score + table[offset[q]]

    def graphormer(score, b, h, q, kv):
        return score + spatial[h, dist[b, q, kv].long()]

    return [
        Case("causal", None, "q >= kv", {}, {}, None, causal),
        Case("sliding_window", None, "q >= kv && q - kv < window", {}, {"window": window}, None, sliding),
        Case("prefix_lm", None, "kv < prefix || q >= kv", {}, {"prefix": prefix}, None, prefix_lm),
        Case("document", None, "doc[q] == doc[kv]", {"doc": doc}, {}, None, document),
        Case("alibi", "score + slope[h] * (kv - q)", None, {"slope": slope}, {}, alibi, None, ("slope",)),
        Case("alibi_causal", "score + slope[h] * (kv - q)", "q >= kv", {"slope": slope}, {}, alibi, causal, ("slope",)),
        Case("softcap", "cap * tanh(score / cap)", None, {}, {"cap": cap}, softcap, None),
        Case("relative_bias", "score + bias[h, q - kv + Skv - 1]", None, {"bias": bias}, {}, relative, None, ("bias",)),
        Case("sam_relpos", f"score + rel_h[b, h, q, kv // {W}] + rel_w[b, h, q, kv % {W}]", None, {"rel_h": rel_h, "rel_w": rel_w}, {},
             sam, None, ("rel_h", "rel_w")),
        Case("offset_bias", "score + bias[offset[q]]", None, {"bias": table, "offset": offset}, {}, offset_bias, None, ("bias",)),
        Case("graphormer", "score + sb[h, dist[b, q, kv]]", None, {"sb": spatial, "dist": dist}, {}, graphormer, None, ("sb",)),
    ]


def attention_gym(B, H, S, device, dtype=torch.float32, seed=1):
    """attention-gym style mods (closures made by generator functions, helpers, and_masks),
    as (name, score_mod, mask_mod) with their own reference meaning."""
    from torch.nn.attention.flex_attention import and_masks, or_masks

    g = torch.Generator(device="cpu").manual_seed(seed)
    W = int(round(S ** 0.5))

    def generate_sliding_window(window_size):
        def sliding_window(b, h, q_idx, kv_idx):
            return q_idx - kv_idx <= window_size

        return sliding_window

    def causal_mask(b, h, q_idx, kv_idx):
        return q_idx >= kv_idx

    def generate_prefix_lm_mask(prefix_length):
        def prefix_mask(b, h, q_idx, kv_idx):
            return kv_idx < prefix_length

        return or_masks(prefix_mask, causal_mask)

    lengths = torch.tensor([S // 4, S // 2, S - S // 4 - S // 2])
    document_id = torch.repeat_interleave(torch.arange(3), lengths).to(device=device, dtype=torch.int32)
    offsets = torch.cat([torch.zeros(1, dtype=torch.long), torch.cumsum(lengths, 0)[:-1]]).to(device=device, dtype=torch.int32)

    def generate_doc_mask_mod(mask_mod, document_id, offsets):
        def doc_mask_mod(b, h, q_idx, kv_idx):
            same_doc = document_id[q_idx] == document_id[kv_idx]
            q_logical = q_idx - offsets[document_id[q_idx]]
            kv_logical = kv_idx - offsets[document_id[kv_idx]]
            inner_mask = mask_mod(b, h, q_logical, kv_logical)
            return same_doc & inner_mask

        return doc_mask_mod

    def generate_alibi_bias(num_heads):
        def alibi_mod(score, b, h, q_idx, kv_idx):
            scale = torch.exp2(-((h + 1) * 8.0 / num_heads))
            bias = (kv_idx - q_idx) * scale
            return score + bias

        return alibi_mod

    def generate_tanh_softcap(soft_cap, approx=False):
        def tanh_softcap(score, b, h, q_idx, kv_idx):
            return soft_cap * torch.tanh(score / soft_cap)

        return tanh_softcap

    def get_x_y(idx):
        return idx // W, idx % W

    def generate_natten(kernel_w, kernel_h):
        def natten_mask_mod(b, h, q_idx, kv_idx):
            q_x, q_y = get_x_y(q_idx)
            kv_x, kv_y = get_x_y(kv_idx)
            kernel_x = q_x.clamp(kernel_w // 2, (W - 1) - kernel_w // 2)
            kernel_y = q_y.clamp(kernel_h // 2, (W - 1) - kernel_h // 2)
            hori_mask = (kernel_x - kv_x).abs() <= kernel_w // 2
            vert_mask = (kernel_y - kv_y).abs() <= kernel_h // 2
            return hori_mask & vert_mask

        return natten_mask_mod

    cap_tensor = torch.tensor(15.0, device=device, dtype=dtype)

    def scalar_softcap(score, b, h, q_idx, kv_idx):
        return cap_tensor * torch.tanh(score / cap_tensor)

    def masked_in_score(score, b, h, q_idx, kv_idx):
        return torch.where(q_idx >= kv_idx, score, -float("inf"))

    del g
    return [
        ("sliding_window", None, and_masks(causal_mask, generate_sliding_window(S // 5))),
        ("prefix_lm", None, generate_prefix_lm_mask(S // 3)),
        ("document_causal", None, generate_doc_mask_mod(causal_mask, document_id, offsets)),
        ("alibi", generate_alibi_bias(H), None),
        ("softcap", generate_tanh_softcap(30.0), None),
        ("natten_2d", None, generate_natten(5, 3)),
        ("softcap_captured_scalar", scalar_softcap, None),
        ("where_in_score_mod", masked_in_score, None),
    ]
