"""flexjit on CUDA tensors, against torch.nn.attention.flex_attention and a float64 reference:
the gallery forward and backward (with buffer gradients) through the string API and the drop-in,
attention-gym mods, opcheck, torch.compile(fullgraph=True), CUDA-graph capture and replay,
streams, decode and ragged prefill. Skipped without torch or a CUDA device."""
import pytest

torch = pytest.importorskip("torch")
if not torch.cuda.is_available():
    pytest.skip("no CUDA device", allow_module_level=True)

import flexjit  # noqa: E402
import flexjit.torch as fjt  # noqa: E402
from gallery import attention_gym, gallery, launch  # noqa: E402
from torch.nn.attention import flex_attention as torch_flex  # noqa: E402
from torch_reference import assert_close, reference  # noqa: E402

DEV = "cuda"
B, H, S, D = 2, 4, 256, 64
DT = torch.bfloat16


def qkv(requires_grad=False, seed=0, heads_kv=H, S_=S, D_=D, dtype=DT):
    g = torch.Generator(device="cpu").manual_seed(seed)
    shapes = ((B, H, S_, D_), (B, heads_kv, S_, D_), (B, heads_kv, S_, D_))
    return [torch.randn(*s, generator=g).to(DEV, dtype).requires_grad_(requires_grad) for s in shapes]


def flex_reference(q, k, v, score_mod, mask_mod):
    """torch's FlexAttention on the same inputs (eager: its math path)."""
    bm = torch_flex.create_block_mask(mask_mod, None, None, q.shape[2], k.shape[2], device=DEV) if mask_mod else None
    return torch_flex.flex_attention(q, k, v, score_mod=score_mod, block_mask=bm)


def check_against(got, q, k, v, score_mod, mask_mod, what, tol=3e-2, exact=None):
    """got within `tol` of the float64 reference, and no further from it than FlexAttention in bf16 (x2).
    exact: the mods over float64 copies of the captured buffers, for the reference (default: the same mods)."""
    expected, _ = reference(q, k, v, *(exact or (score_mod, mask_mod)))
    flex = flex_reference(q, k, v, score_mod, mask_mod)
    assert_close(got, expected, atol=tol, rtol=tol, what=what)
    err = (got.double() - expected).abs().max().item()
    flex_err = (flex.double() - expected).abs().max().item()
    assert err <= 2 * flex_err + 1e-2, f"{what}: error {err:.3g} against float64, FlexAttention's {flex_err:.3g}"


@pytest.mark.parametrize("case", gallery(B, H, S, DEV, DT), ids=lambda c: c.name)
def test_gallery_forward(case):
    q, k, v = qkv()
    exact = {c.name: c for c in gallery(B, H, S, DEV, DT, exact=True)}[case.name]
    for api in ("string", "drop-in"):
        check_against(launch(case, api, q, k, v), q, k, v, case.score_mod, case.mask_mod, api, exact=(exact.score_mod, exact.mask_mod))
    flexjit.check_errors(0, torch.cuda.current_stream().cuda_stream)


@pytest.mark.parametrize("name", [c.name for c in gallery(B, H, S, "cpu") if c.grads or c.name in ("causal", "document")])
@pytest.mark.parametrize("api", ["string", "drop-in"])
def test_gallery_backward_with_buffer_gradients(name, api):
    case = {c.name: c for c in gallery(B, H, S, DEV, DT, requires_grad=True)}[name]
    q, k, v = qkv(requires_grad=True)
    o = launch(case, api, q, k, v)
    leaves = [q, k, v] + [case.buffers[n] for n in case.grads]
    d_o = torch.randn_like(o)
    got = torch.autograd.grad(o, leaves, d_o)
    expected, _ = reference(q, k, v, case.score_mod, case.mask_mod)
    want = torch.autograd.grad(expected, leaves, d_o.double())
    flex = flex_reference(q, k, v, case.score_mod, case.mask_mod)
    flex_grads = torch.autograd.grad(flex, leaves, d_o)
    for what, a, b, f in zip(["dq", "dk", "dv"] + list(case.grads), got, want, flex_grads):
        scale = b.abs().max().item()
        err, flex_err = (a.double() - b).abs().max().item(), (f.double() - b).abs().max().item()
        # offset_bias adds a per-row constant, which softmax ignores: its exact gradient is 0 (1e-15 in float64), a
        # sum of dS terms that cancel only up to the rounding of the bf16 O that D = rowsum(dO * O) reads. Such a
        # gradient is held to FlexAttention's error, which has the same cause, rather than to its own size.
        atol = 5e-2 * max(scale, 1e-3) if scale > 1e-6 else 2 * flex_err + 1e-3
        assert_close(a, b, atol=atol, rtol=5e-2, what=f"{api}: {what}")
        assert err <= 2 * flex_err + 1e-2 * scale, f"{api}: {what}: error {err:.3g}, FlexAttention's {flex_err:.3g}"


@pytest.mark.parametrize("name,score_mod,mask_mod", attention_gym(B, H, S, DEV, DT), ids=lambda x: x if isinstance(x, str) else "")
def test_attention_gym_mods(name, score_mod, mask_mod):
    q, k, v = qkv(seed=5)
    bm = fjt.create_block_mask(mask_mod, None, None, S, S) if mask_mod else None
    check_against(fjt.flex_attention(q, k, v, score_mod=score_mod, block_mask=bm), q, k, v, score_mod, mask_mod, name)


def test_opcheck_on_cuda():
    from flexjit.torch import _ops

    q, k, v = qkv(requires_grad=True)
    rel = torch.randn(H, S, device=DEV, dtype=DT, requires_grad=True)
    config = _ops.make_config("score + rel[h, kv] * w", "q >= kv", ["rel"], ["w:float"], ["rel"])
    result = torch.library.opcheck(torch.ops.flexjit.attention.default, (q, k, v, [rel], config, [0.5], 0.0, ""))
    assert all(v == "SUCCESS" for v in result.values()), result


class Block(torch.nn.Module):
    """A pre-norm transformer block whose attention is flexjit with a learnable relative bias."""

    def __init__(self, dim=256, heads=4, window=64):
        super().__init__()
        self.heads, self.window = heads, window
        self.norm1, self.norm2 = torch.nn.LayerNorm(dim), torch.nn.LayerNorm(dim)
        self.qkv, self.proj = torch.nn.Linear(dim, 3 * dim), torch.nn.Linear(dim, dim)
        self.mlp = torch.nn.Sequential(torch.nn.Linear(dim, 4 * dim), torch.nn.GELU(), torch.nn.Linear(4 * dim, dim))
        self.bias = torch.nn.Parameter(torch.zeros(heads, 2 * S - 1))

    def forward(self, x):
        b, n, c = x.shape
        q, k, v = self.qkv(self.norm1(x)).view(b, n, 3, self.heads, c // self.heads).permute(2, 0, 3, 1, 4)
        a = flexjit.flex_attention(q, k, v, score_mod="score + bias[h, q - kv + Skv - 1]", mask_mod="q >= kv && q - kv < window",
                                   buffers={"bias": self.bias}, params={"window": self.window})
        x = x + self.proj(a.transpose(1, 2).reshape(b, n, c))
        return x + self.mlp(self.norm2(x))


def test_model_under_torch_compile_fullgraph():
    torch.manual_seed(0)
    model = Block().to(DEV, DT)
    with torch.no_grad():
        model.bias.normal_(0, 0.5)
    x = torch.randn(B, S, 256, device=DEV, dtype=DT, requires_grad=True)
    compiled = torch.compile(model, fullgraph=True)
    expected = model(x)
    got = compiled(x)
    assert_close(got, expected, atol=3e-2, rtol=3e-2, what="block output")
    g = torch.randn_like(got)
    grads = torch.autograd.grad(got, [x, model.bias, model.qkv.weight], g)
    want = torch.autograd.grad(expected, [x, model.bias, model.qkv.weight], g)
    for what, a, b in zip(["dx", "d bias", "d qkv.weight"], grads, want):
        assert_close(a, b, atol=5e-2 * b.abs().max().item(), rtol=5e-2, what=what)


def test_cuda_graph_capture_and_replay_with_new_inputs():
    q, k, v = qkv()
    bias = torch.randn(H, 2 * S - 1, device=DEV, dtype=DT)
    bm = fjt.create_block_mask(lambda b, h, q_idx, kv_idx: q_idx >= kv_idx, None, None, S, S)

    def step(q, k, v):
        return flexjit.flex_attention(q, k, v, score_mod="score + bias[h, q - kv + Skv - 1]", buffers={"bias": bias}, block_mask=bm)

    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        step(q, k, v)  # warm-up: compiles, loads, builds the block mask and the workspace
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = step(q, k, v)
    for seed in (1, 2):
        nq, nk, nv = qkv(seed=seed)
        q.copy_(nq), k.copy_(nk), v.copy_(nv)
        graph.replay()
        torch.cuda.synchronize()
        expected = step(nq, nk, nv)
        assert torch.equal(out, expected), f"replay {seed} differs from an eager launch"
        mod = lambda s, b, h, qi, kv: s + bias[h, qi - kv + S - 1]  # noqa: E731
        check_against(out, nq, nk, nv, mod, lambda b, h, qi, kv: qi >= kv, f"replay {seed}")


def test_training_step_in_a_cuda_graph():
    q, k, v = qkv(requires_grad=True)
    rel = torch.randn(H, S, device=DEV, dtype=DT, requires_grad=True)

    def step():
        o = flexjit.flex_attention(q, k, v, score_mod="score + rel[h, kv]", mask_mod="q >= kv", buffers={"rel": rel})
        return torch.autograd.grad((o.float() ** 2).sum(), [q, k, v, rel])

    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(2):
            step()
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        grads = step()
    with torch.no_grad():
        q.copy_(qkv(seed=9)[0])
    graph.replay()
    torch.cuda.synchronize()
    for a, b in zip(grads, step()):
        assert_close(a, b, atol=1e-2 * b.abs().max().item(), what="gradient after replay")


def test_launches_go_to_the_current_stream():
    q, k, v = qkv()
    new_q = qkv(seed=4)[0]
    expected = flexjit.flex_attention(new_q, k, v, mask_mod="q >= kv")
    stream = torch.cuda.Stream()  # torch's streams do not synchronise with the legacy default stream
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        torch.cuda._sleep(100_000_000)  # delays the copy: a launch on another stream would read the old q
        q.copy_(new_q)
        o = flexjit.flex_attention(q, k, v, mask_mod="q >= kv")
    stream.synchronize()
    assert torch.equal(o, expected)


def test_wrong_devices_and_dtypes_are_errors():
    q, k, v = qkv()
    with pytest.raises(flexjit.FlexjitError, match="is on cpu but q is on cuda:0"):
        flexjit.flex_attention(q, k.cpu(), v)
    with pytest.raises(flexjit.FlexjitError, match="buffer `bias`"):
        flexjit.flex_attention(q, k, v, score_mod="score + bias[h]", buffers={"bias": torch.randn(H)})
    with pytest.raises(flexjit.FlexjitError):
        flexjit.flex_attention(q.float(), k.float(), v.float())  # f32 runs on the CPU backend only


def test_block_mask_reuse_on_the_gpu():
    doc = torch.repeat_interleave(torch.arange(4, device=DEV, dtype=torch.int32), S // 4)
    bm = flexjit.create_block_mask("doc[q] == doc[kv] && q >= kv", None, None, S, S, buffers={"doc": doc})
    for seed in range(3):
        q, k, v = qkv(seed=seed)
        o = flexjit.flex_attention(q, k, v, block_mask=bm)
        check_against(o, q, k, v, None, lambda b, h, qi, kv: (doc[qi] == doc[kv]) & (qi >= kv), f"launch {seed}")


def test_decode_paged_and_ragged_prefill_on_cuda():
    Bd, Hd, Hkv, cap, page = 3, 8, 2, 512, 16
    plan = flexjit.plan_decode(mask_mod="kv > q - window", batch=Bd, heads=Hd, kv_heads=Hkv, head_dim=D, max_seqlen_kv=cap, dtype=DT,
                               device="cuda:0", page_size=page, params={"window": 100})
    pages = cap // page
    table = torch.randperm(Bd * pages, device=DEV, dtype=torch.int32).view(Bd, pages)
    k_cache = torch.randn(Bd * pages, page, Hkv, D, device=DEV, dtype=DT)
    v_cache = torch.randn_like(k_cache)
    kv_lens = torch.tensor([37, 512, 300], device=DEV, dtype=torch.int32)
    q = torch.randn(Bd, Hd, 1, D, device=DEV, dtype=DT)
    o = flexjit.decode(plan, q, k_cache, v_cache, kv_lens, page_table=table)
    for b in range(Bd):
        n = int(kv_lens[b])
        kk = k_cache[table[b]].reshape(-1, Hkv, D)[:n].transpose(0, 1)[None]
        vv = v_cache[table[b]].reshape(-1, Hkv, D)[:n].transpose(0, 1)[None]
        expected, _ = reference(q[b:b + 1], kk, vv, mask_mod=lambda bb, h, qi, kv: kv > qi + (n - 1) - 100)
        assert_close(o[b:b + 1], expected, atol=3e-2, rtol=3e-2, what=f"decode sequence {b}")

    lengths = [100, 256, 37]
    cu = torch.tensor([0, 100, 356, 393], device=DEV, dtype=torch.int32)
    qv, kv_, vv_ = (torch.randn(393, H, D, device=DEV, dtype=DT) for _ in range(3))
    o = flexjit.forward_varlen(qv, kv_, vv_, cu, cu, 256, 256, mask_mod="q >= kv")
    for s, n in enumerate(lengths):
        a, b = int(cu[s]), int(cu[s + 1])
        expected, _ = reference(qv[a:b].transpose(0, 1)[None], kv_[a:b].transpose(0, 1)[None], vv_[a:b].transpose(0, 1)[None],
                                mask_mod=lambda bb, h, qi, kv: qi >= kv)
        assert_close(o[a:b].transpose(0, 1)[None], expected, atol=3e-2, rtol=3e-2, what=f"varlen sequence {s}")


@pytest.mark.parametrize("fp8", [torch.float8_e4m3fn, torch.float8_e5m2])
def test_ragged_prefill_over_fp8_k_and_v_on_cuda(fp8):
    # K and V stored in FP8 with per-KV-head scales; the reference runs on the same dequantised values.
    Hkv = 2
    lengths = [100, 300, 1]
    cu = torch.tensor([0, 100, 400, 401], device=DEV, dtype=torch.int32)
    qv = torch.randn(401, H, D, device=DEV, dtype=DT)
    k8, v8 = ((torch.randn(401, Hkv, D, device=DEV) * 4).to(fp8) for _ in range(2))
    k_scale = torch.tensor([0.25, 0.5], device=DEV)
    v_scale = torch.tensor([1.0, 0.125], device=DEV)
    o, lse = flexjit.forward_varlen(qv, k8, v8, cu, cu, 300, 300, mask_mod="q >= kv", k_scale=k_scale, v_scale=v_scale, return_lse=True)
    assert torch.isfinite(o).all() and torch.isfinite(lse).all()
    kd = (k8.float() * k_scale[None, :, None]).to(DT)
    vd = (v8.float() * v_scale[None, :, None]).to(DT)
    for s, n in enumerate(lengths):
        a, b = int(cu[s]), int(cu[s + 1])
        kk, vv = (x[a:b].transpose(0, 1)[None] for x in (kd, vd))
        expected, _ = reference(qv[a:b].transpose(0, 1)[None], kk, vv, mask_mod=lambda bb, h, qi, kv: qi >= kv)
        assert_close(o[a:b].transpose(0, 1)[None], expected, atol=3e-2, rtol=3e-2, what=f"FP8 varlen sequence {s}")


def test_chunked_prefill_with_queries_at_kv_end_on_cuda():
    # Each sequence's query rows are its last KV positions: a causal mask lets the new tokens see their prefix.
    lq, lkv = [3, 100], [50, 300]
    cu_q = torch.tensor([0, 3, 103], device=DEV, dtype=torch.int32)
    cu_kv = torch.tensor([0, 50, 350], device=DEV, dtype=torch.int32)
    qv = torch.randn(103, H, D, device=DEV, dtype=DT)
    kv_, vv_ = (torch.randn(350, H, D, device=DEV, dtype=DT) for _ in range(2))
    o = flexjit.forward_varlen(qv, kv_, vv_, cu_q, cu_kv, 100, 300, mask_mod="q >= kv", queries_at_kv_end=True)
    for s in range(2):
        qa, qb, ka, kb = int(cu_q[s]), int(cu_q[s + 1]), int(cu_kv[s]), int(cu_kv[s + 1])
        shift = lkv[s] - lq[s]
        expected, _ = reference(qv[qa:qb].transpose(0, 1)[None], kv_[ka:kb].transpose(0, 1)[None], vv_[ka:kb].transpose(0, 1)[None],
                                mask_mod=lambda bb, h, qi, kv: qi + shift >= kv)
        assert_close(o[qa:qb].transpose(0, 1)[None], expected, atol=3e-2, rtol=3e-2, what=f"chunked prefill sequence {s}")
