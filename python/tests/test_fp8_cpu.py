"""Decode with FP8 KV caches and ragged prefill with FP8 K / V on numpy arrays and the CPU backend
(numpy has no FP8: the caches are uint8 arrays of the format's bytes), against a float64 reference
of the dequantised values."""
import numpy as np
import pytest

import flexjit
from reference import assert_close, attention

pytestmark = pytest.mark.skipif(not flexjit.has_cpu_backend(), reason="this build has no CPU backend")

RNG = np.random.default_rng(4321)


def fp8_values(fmt):
    """The value of every byte of an OCP FP8 format ("e4m3": e4m3fn, "e5m2"); NaN for its NaNs."""
    mant_bits, bias = (3, 7) if fmt == "e4m3" else (2, 15)
    bits = np.arange(256)
    exp, mant = (bits & 0x7F) >> mant_bits, bits & ((1 << mant_bits) - 1)
    sign = np.where(bits & 0x80, -1.0, 1.0)
    normal = np.ldexp((mant | (1 << mant_bits)).astype(np.float64), exp - bias - mant_bits)
    values = sign * np.where(exp == 0, np.ldexp(mant.astype(np.float64), 1 - bias - mant_bits), normal)
    if fmt == "e4m3":
        values[(bits & 0x7F) == 0x7F] = np.nan
    else:
        values[exp == 0x1F] = np.where(mant[exp == 0x1F] == 0, sign[exp == 0x1F] * np.inf, np.nan)
    return values


def quantise(x, fmt):
    """The bytes of the finite FP8 values nearest x (ties to either neighbour; saturating)."""
    values = fp8_values(fmt)
    codes = np.flatnonzero(np.isfinite(values))
    order = codes[np.argsort(values[codes], kind="stable")]
    sorted_values = values[order]
    hi = np.clip(np.searchsorted(sorted_values, x), 1, len(order) - 1)
    lo = hi - 1
    nearer_lo = np.abs(x - sorted_values[lo]) <= np.abs(sorted_values[hi] - x)
    return order[np.where(nearer_lo, lo, hi)].astype(np.uint8)


@pytest.mark.parametrize("fmt,kv_dtype", [("e4m3", "fp8"), ("e4m3", "f8e4m3"), ("e5m2", "e5m2")])
@pytest.mark.parametrize("page_size", [0, 16])
@pytest.mark.parametrize("per_head", [True, False])
def test_decode_fp8_matches_dequantised_reference(fmt, kv_dtype, page_size, per_head):
    B, H, Hkv, D, cap = 3, 4, 2, 16, 64
    plan = flexjit.plan_decode(mask_mod="kv <= q", batch=B, heads=H, kv_heads=Hkv, head_dim=D, max_seqlen_kv=cap, max_seqlen_q=2,
                               dtype="f32", device="cpu", page_size=page_size, kv_dtype=kv_dtype)
    assert plan.kv_dtype == "f8" + fmt
    scale_shape = (Hkv,) if per_head else (1,)
    k_scale = RNG.uniform(0.01, 0.05, scale_shape).astype(np.float32)
    v_scale = RNG.uniform(0.01, 0.05, scale_shape).astype(np.float32)
    # Non-zero values of both signs, quantised at their KV head's scale.
    magnitude = lambda: RNG.uniform(0.05, 1.5, (B, Hkv, cap, D)) * RNG.choice([-1.0, 1.0], (B, Hkv, cap, D))
    k_bytes = quantise(magnitude() / k_scale.reshape(1, -1, 1, 1), fmt)
    v_bytes = quantise(magnitude() / v_scale.reshape(1, -1, 1, 1), fmt)
    k_dense = (fp8_values(fmt)[k_bytes] * k_scale.reshape(1, -1, 1, 1)).astype(np.float64)
    v_dense = (fp8_values(fmt)[v_bytes] * v_scale.reshape(1, -1, 1, 1)).astype(np.float64)
    assert np.all(k_dense != 0) and np.all(v_dense != 0)
    q = RNG.standard_normal((B, H, 2, D)).astype(np.float32)
    kv_lens = np.array([10, 64, 33], dtype=np.int32)
    table = None
    k_cache, v_cache = k_bytes, v_bytes
    if page_size:
        pages = cap // page_size
        table = RNG.permutation(B * pages).astype(np.int32).reshape(B, pages)
        k_cache = np.full((B * pages, page_size, Hkv, D), 0x7F, np.uint8)  # NaN in both formats: unread
        v_cache = np.full_like(k_cache, 0x7F)
        for b in range(B):
            for i in range(pages):
                k_cache[table[b, i]] = k_bytes[b, :, i * page_size:(i + 1) * page_size].transpose(1, 0, 2)
                v_cache[table[b, i]] = v_bytes[b, :, i * page_size:(i + 1) * page_size].transpose(1, 0, 2)
    o, lse = flexjit.decode(plan, q, k_cache, v_cache, kv_lens, page_table=table, k_scale=k_scale, v_scale=v_scale, return_lse=True)
    assert not np.isnan(o).any() and not np.isnan(lse).any()
    for b in range(B):
        n = int(kv_lens[b])
        ro, rlse = attention(q[b:b + 1].astype(np.float64), k_dense[b:b + 1, :, :n], v_dense[b:b + 1, :, :n],
                             mask=lambda bb, h, qi, kv, n=n: kv <= qi + n - 2)
        assert_close(o[b:b + 1], ro, atol=3e-5, what=f"o of sequence {b}")
        assert_close(lse[b:b + 1], rlse, atol=3e-5, what=f"lse of sequence {b}")


def test_decode_fp8_errors():
    B, H, Hkv, D, cap = 2, 4, 2, 16, 32
    args = dict(mask_mod="kv <= q", batch=B, heads=H, kv_heads=Hkv, head_dim=D, max_seqlen_kv=cap, dtype="f32", device="cpu")
    plan = flexjit.plan_decode(**args, kv_dtype="fp8")
    q = np.zeros((B, H, 1, D), np.float32)
    cache = np.full((B, Hkv, cap, D), 0x38, np.uint8)  # 1.0 in e4m3
    kv_lens = np.array([5, 32], np.int32)
    o = flexjit.decode(plan, q, cache, cache, kv_lens)  # no scales: 1
    assert_close(o, np.ones_like(o), atol=0, what="o")
    with pytest.raises(flexjit.FlexjitError, match="`k_scale` must be an f32 tensor of shape \\[2\\]"):
        flexjit.decode(plan, q, cache, cache, kv_lens, k_scale=np.ones(3, np.float32))
    with pytest.raises(flexjit.FlexjitError, match="`k` is f32 but the plan's KV cache is f8e4m3"):
        flexjit.decode(plan, q, cache.astype(np.float32), cache, kv_lens)
    plain = flexjit.plan_decode(**args)
    assert plain.kv_dtype == "f32"
    with pytest.raises(flexjit.FlexjitError, match="`k_scale` is only for FP8 caches"):
        flexjit.decode(plain, q, cache.astype(np.float32), cache.astype(np.float32), kv_lens, k_scale=np.ones(2, np.float32))
    with pytest.raises(flexjit.FlexjitError, match="`k` is u8 but the plan's KV cache is f32"):
        flexjit.decode(plain, q, cache, cache, kv_lens)
    with pytest.raises(flexjit.FlexjitError, match="unknown kv_dtype `float8_e4m3fnuz`"):
        flexjit.plan_decode(**args, kv_dtype="float8_e4m3fnuz")


@pytest.mark.parametrize("fmt,kv_dtype", [("e4m3", "fp8"), ("e5m2", "e5m2")])
@pytest.mark.parametrize("per_head", [True, False])
def test_forward_varlen_fp8_matches_dequantised_reference(fmt, kv_dtype, per_head):
    lengths_q, lengths_kv = [17, 0, 40, 5], [30, 9, 40, 0]  # an empty query range and an empty KV range
    H, Hkv, D = 4, 2, 16
    cu_q = np.concatenate([[0], np.cumsum(lengths_q)]).astype(np.int32)
    cu_kv = np.concatenate([[0], np.cumsum(lengths_kv)]).astype(np.int32)
    scale_shape = (Hkv,) if per_head else (1,)
    # Scales that bring the format's largest value (448, 57344) to about 2..5.
    unit = 1 / 100 if fmt == "e4m3" else 1 / 12800
    k_scale = RNG.uniform(0.5 * unit, unit, scale_shape).astype(np.float32)
    v_scale = RNG.uniform(0.5 * unit, unit, scale_shape).astype(np.float32)
    # Random finite non-zero codes of the format.
    values = fp8_values(fmt)
    codes = np.flatnonzero(np.isfinite(values) & (values != 0)).astype(np.uint8)
    k_bytes = RNG.choice(codes, (cu_kv[-1], Hkv, D))
    v_bytes = RNG.choice(codes, (cu_kv[-1], Hkv, D))
    k_dense = values[k_bytes] * k_scale.reshape(1, -1, 1)
    v_dense = values[v_bytes] * v_scale.reshape(1, -1, 1)
    q = RNG.standard_normal((cu_q[-1], H, D)).astype(np.float32)
    o, lse = flexjit.forward_varlen(q, k_bytes, v_bytes, cu_q, cu_kv, 40, 40, mask_mod="kv <= q", k_scale=k_scale, v_scale=v_scale,
                                    kv_dtype=kv_dtype, return_lse=True)
    assert o.shape == q.shape and lse.shape == (H, cu_q[-1])
    for s in range(len(lengths_q)):
        if lengths_q[s] == 0 or lengths_kv[s] == 0:
            continue  # no rows; or rows without KV, checked below
        qs = q[cu_q[s]:cu_q[s + 1]].transpose(1, 0, 2)[None].astype(np.float64)
        ks = k_dense[cu_kv[s]:cu_kv[s + 1]].transpose(1, 0, 2)[None]
        vs = v_dense[cu_kv[s]:cu_kv[s + 1]].transpose(1, 0, 2)[None]
        ro, rlse = attention(qs, ks, vs, mask=lambda b, h, qi, kv: kv <= qi)
        assert_close(o[cu_q[s]:cu_q[s + 1]].transpose(1, 0, 2)[None], ro, atol=3e-5, rtol=1e-5, what=f"o of sequence {s}")
        assert_close(lse[:, cu_q[s]:cu_q[s + 1]][None], rlse, atol=3e-5, rtol=1e-5, what=f"lse of sequence {s}")
    assert np.all(o[cu_q[3]:] == 0) and np.all(lse[:, cu_q[3]:] == -np.inf)  # no KV rows: O 0, LSE -inf


def test_forward_varlen_fp8_errors():
    H, Hkv, D, rows = 4, 2, 16, 8
    q = np.zeros((rows, H, D), np.float32)
    kv = np.full((rows, Hkv, D), 0x38, np.uint8)  # 1.0 in e4m3
    cu = np.array([0, 3, rows], np.int32)
    o = flexjit.forward_varlen(q, kv, kv, cu, cu, rows, rows, mask_mod="kv <= q", kv_dtype="fp8")  # no scales: 1
    assert_close(o, np.ones_like(o), atol=0, what="o")
    with pytest.raises(flexjit.FlexjitError, match="`v_scale` must be an f32 tensor of shape \\[2\\]"):
        flexjit.forward_varlen(q, kv, kv, cu, cu, rows, rows, kv_dtype="fp8", v_scale=np.ones(3, np.float32))
    with pytest.raises(flexjit.FlexjitError, match="`k` is f8e4m3 but `v` is f32"):
        flexjit.forward_varlen(q, kv, kv.astype(np.float32), cu, cu, rows, rows, kv_dtype="fp8")
    with pytest.raises(flexjit.FlexjitError, match="`k_scale` is only for an FP8 k and v"):
        flexjit.forward_varlen(q, kv.astype(np.float32), kv.astype(np.float32), cu, cu, rows, rows, k_scale=np.ones(2, np.float32))
