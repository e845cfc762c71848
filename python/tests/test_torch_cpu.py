"""flexjit.torch on CPU tensors (the CPU backend): autograd (eager, and the custom ops' opcheck and
torch.compile without graph breaks) and the drop-in's translation of FlexAttention callables.
Skipped where torch is not installed (CI)."""
import pytest

torch = pytest.importorskip("torch")

import flexjit  # noqa: E402
import flexjit.torch as fjt  # noqa: E402
from gallery import attention_gym, gallery, launch  # noqa: E402
from torch.nn.attention import flex_attention as torch_flex  # noqa: E402
from torch_reference import assert_close, reference  # noqa: E402

pytestmark = pytest.mark.skipif(not flexjit.has_cpu_backend(), reason="this build has no CPU backend")

B, H, S, D = 2, 4, 64, 16


def qkv(requires_grad=False, seed=0, heads_kv=H):
    g = torch.Generator().manual_seed(seed)
    shapes = ((B, H, S, D), (B, heads_kv, S, D), (B, heads_kv, S, D))
    return [torch.randn(*s, generator=g).requires_grad_(requires_grad) for s in shapes]


def torch_flex_attention(q, k, v, case_score, case_mask):
    block_mask = torch_flex.create_block_mask(case_mask, None, None, S, S, device="cpu") if case_mask else None
    return torch_flex.flex_attention(q, k, v, score_mod=case_score, block_mask=block_mask)


@pytest.mark.parametrize("case", gallery(B, H, S, "cpu"), ids=lambda c: c.name)
def test_gallery_forward_string_api_and_drop_in_match_flex_attention(case):
    q, k, v = qkv()
    expected = torch_flex_attention(q, k, v, case.score_mod, case.mask_mod)
    for api in ("string", "drop-in"):
        assert_close(launch(case, api, q, k, v), expected, atol=2e-5, what=api)


@pytest.mark.parametrize("name", [c.name for c in gallery(B, H, S, "cpu") if c.grads or c.name == "causal"])
def test_gallery_backward_with_buffer_gradients(name):
    for api in ("string", "drop-in"):
        case = {c.name: c for c in gallery(B, H, S, "cpu", requires_grad=True)}[name]
        q, k, v = qkv(requires_grad=True)
        o = launch(case, api, q, k, v)
        expected, _ = reference(q, k, v, case.score_mod, case.mask_mod)
        leaves = [q, k, v] + [case.buffers[n] for n in case.grads]
        d_o = torch.randn_like(o)
        got = torch.autograd.grad(o, leaves, d_o)
        want = torch.autograd.grad(expected, leaves, d_o)
        for what, a, b in zip(["dq", "dk", "dv"] + list(case.grads), got, want):
            assert_close(a, b, atol=2e-4, rtol=1e-4, what=f"{api}: {what}")


def test_eager_gradients_skip_the_custom_op_dispatch():
    # Eager calls that need gradients take the autograd.Function (a few us of host time), not the custom op (about
    # 130 us of Python dispatch); torch.compile traces the op (test_compile_fullgraph_string_api_and_drop_in).
    q, k, v = qkv(requires_grad=True)
    o = flexjit.flex_attention(q, k, v, mask_mod="q >= kv")
    assert type(o.grad_fn).__name__ == "_EagerAttentionBackward"
    with torch.no_grad():
        assert flexjit.flex_attention(q, k, v, mask_mod="q >= kv").grad_fn is None


@pytest.mark.parametrize("name,score_mod,mask_mod", attention_gym(B, H, S, "cpu"), ids=lambda x: x if isinstance(x, str) else "")
def test_attention_gym_mods_translate_and_match_flex_attention(name, score_mod, mask_mod):
    q, k, v = qkv(seed=3)
    expected = torch_flex_attention(q, k, v, score_mod, mask_mod)
    bm = fjt.create_block_mask(mask_mod, None, None, S, S) if mask_mod else None
    got = fjt.flex_attention(q, k, v, score_mod=score_mod, block_mask=bm)
    assert_close(got, expected, atol=2e-5, what=name)


def test_translations_read_as_the_language():
    cap, window = 20.0, 16
    slope = torch.randn(H)

    def softcap(score, b, h, q_idx, kv_idx):
        return cap * torch.tanh(score / cap)

    def alibi_window(score, b, h, q_idx, kv_idx):
        d = kv_idx - q_idx
        return torch.where(d.abs() <= window, score + slope[h] * d, -float("inf"))

    # Captured numbers are constants of the translation, as torch.compile specialises them.
    assert fjt.translate(softcap, "score_mod").text == "(20.0 * tanh((score / 20.0)))"
    t = fjt.translate(alibi_window, "score_mod")
    assert t.text == "let tmp0 = (kv - q);\nwhere((abs(tmp0) <= 16), (score + (slope[h] * tmp0)), (-inf))"
    assert [name for name, _ in t.buffers] == ["slope"] and t.params == () and [v for _, v in t.consts] == [16]
    assert fjt.translate(torch_flex.noop_mask, "mask_mod").text == "true"

    def control_flow(b, h, q_idx, kv_idx):
        if window > 8:  # Python needs the value: `window` becomes a constant of the translation
            return q_idx - kv_idx < window
        return q_idx >= kv_idx

    assert fjt.translate(control_flow, "mask_mod").text == "((q - kv) < 16)"


def test_untranslatable_operations_are_named():
    table = torch.randn(S, S)

    def gather(score, b, h, q_idx, kv_idx):
        return score + torch.gather(table, 0, q_idx)

    def branch(b, h, q_idx, kv_idx):
        return q_idx >= kv_idx if q_idx > 3 else False

    def python_min(score, b, h, q_idx, kv_idx):
        return score + min(q_idx, kv_idx)

    def slicing(score, b, h, q_idx, kv_idx):
        return score + table[q_idx, :].sum()

    def whole(score, b, h, q_idx, kv_idx):
        return score + table

    cases = [(gather, "torch.gather has no counterpart"), (branch, "Python control flow"), (python_min, "torch.minimum"),
             (slicing, "slice"), (whole, "used as a whole")]
    q, k, v = qkv()
    for fn, pattern in cases:
        kind = "mask_mod" if fn is branch else "score_mod"
        with pytest.raises(fjt.TranslationError, match=pattern) as info:
            if kind == "mask_mod":
                fjt.create_block_mask(fn, None, None, S, S)
            else:
                fjt.flex_attention(q, k, v, score_mod=fn)
        assert fn.__name__ in str(info.value) and "test_torch_cpu.py" in str(info.value)


def test_captures_through_modules_methods_and_globals():
    class RelPos(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.bias = torch.nn.Parameter(torch.randn(H, S))
            self.scale = 0.5

        def score_mod(self, score, b, h, q_idx, kv_idx):
            return score + self.scale * self.bias[h, kv_idx]

    m = RelPos()
    q, k, v = qkv(requires_grad=True)
    o = fjt.flex_attention(q, k, v, score_mod=m.score_mod)
    expected, _ = reference(q, k, v, m.score_mod)
    assert_close(o, expected, atol=2e-5, what="o")
    g = torch.randn_like(o)
    assert_close(torch.autograd.grad(o, m.bias, g)[0], torch.autograd.grad(expected, m.bias, g)[0], atol=2e-4, what="d bias")
    assert fjt.translate(m.score_mod, "score_mod").params == ()  # scale is a constant until it changes
    m.scale = 2.0  # a new value of a captured number: translated again, with the number as a runtime parameter
    with torch.no_grad():
        assert_close(fjt.flex_attention(q, k, v, score_mod=m.score_mod), reference(q, k, v, m.score_mod)[0], atol=2e-5, what="new scale")
    assert [name for name, _ in fjt.translate(m.score_mod, "score_mod").params] == ["scale"]


def make_block_bias(table, block):
    def block_bias(score, b, h, q_idx, kv_idx):
        return score + table[h, kv_idx // block]

    return block_bias


def test_captured_numbers_are_constants_until_they_change():
    # A captured int as a divisor: as a constant the kernel divides by a constant (and proves the index in range);
    # a mod made for several values becomes one translation with a runtime parameter, not one per value.
    table = torch.randn(H, S)
    q, k, v = qkv()
    texts = []
    for block in (16, 8, 4, 16):
        fn = make_block_bias(table, block)
        with torch.no_grad():
            assert_close(fjt.flex_attention(q, k, v, score_mod=fn), reference(q, k, v, fn)[0], atol=2e-5, what=f"block {block}")
        t = fjt.translate(fn, "score_mod")
        texts.append((t.text, [name for name, _ in t.params]))
    assert texts[0] == ("(score + table[h, (kv // 16)])", [])
    assert texts[1] == texts[2] == ("(score + table[h, (kv // block)])", ["block"])
    assert texts[3] == texts[0]  # the specialised translation still serves its value


def test_compiled_graph_guards_on_a_specialised_number():
    # One closure whose captured number changes between calls of a compiled model: the graph holds the translation's
    # text as a constant, so it must guard on the number the text holds.
    table = torch.randn(H, S)
    block = 16

    def block_bias(score, b, h, q_idx, kv_idx):
        return score + table[h, kv_idx // block]

    compiled = torch.compile(lambda q, k, v: fjt.flex_attention(q, k, v, score_mod=block_bias), fullgraph=True, backend="aot_eager")
    q, k, v = qkv()
    for block in (16, 8, 4, 16, 2):
        with torch.no_grad():
            assert_close(compiled(q, k, v), reference(q, k, v, block_bias)[0], atol=2e-5, what=f"compiled, block {block}")


def test_one_tensor_in_two_cells_then_two():
    def make(a, b):
        def mod(score, b_, h, q_idx, kv_idx):
            return score + a[kv_idx] - 2 * b[q_idx]

        return mod

    q, k, v = qkv()
    t = torch.randn(S)
    for fn in (make(t, t), make(t, torch.randn(S))):
        assert_close(fjt.flex_attention(q, k, v, score_mod=fn), reference(q, k, v, fn)[0], atol=2e-5, what="o")


GLOBAL_BIAS = torch.randn(S)
GLOBAL_SHIFT = 3


def global_shift_mask(b, h, q_idx, kv_idx):
    return q_idx + GLOBAL_SHIFT >= kv_idx


def test_global_numbers_are_constants_checked_at_reuse():
    global GLOBAL_SHIFT
    assert fjt.translate(global_shift_mask, "mask_mod").text == "((q + 3) >= kv)"
    GLOBAL_SHIFT = 5
    try:
        assert fjt.translate(global_shift_mask, "mask_mod").text == "((q + 5) >= kv)"
    finally:
        GLOBAL_SHIFT = 3


def global_bias_mod(score, b, h, q_idx, kv_idx):
    return score + GLOBAL_BIAS[kv_idx]


def test_global_tensor_capture():
    q, k, v = qkv()
    assert_close(fjt.flex_attention(q, k, v, score_mod=global_bias_mod), reference(q, k, v, global_bias_mod)[0], atol=2e-5, what="o")


def test_block_mask_reuse_lse_gqa_and_aux():
    q, k, v = qkv(heads_kv=2)
    bm = fjt.create_block_mask(lambda b, h, q_idx, kv_idx: q_idx >= kv_idx, None, None, S, S)
    for _ in range(2):
        o, lse = fjt.flex_attention(q, k, v, block_mask=bm, enable_gqa=True, return_lse=True)
        eo, else_ = reference(q, k, v, mask_mod=lambda b, h, qi, kv: qi >= kv)
        assert_close(o, eo, atol=2e-5, what="o")
        assert_close(lse, else_, atol=2e-5, what="lse")
    o, aux = fjt.flex_attention(q, k, v, block_mask=bm, enable_gqa=True, return_aux=torch_flex.AuxRequest(lse=True))
    assert_close(aux.lse, else_, atol=2e-5, what="aux lse")
    with pytest.raises(ValueError, match="enable_gqa"):
        fjt.flex_attention(q, k, v, block_mask=bm)


def test_opcheck():
    from flexjit.torch import _ops

    q, k, v = qkv(requires_grad=True)
    rel = torch.randn(H, S, requires_grad=True)
    config = _ops.make_config("score + rel[h, kv] * w", "q >= kv", ["rel"], ["w:float"], ["rel"])
    result = torch.library.opcheck(torch.ops.flexjit.attention.default, (q, k, v, [rel], config, [0.5], 0.0, ""))
    assert all(v == "SUCCESS" for v in result.values()), result


def make_rel_mod(rel, weight):
    def rel_mod(score, b, h, q_idx, kv_idx):
        return score + rel[h, kv_idx] * weight

    return rel_mod


@pytest.mark.parametrize("backend", ["aot_eager", "inductor"])
def test_compile_fullgraph_string_api_and_drop_in(backend):
    # Under torch.compile the drop-in reads a mod's captures through its closure: mods made
    # outside the compiled function (a factory here, as attention-gym's generate_* functions).
    rel = torch.randn(H, S, requires_grad=True)
    rel_mod = make_rel_mod(rel, 0.5)
    bm = fjt.create_block_mask(attention_gym(B, H, S, "cpu")[0][2], None, None, S, S)

    def model(q, k, v, w):
        a = flexjit.flex_attention(q, k, v, score_mod="score + rel[h, kv]", mask_mod="q - kv < w", buffers={"rel": rel},
                                   params={"w": w})
        b = fjt.flex_attention(a, k, v, score_mod=rel_mod, block_mask=bm)
        c = fjt.flex_attention(b, k, v, score_mod=global_bias_mod)
        return (c * c).sum()

    compiled = torch.compile(model, fullgraph=True, backend=backend)
    for w in (16, 40):
        q, k, v = qkv(requires_grad=True, seed=w)
        expected = model(q, k, v, w)
        got = compiled(q, k, v, w)
        assert_close(got, expected, atol=1e-3, rtol=1e-5, what="loss")
        for a, b in zip(torch.autograd.grad(got, [q, k, v, rel]), torch.autograd.grad(expected, [q, k, v, rel])):
            assert_close(a, b, atol=1e-4, rtol=1e-5, what="gradient")
