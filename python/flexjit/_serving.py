"""Serving launches of the string API: decode with a (paged) KV cache, and ragged prefill of
packed sequences."""
from . import _arrays
from ._attention import grad_outputs, launch_scale
from ._flexjit import backward_varlen as _backward_varlen
from ._flexjit import decode as _decode
from ._flexjit import forward_varlen as _forward_varlen
from ._flexjit import plan_decode as _plan_decode

_DTYPES = {"bf16": "bf16", "bfloat16": "bf16", "f16": "f16", "float16": "f16", "half": "f16", "f32": "f32", "float32": "f32",
           "float": "f32"}


# numpy arrays of ml_dtypes' FP8 types, by dtype name: the plan's kv_dtype they must match.
_ML_DTYPES_FP8 = {"float8_e4m3fn": "f8e4m3", "float8_e5m2": "f8e5m2"}


def _dtype_text(dtype):
    """The name of a dtype given as text, numpy, torch or ml_dtypes dtype ("torch." dropped)."""
    if isinstance(dtype, str):
        text = dtype
    elif isinstance(getattr(dtype, "name", None), str):
        text = dtype.name
    elif isinstance(getattr(dtype, "__name__", None), str):
        text = dtype.__name__
    else:
        text = str(dtype)
    return text.replace("torch.", "")


def dtype_name(dtype):
    """flexjit's name ("bf16", "f16", "f32") of a dtype given as text, numpy or torch dtype."""
    name = _DTYPES.get(_dtype_text(dtype))
    if name is None:
        raise ValueError(f"dtype must be bf16, f16 or f32, got {dtype!r}")
    return name


def kv_dtype_text(kv_dtype):
    """The KV cache dtype as the extension parses it ("" = the plan's dtype): "fp8" / "e4m3" /
    torch.float8_e4m3fn / ml_dtypes.float8_e4m3fn, "e5m2" / float8_e5m2, or bf16 / f16."""
    if kv_dtype is None:
        return ""
    text = _dtype_text(kv_dtype)
    return _DTYPES.get(text, text.lower())


def _fp8_bytes(cache, plan, name):
    """An ml_dtypes FP8 numpy array as its uint8 bytes (numpy cannot export it), checked against
    the plan's format; any other array as it is."""
    fmt = _ML_DTYPES_FP8.get(getattr(getattr(cache, "dtype", None), "name", None))
    if fmt is None or _arrays.is_torch(cache):
        return cache
    if fmt != plan.kv_dtype:
        raise ValueError(f"{name} is {cache.dtype.name} but the plan's kv_dtype is {plan.kv_dtype}; pass the cache in that format")
    return cache.view("uint8")


def device_index(device):
    """-1 for the CPU, else the CUDA ordinal of "cuda", "cuda:N", N or a torch.device."""
    if device is None:
        return -1
    if isinstance(device, int):
        return device
    text = str(device)
    if text == "cpu":
        return -1
    if text == "cuda":
        return 0
    if text.startswith("cuda:") and text[5:].isdigit():
        return int(text[5:])
    raise ValueError(f"device must be 'cpu', 'cuda', 'cuda:N' or a CUDA ordinal, got {device!r}")


class DecodePlan:
    """Made by ``plan_decode``: the split count and workspace of one batch shape, reused by
    every ``decode`` step (steps never allocate or synchronise, so they replay in CUDA graphs)."""

    def __init__(self, session, score_mod, mask_mod, buffers, params, heads, head_dim_v):
        self._session = session
        self.score_mod = score_mod
        self.mask_mod = mask_mod
        self.buffers = buffers
        self.params = params
        self.heads = heads
        self.head_dim_v = head_dim_v
        self.kv_dtype = session.kv_dtype  # "bf16", "f8e4m3", ...

    @property
    def num_splits(self):
        return self._session.num_splits

    @property
    def spec_json(self):
        return self._session.spec_json


def plan_decode(score_mod=None, mask_mod=None, *, batch, heads, kv_heads, head_dim, max_seqlen_kv, dtype, device="cpu",
                max_seqlen_q=1, head_dim_v=None, page_size=0, head_major_pages=False, num_splits=0, buffers=None, params=None,
                kv_dtype=None):
    """A decode plan for up to `batch` sequences of `heads` query heads over `kv_heads` KV
    heads, at most `max_seqlen_q` (1..16) new query rows and `max_seqlen_kv` positions each.
    page_size 0: contiguous caches [B, Hkv, Skv_cap, D]; 1..256: pages [num_pages, page_size,
    Hkv, D] (head_major_pages: [num_pages, Hkv, page_size, D]). The mods see the query row i
    of sequence b at position kv_lens[b] - q_len + i. kv_dtype (default: dtype) makes an FP8
    cache: "fp8" / "e4m3" / torch.float8_e4m3fn, or "e5m2" / torch.float8_e5m2; ``decode`` then
    takes k/v in that format (or as uint8 arrays of its bytes) and k_scale / v_scale."""
    head_dim_v = head_dim if head_dim_v is None else head_dim_v
    session = _plan_decode(score_mod, mask_mod, buffers, params, dtype_name(dtype), int(head_dim), int(head_dim_v), device_index(device),
                           int(batch), int(heads), int(kv_heads), int(max_seqlen_q), int(max_seqlen_kv), int(page_size),
                           bool(head_major_pages), int(num_splits), kv_dtype_text(kv_dtype))
    return DecodePlan(session, score_mod, mask_mod, buffers, params, int(heads), head_dim_v)


def decode(plan, q, k_cache, v_cache, kv_lens, page_table=None, q_lens=None, buffers=None, params=None, scale=None,
           return_lse=False, stream=None, k_scale=None, v_scale=None):
    """One decode step within `plan`: q [B, H, Sq, D] (B <= the plan's batch), kv_lens i32 [B]
    (positions of each sequence, the new ones included), page_table i32 [B, max_pages] for a
    paged plan, q_lens i32 [B] (rows of each sequence, default Sq). buffers and params default
    to the plan's. FP8 plans: k_scale / v_scale, f32 [Hkv] or [1] on q's device (absent: 1), give
    K = k_scale * stored value, V likewise. Returns o [B, H, Sq, Dv] (and the LSE [B, H, Sq] with
    return_lse)."""
    if not isinstance(plan, DecodePlan):
        raise TypeError(f"plan must come from flexjit.plan_decode, got {type(plan).__name__}")
    qs = _arrays.shape_of(q, "q", 4, "[B, H, Sq, D]")
    o = _arrays.empty(q, qs[:3] + (plan.head_dim_v,))
    lse = _arrays.empty_f32(q, qs[:3]) if return_lse else None
    if stream is None:
        stream = _arrays.current_stream(q)
    k_cache, v_cache = _fp8_bytes(k_cache, plan, "k_cache"), _fp8_bytes(v_cache, plan, "v_cache")
    _decode(plan._session, plan.buffers if buffers is None else buffers, plan.params if params is None else params, q, k_cache, v_cache, o,
            lse, page_table, kv_lens, q_lens, k_scale, v_scale, launch_scale(scale), stream)
    return (o, lse) if return_lse else o


def forward_varlen(q, k, v, cu_seqlens_q, cu_seqlens_kv, max_seqlen_q, max_seqlen_kv, score_mod=None, mask_mod=None, buffers=None,
                   params=None, scale=None, return_lse=False, stream=None, k_scale=None, v_scale=None, kv_dtype=None,
                   queries_at_kv_end=False):
    """Ragged prefill: q [total_q, H, D], k and v [total_kv, Hkv, D(v)], sequence b owning rows
    [cu_seqlens_q[b], cu_seqlens_q[b+1]) of q and [cu_seqlens_kv[b], cu_seqlens_kv[b+1]) of k and
    v (i32 arrays on the same device); max_seqlen_* bound the lengths. The mods see b as the
    sequence and q, kv as positions within it. k and v may be FP8 (torch.float8_e4m3fn /
    float8_e5m2, or uint8 bytes with kv_dtype "fp8" / "e5m2"), with k_scale / v_scale f32 [Hkv]
    or [1] on q's device (absent: 1): K = k_scale * stored value, V likewise. queries_at_kv_end:
    each sequence's query rows are its last KV positions (row i at kv_len - q_len + i, as in
    decode: a chunked prefill over a cached prefix); by default row i is position i. Returns
    o [total_q, H, Dv] (and the LSE [H, total_q] with return_lse)."""
    qs = _arrays.shape_of(q, "q", 3, "[total_q, H, D]")
    vs = _arrays.shape_of(v, "v", 3, "[total_kv, Hkv, Dv]")
    o = _arrays.empty(q, (qs[0], qs[1], vs[2]))
    lse = _arrays.empty_f32(q, (qs[1], qs[0])) if return_lse else None
    if stream is None:
        stream = _arrays.current_stream(q)
    _forward_varlen(score_mod, mask_mod, buffers, params, q, k, v, o, lse, cu_seqlens_q, cu_seqlens_kv, int(max_seqlen_q),
                    int(max_seqlen_kv), k_scale, v_scale, kv_dtype_text(kv_dtype), bool(queries_at_kv_end), launch_scale(scale), stream)
    return (o, lse) if return_lse else o


def backward_varlen(q, k, v, o, lse, grad_out, cu_seqlens_q, cu_seqlens_kv, max_seqlen_q, max_seqlen_kv, score_mod=None, mask_mod=None,
                    buffers=None, params=None, grad_buffers=(), scale=None, deterministic=False, stream=None):
    """Gradients of a forward_varlen launch (with the same packed arrays, sequences, bounds, mods, buffers,
    parameters and scale; not with queries_at_kv_end or an FP8 k / v): returns (dq, dk, dv, {name: gradient}), dq, dk,
    dv shaped like q, k, v, and a float32 gradient of the shape of each buffer named in `grad_buffers`, summed over
    the sequences. `lse` is the forward's [H, total_q] (``return_lse=True``), grad_out the gradient of o."""
    grads = grad_outputs(q, buffers, grad_buffers)
    dq = _arrays.empty(q, _arrays.shape_of(q, "q", 3, "[total_q, H, D]"))
    dk = _arrays.empty(k, _arrays.shape_of(k, "k", 3, "[total_kv, Hkv, D]"))
    dv = _arrays.empty(v, _arrays.shape_of(v, "v", 3, "[total_kv, Hkv, Dv]"))
    if stream is None:
        stream = _arrays.current_stream(q)
    _backward_varlen(score_mod, mask_mod, buffers, params, q, k, v, o, lse, grad_out, dq, dk, dv, cu_seqlens_q, cu_seqlens_kv,
                     int(max_seqlen_q), int(max_seqlen_kv), grads or None, launch_scale(scale), bool(deterministic), stream)
    return dq, dk, dv, grads


__all__ = ["DecodePlan", "backward_varlen", "decode", "forward_varlen", "plan_decode"]
