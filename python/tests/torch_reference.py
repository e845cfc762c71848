"""A float64 PyTorch reference of attention with FlexAttention callables (differentiable, on
any device): the mods run on broadcast index grids, as FlexAttention's math path does."""
import torch


def reference(q, k, v, score_mod=None, mask_mod=None, scale=None):
    """o [B, H, Sq, Dv] and the natural-log LSE [B, H, Sq], in float64."""
    B, H, Sq, D = q.shape
    Skv = k.shape[2]
    k = k.repeat_interleave(H // k.shape[1], 1)
    v = v.repeat_interleave(H // v.shape[1], 1)
    s = (q.double() @ k.double().transpose(-1, -2)) * (D ** -0.5 if scale is None else scale)
    dev = q.device
    b = torch.arange(B, device=dev).view(B, 1, 1, 1)
    h = torch.arange(H, device=dev).view(1, H, 1, 1)
    qi = torch.arange(Sq, device=dev).view(1, 1, Sq, 1)
    kv = torch.arange(Skv, device=dev).view(1, 1, 1, Skv)
    if score_mod is not None:
        s = score_mod(s, b, h, qi, kv).double().expand(B, H, Sq, Skv)
    if mask_mod is not None:
        s = s.masked_fill(~mask_mod(b, h, qi, kv).expand(B, H, Sq, Skv), float("-inf"))
    lse = torch.logsumexp(s, -1)
    p = torch.exp(s - lse.unsqueeze(-1).masked_fill(torch.isinf(lse).unsqueeze(-1), 0))
    return p @ v.double(), lse


def assert_close(actual, expected, atol, rtol=0.0, what="value"):
    """Fails on NaN (or infinities where the reference is finite), and on an all-zero reference."""
    actual = actual.detach().double().cpu()
    expected = expected.detach().double().cpu()
    assert actual.shape == expected.shape, f"{what}: shape {tuple(actual.shape)} != {tuple(expected.shape)}"
    finite = torch.isfinite(expected)
    assert torch.equal(torch.isfinite(actual), finite), f"{what}: non-finite values where the reference is finite (or the reverse)"
    assert expected[finite].abs().max() > 0, f"{what}: the reference is all zeros, which proves nothing"
    torch.testing.assert_close(actual[finite], expected[finite], atol=atol, rtol=rtol, msg=lambda m: f"{what}: {m}")
