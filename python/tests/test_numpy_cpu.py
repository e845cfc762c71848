"""The string API on numpy arrays and the CPU backend (what CI runs: no GPU, no torch)."""
import numpy as np
import pytest

import flexjit
from fake_cuda import FakeCudaArray
from reference import assert_close, attention, attention_grads

pytestmark = pytest.mark.skipif(not flexjit.has_cpu_backend(), reason="this build has no CPU backend")

RNG = np.random.default_rng(1234)


def randn(*shape, dtype=np.float32):
    return RNG.standard_normal(shape).astype(dtype)


def qkv(B=2, H=4, Hkv=None, Sq=96, Skv=96, D=32, Dv=None, dtype=np.float32):
    Hkv = Hkv or H
    return randn(B, H, Sq, D, dtype=dtype), randn(B, Hkv, Skv, D, dtype=dtype), randn(B, Hkv, Skv, Dv or D, dtype=dtype)


def test_causal_forward_and_lse():
    q, k, v = qkv(Sq=80, Skv=112, Dv=16)
    o, lse = flexjit.flex_attention(q, k, v, mask_mod="q_idx >= kv_idx", return_lse=True)
    ro, rlse = attention(q, k, v, mask=lambda b, h, qi, kv: qi >= kv)
    assert o.dtype == np.float32 and o.shape == (2, 4, 80, 16) and lse.shape == (2, 4, 80)
    assert_close(o, ro, atol=2e-5, what="o")
    assert_close(lse, rlse, atol=2e-5, what="lse")
    assert isinstance(flexjit.flex_attention(q, k, v, mask_mod="q >= kv"), np.ndarray)


def test_fully_masked_rows_give_zero_and_minus_infinity():
    q, k, v = qkv(Sq=64, Skv=64)
    o, lse = flexjit.flex_attention(q, k, v, mask_mod="q >= 32 && kv <= q", return_lse=True)
    assert np.all(o[:, :, :32] == 0) and np.all(lse[:, :, :32] == -np.inf)
    ro, rlse = attention(q, k, v, mask=lambda b, h, qi, kv: (qi >= 32) & (kv <= qi))
    assert_close(o, ro, atol=2e-5, what="o")
    assert_close(lse, rlse, atol=2e-5, what="lse")


def test_score_mod_with_buffers_scale_and_gqa():
    q, k, v = qkv(B=2, H=6, Hkv=2, Sq=72, Skv=72, D=16)
    slopes = randn(6)
    o = flexjit.flex_attention(q, k, v, score_mod="score + slope[h] * (kv - q)", buffers={"slope": slopes}, scale=0.3,
                               enable_gqa=True)
    ro, _ = attention(q, k, v, score=lambda s, b, h, qi, kv: s + slopes[h] * (kv - qi), scale=0.3)
    assert_close(o, ro, atol=3e-5, what="o")
    with pytest.raises(ValueError, match="enable_gqa=True"):
        flexjit.flex_attention(q, k, v)


def test_sam_relpos_forward_and_backward_with_buffer_gradients():
    W = 8
    q, k, v = qkv(B=2, H=3, Sq=W * W, Skv=W * W, D=16)
    rel_h, rel_w = randn(2, 3, W * W, W), randn(2, 3, W * W, W)
    mod = f"score + rel_h[b, h, q, kv // {W}] + rel_w[b, h, q, kv % {W}]"
    buffers = {"rel_h": rel_h, "rel_w": rel_w}

    def score(s, b, h, qi, kv):
        return s + rel_h[b, h, qi, kv // W] + rel_w[b, h, qi, kv % W]

    o, lse = flexjit.flex_attention(q, k, v, score_mod=mod, buffers=buffers, return_lse=True)
    ro, rlse = attention(q, k, v, score=score)
    assert_close(o, ro, atol=3e-5, what="o")
    assert_close(lse, rlse, atol=3e-5, what="lse")

    d_o = randn(*o.shape)
    dq, dk, dv, grads = flexjit.flex_attention_backward(q, k, v, o, lse, d_o, score_mod=mod, buffers=buffers,
                                                        grad_buffers=("rel_h", "rel_w"))
    rdq, rdk, rdv, ds = attention_grads(q, k, v, d_o, score=score)
    assert_close(dq, rdq, atol=1e-4, what="dq")
    assert_close(dk, rdk, atol=1e-4, what="dk")
    assert_close(dv, rdv, atol=1e-4, what="dv")
    ds = ds.reshape(2, 3, W * W, W, W)
    assert set(grads) == {"rel_h", "rel_w"} and grads["rel_h"].dtype == np.float32
    assert_close(grads["rel_h"], ds.sum(-1), atol=1e-4, what="d rel_h")
    assert_close(grads["rel_w"], ds.sum(-2), atol=1e-4, what="d rel_w")


def test_backward_gqa_mask_and_learnable_slopes_deterministic():
    q, k, v = qkv(B=1, H=4, Hkv=2, Sq=64, Skv=96, D=16)
    slopes = randn(4)
    mod = "score + slope[h] * (kv - q)"
    o, lse = flexjit.flex_attention(q, k, v, score_mod=mod, mask_mod="kv <= q + 32", buffers={"slope": slopes}, return_lse=True,
                                    enable_gqa=True)
    d_o = randn(*o.shape)
    args = dict(score_mod=mod, mask_mod="kv <= q + 32", buffers={"slope": slopes}, grad_buffers=("slope",), enable_gqa=True)
    dq, dk, dv, grads = flexjit.flex_attention_backward(q, k, v, o, lse, d_o, **args)
    again = flexjit.flex_attention_backward(q, k, v, o, lse, d_o, deterministic=True, **args)
    score = lambda s, b, h, qi, kv: s + slopes[h] * (kv - qi)  # noqa: E731
    rdq, rdk, rdv, ds = attention_grads(q, k, v, d_o, score=score, mask=lambda b, h, qi, kv: kv <= qi + 32)
    for got in ((dq, dk, dv, grads["slope"]), again[:3] + (again[3]["slope"],)):
        assert_close(got[0], rdq, atol=1e-4, what="dq")
        assert_close(got[1], rdk, atol=1e-4, what="dk")
        assert_close(got[2], rdv, atol=1e-4, what="dv")
        _, _, qi, kv = np.indices((1, 1, 64, 96))
        assert_close(got[3], (ds * (kv - qi)).sum((0, 2, 3)), atol=2e-3, rtol=1e-4, what="d slope")


def test_runtime_and_constant_params():
    q, k, v = qkv(Sq=64, Skv=64)
    for window in (4, 17):
        o = flexjit.flex_attention(q, k, v, mask_mod="q >= kv && q - kv < window", params={"window": window})
        ro, _ = attention(q, k, v, mask=lambda b, h, qi, kv: (qi >= kv) & (qi - kv < window))
        assert_close(o, ro, atol=2e-5, what=f"window {window}")
    for cap, params in ((5.0, {"cap": 5.0}), (2.5, {"cap": flexjit.const(2.5)}), (3.0, {"cap": np.float32(3.0)})):
        o = flexjit.flex_attention(q, k, v, score_mod="cap * tanh(score / cap)", params=params)
        ro, _ = attention(q, k, v, score=lambda s, b, h, qi, kv: cap * np.tanh(s / cap))
        assert_close(o, ro, atol=3e-5, what=f"cap {cap}")
    o = flexjit.flex_attention(q, k, v, mask_mod="causal ? q >= kv : true", params={"causal": True})
    assert_close(o, attention(q, k, v, mask=lambda b, h, qi, kv: qi >= kv)[0], atol=2e-5, what="bool parameter")


def test_document_mask_with_int_buffer_and_declarations():
    q, k, v = qkv(B=1, H=2, Sq=100, Skv=100)
    doc = np.repeat(np.arange(4, dtype=np.int32), 25)
    o = flexjit.flex_attention(q, k, v, mask_mod="doc[q] == doc[kv]", buffers={"doc": doc})
    ro, _ = attention(q, k, v, mask=lambda b, h, qi, kv: doc[qi] == doc[kv])
    assert_close(o, ro, atol=2e-5, what="o")
    spec = flexjit.spec_of(q, k, v, mask_mod="doc[q] == doc[kv]", buffers={"doc": doc, "bias": (randn(2, 199), "H, L")})
    assert '"doc: i32[Sq]"' in spec and '"bias: f32[H, L]"' in spec


def test_strided_inputs_and_f16():
    q, k, v = qkv(B=2, H=2, Sq=64, Skv=64, D=16)
    qt = np.ascontiguousarray(q.transpose(0, 2, 1, 3)).transpose(0, 2, 1, 3)  # [B, S, H, D] memory
    kt = np.ascontiguousarray(k.transpose(0, 2, 1, 3)).transpose(0, 2, 1, 3)
    assert not qt.flags.c_contiguous
    assert_close(flexjit.flex_attention(qt, kt, v, mask_mod="q >= kv"), attention(q, k, v, mask=lambda b, h, qi, kv: qi >= kv)[0],
                 atol=2e-5, what="strided")
    q16, k16, v16 = (x.astype(np.float16) for x in (q, k, v))
    o16 = flexjit.flex_attention(q16, k16, v16, mask_mod="q >= kv")
    assert o16.dtype == np.float16
    assert_close(o16, attention(q16, k16, v16, mask=lambda b, h, qi, kv: qi >= kv)[0], atol=3e-3, what="f16")
    ro = q.copy()
    ro.flags.writeable = False
    flexjit.flex_attention(ro, k, v)


def test_block_mask_reuse():
    q, k, v = qkv(B=2, H=2, Sq=96, Skv=128)
    doc = np.repeat(np.arange(4, dtype=np.int32), 32)
    bm = flexjit.create_block_mask("doc[kv] <= doc[q] && kv - q < window", None, None, 96, 128, buffers={"doc": doc},
                                   params={"window": 40})
    assert bm.shape == (1, 1, 96, 128)

    def mask(b, h, qi, kv):
        return (doc[np.minimum(kv, 127)] <= doc[np.minimum(qi, 127)]) & (kv - qi < 40)

    for _ in range(2):
        q, k, v = qkv(B=2, H=2, Sq=96, Skv=128)
        o = flexjit.flex_attention(q, k, v, block_mask=bm)
        assert_close(o, attention(q, k, v, mask=mask)[0], atol=2e-5, what="o with the block mask")
    slopes = randn(2)
    o = flexjit.flex_attention(q, k, v, score_mod="score + s[h]", buffers={"s": slopes}, block_mask=bm)
    assert_close(o, attention(q, k, v, score=lambda s, b, h, qi, kv: s + slopes[h], mask=mask)[0], atol=2e-5, what="score + mask")
    with pytest.raises(ValueError, match="Q_LEN=96"):
        flexjit.flex_attention(*qkv(Sq=64, Skv=128), block_mask=bm)
    with pytest.raises(ValueError, match="not both"):
        flexjit.flex_attention(q, k, v, mask_mod="q >= kv", block_mask=bm)
    with pytest.raises(flexjit.CompileError, match="E0201"):
        flexjit.create_block_mask("q >= kvv", 1, 1, 64, 64)


def test_diagnostics_are_exceptions():
    q, k, v = qkv(Sq=32, Skv=32)
    with pytest.raises(flexjit.CompileError) as info:
        flexjit.flex_attention(q, k, v, score_mod="score + rel_h[b, h, q, kvv // 8] + foo(1)", buffers={"rel_h": randn(2, 4, 32, 4)})
    e = info.value
    assert isinstance(e, flexjit.FlexjitError) and isinstance(e, RuntimeError)
    codes = [d["code"] for d in e.diagnostics]
    assert codes == ["E0201", "E0202"], codes
    assert e.diagnostics[0]["line"] == 1 and e.diagnostics[0]["col"] == 24 and "did you mean `kv`" in e.diagnostics[0]["label"]
    assert "^^^" in e.text and e.text == str(e)
    with pytest.raises(flexjit.CompileError, match="E0208"):
        flexjit.flex_attention(q, k, v, mask_mod="q - kv")
    with pytest.raises(flexjit.CompileError, match="built-in name"):
        flexjit.flex_attention(q, k, v, score_mod="score", buffers={"q": randn(4)})


def test_bad_inputs_raise_clear_errors():
    q, k, v = qkv(Sq=32, Skv=32)
    cases = [
        (lambda: flexjit.flex_attention(q.astype(np.float64), k, v), flexjit.FlexjitError, "q is float64; flexjit takes float32, float16, bfloat16"),
        (lambda: flexjit.flex_attention(q, k.astype(np.float16), v), flexjit.FlexjitError, "must all be f32"),
        (lambda: flexjit.flex_attention(q[0], k, v), ValueError, r"4 dimensions \[B, H, Sq, D\]"),
        (lambda: flexjit.flex_attention(q, k[:, :, :, :16], v), flexjit.FlexjitError, r"must be \[B, Hkv, Skv, D\] = \[2, 4, 32, 32\]"),
        (lambda: flexjit.flex_attention(q, k, v[:1]), flexjit.FlexjitError, r"v has shape \[1, 4, 32, 32\]"),
        (lambda: flexjit.flex_attention(q.tolist(), k, v), TypeError, "must be an array"),
        (lambda: flexjit.flex_attention(q, k, None), TypeError, "must be an array"),
        (lambda: flexjit.flex_attention(q, k, v, score_mod="score + bias[h]"), flexjit.CompileError, "unknown buffer `bias`"),
        (lambda: flexjit.flex_attention(q, k, v, score_mod="score + bias[h]", buffers={"bias": randn(4).astype(np.float64)}),
         flexjit.FlexjitError, "buffer `bias` is float64"),
        (lambda: flexjit.flex_attention(q, k, v, score_mod="score + bias[h]", buffers={"bias": [1.0, 2.0]}), flexjit.FlexjitError,
         "not an array"),
        (lambda: flexjit.flex_attention(q, k, v, score_mod="score + bias[h]", buffers=[randn(4)]), flexjit.FlexjitError, "dict"),
        (lambda: flexjit.flex_attention(q, k, v, score_mod="score + bias[h, q]", buffers={"bias": randn(4)}), flexjit.CompileError,
         "E0205"),
        (lambda: flexjit.flex_attention(q, k, v, mask_mod="q - kv < w", params={"w": "ten"}), flexjit.FlexjitError, "bool, int or float"),
        (lambda: flexjit.flex_attention(q, k, v, mask_mod="q - kv < w"), flexjit.CompileError, "unknown name `w`"),
        (lambda: flexjit.flex_attention(q, k, v, score_mod=3), flexjit.FlexjitError, "must be a str"),
        (lambda: flexjit.flex_attention(q, k, v, scale=-1.0), ValueError, "scale"),
        (lambda: flexjit.flex_attention(q, k, v, block_mask="causal"), TypeError, "create_block_mask"),
        (lambda: flexjit.flex_attention_backward(q, k, v, q, q[..., 0], q, grad_buffers=("nope",)), ValueError, "nope"),
        (lambda: flexjit.flex_attention_backward(q, k, v, q, q, q), flexjit.FlexjitError, "lse"),
    ]
    for call, error, pattern in cases:
        with pytest.raises(error, match=pattern):
            call()


def test_out_of_range_indices_are_reported_not_read():
    q, k, v = qkv(Sq=32, Skv=32)
    with pytest.raises(flexjit.FlexjitError, match=r"buffer `bias`: an index of `bias\[kv\]` was out of range and was clamped"):
        flexjit.flex_attention(q, k, v, score_mod="score + bias[kv]", buffers={"bias": randn(4)})


def test_arrays_on_another_device_are_refused():
    q, k, v = qkv(Sq=32, Skv=32)
    with pytest.raises(flexjit.FlexjitError, match=r"k is on cuda:0 but q is on cpu"):
        flexjit.flex_attention(q, FakeCudaArray(k), v)
    with pytest.raises(flexjit.FlexjitError, match=r"buffer `bias` is on cuda:1 but q is on cpu"):
        flexjit.flex_attention(q, k, v, score_mod="score + bias[h]", buffers={"bias": FakeCudaArray(randn(4), device=1)})


def test_ragged_prefill_matches_dense_per_sequence():
    lengths_q, lengths_kv = [17, 64, 5], [30, 64, 40]
    H, D = 2, 16
    cu_q = np.concatenate([[0], np.cumsum(lengths_q)]).astype(np.int32)
    cu_kv = np.concatenate([[0], np.cumsum(lengths_kv)]).astype(np.int32)
    q, k, v = randn(cu_q[-1], H, D), randn(cu_kv[-1], H, D), randn(cu_kv[-1], H, D)
    bias = randn(3)
    o, lse = flexjit.forward_varlen(q, k, v, cu_q, cu_kv, 64, 64, score_mod="score + bias[b]", mask_mod="kv <= q + 10",
                                    buffers={"bias": bias}, return_lse=True)
    assert o.shape == q.shape and lse.shape == (H, cu_q[-1])
    for s in range(3):
        qs = q[cu_q[s]:cu_q[s + 1]].transpose(1, 0, 2)[None]
        ks = k[cu_kv[s]:cu_kv[s + 1]].transpose(1, 0, 2)[None]
        vs = v[cu_kv[s]:cu_kv[s + 1]].transpose(1, 0, 2)[None]
        ro, rlse = attention(qs, ks, vs, score=lambda x, b, h, qi, kv: x + bias[s], mask=lambda b, h, qi, kv: kv <= qi + 10)
        assert_close(o[cu_q[s]:cu_q[s + 1]].transpose(1, 0, 2)[None], ro, atol=3e-5, what=f"sequence {s}")
        assert_close(lse[:, cu_q[s]:cu_q[s + 1]][None], rlse, atol=3e-5, what=f"lse of sequence {s}")


def test_ragged_backward_matches_dense_per_sequence():
    # A sequence of one query row, one without query rows (its dk and dv are zeros), GQA 2:1, a learnable slope per
    # sequence (read at b), whose gradient is each sequence's sum of dS * (kv - q) / 8.
    lengths_q, lengths_kv = [17, 1, 0, 40], [30, 3, 9, 40]
    H, Hkv, D = 4, 2, 16
    cu_q = np.concatenate([[0], np.cumsum(lengths_q)]).astype(np.int32)
    cu_kv = np.concatenate([[0], np.cumsum(lengths_kv)]).astype(np.int32)
    q, k, v = randn(cu_q[-1], H, D), randn(cu_kv[-1], Hkv, D), randn(cu_kv[-1], Hkv, D)
    slope = randn(4)
    args = dict(score_mod="score + slope[b] * (kv - q) * 0.125", mask_mod="kv <= q + 10", buffers={"slope": slope})
    o, lse = flexjit.forward_varlen(q, k, v, cu_q, cu_kv, 64, 64, return_lse=True, **args)
    d_o = randn(*o.shape)
    dq, dk, dv, grads = flexjit.backward_varlen(q, k, v, o, lse, d_o, cu_q, cu_kv, 64, 64, grad_buffers=("slope",), **args)
    assert dq.shape == q.shape and dk.shape == k.shape and dv.shape == v.shape and grads["slope"].shape == (4,)
    want_slope = np.zeros(4)
    for s in range(4):
        rows_q, rows_kv = slice(cu_q[s], cu_q[s + 1]), slice(cu_kv[s], cu_kv[s + 1])
        if lengths_q[s] == 0:
            assert np.all(dk[rows_kv] == 0) and np.all(dv[rows_kv] == 0)
            continue
        dense = [x[rows].transpose(1, 0, 2)[None] for x, rows in ((q, rows_q), (k, rows_kv), (v, rows_kv), (d_o, rows_q))]
        score = lambda x, b, h, qi, kv: x + slope[s] * (kv - qi) * 0.125  # noqa: E731
        rdq, rdk, rdv, ds = attention_grads(*dense, score=score, mask=lambda b, h, qi, kv: kv <= qi + 10)
        assert_close(dq[rows_q].transpose(1, 0, 2)[None], rdq, atol=1e-4, what=f"dq of sequence {s}")
        assert_close(dk[rows_kv].transpose(1, 0, 2)[None], rdk, atol=1e-4, what=f"dk of sequence {s}")
        assert_close(dv[rows_kv].transpose(1, 0, 2)[None], rdv, atol=1e-4, what=f"dv of sequence {s}")
        _, _, qi, kv = np.indices(ds.shape)
        want_slope[s] = (ds * (kv - qi) * 0.125).sum()
    assert_close(grads["slope"], want_slope, atol=2e-4, rtol=1e-4, what="d slope")
    with pytest.raises(flexjit.FlexjitError, match="max_seqlen_q"):
        flexjit.backward_varlen(q, k, v, o, lse, d_o, cu_q, cu_kv, 16, 64, **args)


@pytest.mark.parametrize("page_size", [0, 16])
def test_decode_contiguous_and_paged(page_size):
    B, H, Hkv, D, cap = 3, 4, 2, 16, 64
    plan = flexjit.plan_decode(mask_mod="kv > q - window", batch=B, heads=H, kv_heads=Hkv, head_dim=D, max_seqlen_kv=cap, max_seqlen_q=2,
                               dtype="f32", device="cpu", page_size=page_size, params={"window": 20})
    assert plan.num_splits == 1
    kv_lens = np.array([10, 64, 33], dtype=np.int32)
    k_dense, v_dense = randn(B, Hkv, cap, D), randn(B, Hkv, cap, D)
    q = randn(B, H, 2, D)
    if page_size:
        pages = cap // page_size
        order = RNG.permutation(B * pages).astype(np.int32)
        table = order.reshape(B, pages)
        k_cache = np.empty((B * pages, page_size, Hkv, D), np.float32)
        v_cache = np.empty_like(k_cache)
        for b in range(B):
            for i in range(pages):
                k_cache[table[b, i]] = k_dense[b, :, i * page_size:(i + 1) * page_size].transpose(1, 0, 2)
                v_cache[table[b, i]] = v_dense[b, :, i * page_size:(i + 1) * page_size].transpose(1, 0, 2)
        o = flexjit.decode(plan, q, k_cache, v_cache, kv_lens, page_table=table)
    else:
        o = flexjit.decode(plan, q, k_dense, v_dense, kv_lens)
    for b in range(B):
        n = int(kv_lens[b])
        qpos = n - 2
        ro, _ = attention(q[b:b + 1], k_dense[b:b + 1, :, :n], v_dense[b:b + 1, :, :n],
                          mask=lambda bb, h, qi, kv: kv > qi + qpos - 20)
        assert_close(o[b:b + 1], ro, atol=3e-5, what=f"sequence {b}")
    with pytest.raises(flexjit.FlexjitError, match="kv_lens"):
        flexjit.decode(plan, q, k_dense if not page_size else k_cache, v_dense if not page_size else v_cache,
                       np.array([10, 65, 3], dtype=np.int32), page_table=table if page_size else None)
