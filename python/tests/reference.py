"""float64 numpy references of attention and its gradients, for the tests.

A mod is given as numpy functions over broadcast index grids b [B,1,1,1], h [1,H,1,1],
q [1,1,Sq,1], kv [1,1,1,Skv]: ``score(s, b, h, q, kv)`` returns the modified scores and
``mask(b, h, q, kv)`` the kept positions.
"""
import numpy as np


def grids(B, H, Sq, Skv):
    return (np.arange(B).reshape(B, 1, 1, 1), np.arange(H).reshape(1, H, 1, 1), np.arange(Sq).reshape(1, 1, Sq, 1),
            np.arange(Skv).reshape(1, 1, 1, Skv))


def expand_kv(x, heads):
    return np.repeat(x, heads // x.shape[1], axis=1)


def scores(q, k, score=None, mask=None, scale=None):
    """The modified, masked scores [B, H, Sq, Skv] in float64 (-inf where masked)."""
    q = q.astype(np.float64)
    k = expand_kv(k.astype(np.float64), q.shape[1])
    scale = 1 / np.sqrt(q.shape[-1]) if scale is None else scale
    s = np.einsum("bhqd,bhkd->bhqk", q, k) * scale
    b, h, qi, kv = grids(q.shape[0], q.shape[1], q.shape[2], k.shape[2])
    if score is not None:
        s = np.broadcast_to(score(s, b, h, qi, kv), s.shape)
    if mask is not None:
        s = np.where(np.broadcast_to(mask(b, h, qi, kv), s.shape), s, -np.inf)
    return s


def softmax(s):
    """Probabilities and natural-log LSE of masked scores (fully masked rows: P = 0, LSE = -inf)."""
    mx = s.max(-1, keepdims=True)
    safe = np.where(np.isfinite(mx), mx, 0)
    e = np.exp(s - safe)
    total = e.sum(-1, keepdims=True)
    p = np.where(total > 0, e / np.where(total > 0, total, 1), 0)
    lse = np.where(total[..., 0] > 0, np.log(np.where(total > 0, total, 1))[..., 0] + safe[..., 0], -np.inf)
    return p, lse


def attention(q, k, v, score=None, mask=None, scale=None):
    """o [B, H, Sq, Dv] and the LSE [B, H, Sq]."""
    p, lse = softmax(scores(q, k, score, mask, scale))
    return np.einsum("bhqk,bhkd->bhqd", p, expand_kv(v.astype(np.float64), q.shape[1])), lse


def attention_grads(q, k, v, d_o, score=None, mask=None, scale=None):
    """dq, dk, dv and dS (the gradient of the loss with respect to the modified scores), for a
    score_mod whose derivative in `score` is 1 (additive biases); buffer gradients are sums of dS."""
    H = q.shape[1]
    group = H // k.shape[1]
    scale = 1 / np.sqrt(q.shape[-1]) if scale is None else scale
    p, _ = softmax(scores(q, k, score, mask, scale))
    vv = expand_kv(v.astype(np.float64), H)
    kk = expand_kv(k.astype(np.float64), H)
    d_o = d_o.astype(np.float64)
    o = np.einsum("bhqk,bhkd->bhqd", p, vv)
    dv = np.einsum("bhqk,bhqd->bhkd", p, d_o)
    dp = np.einsum("bhqd,bhkd->bhqk", d_o, vv)
    ds = p * (dp - (d_o * o).sum(-1, keepdims=True))
    dq = np.einsum("bhqk,bhkd->bhqd", ds, kk) * scale
    dk = np.einsum("bhqk,bhqd->bhkd", ds, q.astype(np.float64)) * scale

    def per_kv_head(x):
        return x.reshape(x.shape[0], x.shape[1] // group, group, *x.shape[2:]).sum(2)

    return dq, per_kv_head(dk), per_kv_head(dv), ds


def assert_close(actual, expected, atol, rtol=0.0, what="value"):
    """Fails on any NaN or infinity where the reference is finite, then compares."""
    actual = np.asarray(actual, dtype=np.float64)
    expected = np.asarray(expected, dtype=np.float64)
    assert actual.shape == expected.shape, f"{what}: shape {actual.shape} != {expected.shape}"
    finite = np.isfinite(expected)
    assert np.array_equal(np.isfinite(actual), finite), f"{what}: non-finite values where the reference is finite (or the reverse)"
    assert np.array_equal(actual[~finite], expected[~finite]), f"{what}: wrong infinities"
    assert np.abs(expected[finite]).max(initial=0) > 0, f"{what}: the reference is all zeros, which proves nothing"
    np.testing.assert_allclose(actual[finite], expected[finite], atol=atol, rtol=rtol, err_msg=what)
