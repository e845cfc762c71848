"""The string API: attention whose score_mod / mask_mod are programs in flexjit's language.

Works on any DLPack arrays (numpy on the CPU backend, torch on CPU or CUDA, cupy, ...);
torch tensors go through flexjit.torch's custom op when autograd or torch.compile needs it.
"""
import functools

from . import _arrays
from ._block_mask import BlockMask, device_masks, merge_block_mask
from ._flexjit import backward as _backward
from ._flexjit import forward as _forward


class const:
    """A parameter value baked into the kernel (``params={"cap": flexjit.const(30.0)}``):
    the generated code may specialise on it (softcap's fixed softmax maximum), and a new value
    compiles a new kernel. Plain values are runtime parameters: a new value does not recompile."""

    __flexjit_const__ = True

    def __init__(self, value):
        self.value = value

    def __repr__(self):
        return f"flexjit.const({self.value!r})"


@functools.lru_cache(maxsize=None)
def _torch_ops():
    from .torch import _ops

    return _ops


def launch_scale(scale):
    """The scale a launch takes: 0 means 1 / sqrt(D)."""
    if scale is None:
        return 0.0
    scale = float(scale)
    if not scale > 0 or scale == float("inf"):
        raise ValueError(f"scale must be a finite number > 0 (None: 1 / sqrt(D)), got {scale}")
    return scale


def dense_shapes(q, k, v, enable_gqa):
    """(B, H, Sq, D), (B, Hkv, Skv, D), (B, Hkv, Skv, Dv) of a dense launch, checked for GQA."""
    qs = _arrays.shape_of(q, "q", 4, "[B, H, Sq, D]")
    ks = _arrays.shape_of(k, "k", 4, "[B, Hkv, Skv, D]")
    vs = _arrays.shape_of(v, "v", 4, "[B, Hkv, Skv, Dv]")
    if qs[1] != ks[1] and not enable_gqa:
        raise ValueError(
            f"q has {qs[1]} heads but k and v have {ks[1]}: pass enable_gqa=True for grouped-query attention "
            "(the query heads must be a multiple of the KV heads)"
        )
    return qs, ks, vs


def flex_attention(q, k, v, score_mod=None, mask_mod=None, buffers=None, params=None, block_mask=None, scale=None,
                   enable_gqa=False, return_lse=False, stream=None):
    """Attention with `score_mod` / `mask_mod` given as programs in flexjit's language.

    q [B, H, Sq, D], k [B, Hkv, Skv, D], v [B, Hkv, Skv, Dv] of one dtype (bf16 or f16 on a GPU;
    f32, f16 or bf16 on the CPU backend), any strides with D innermost. `buffers` maps the
    names the mods index to arrays on the same device (declared from their dtype and shape:
    an extent equal to B, H, Hkv, Sq or Skv is declared with that symbol; pass
    ``(array, "H, L")`` to name dimensions yourself); `params` maps names to bool, int or
    float values (``flexjit.const(v)`` bakes a value into the kernel). `block_mask` comes
    from ``create_block_mask`` and brings its mask_mod, buffers and parameters. `scale`
    defaults to 1 / sqrt(D). Returns o [B, H, Sq, Dv], and with return_lse the natural-log
    LSE [B, H, Sq] float32 (-inf for fully masked rows). Launches go to `stream` (a CUstream
    handle), by default the caller's current stream (torch or cupy).
    """
    if _arrays.is_torch(q):
        return _torch_ops().flex_attention(q, k, v, score_mod, mask_mod, buffers, params, block_mask, scale, enable_gqa, return_lse)
    qs, ks, vs = dense_shapes(q, k, v, enable_gqa)
    mask_mod, buffers, params = merge_block_mask(block_mask, mask_mod, buffers, params, qs[0], qs[1], qs[2], ks[2])
    o = _arrays.empty(q, (qs[0], qs[1], qs[2], vs[3]))
    lse = _arrays.empty_f32(q, qs[:3]) if return_lse else None
    if stream is None:
        stream = _arrays.current_stream(q)
    _forward(score_mod, mask_mod, buffers, params, None, q, k, v, o, lse, launch_scale(scale), device_masks(block_mask), stream)
    return (o, lse) if return_lse else o


def grad_outputs(q, buffers, grad_buffers):
    """A float32 array on q's device of each named buffer's shape: the backward's gradient outputs."""
    grads = {}
    for name in grad_buffers:
        if not buffers or name not in buffers:
            raise ValueError(f"grad_buffers names `{name}`, which is not among the buffers")
        buffer = buffers[name]
        buffer = buffer[0] if isinstance(buffer, tuple) else buffer
        grads[name] = _arrays.empty_f32(q, tuple(int(d) for d in buffer.shape))
    return grads


def flex_attention_backward(q, k, v, o, lse, grad_out, score_mod=None, mask_mod=None, buffers=None, params=None,
                            grad_buffers=(), block_mask=None, scale=None, enable_gqa=False, deterministic=False, stream=None):
    """Gradients of a flex_attention launch (with the same mods, buffers, parameters and
    scale): returns (dq, dk, dv, {name: gradient}) where the dict holds a float32 gradient
    of the shape of each buffer named in `grad_buffers`. `lse` is the forward's
    (``return_lse=True``). deterministic=True gives bitwise-reproducible gradients (64-bit fixed-point sums on a GPU)."""
    qs, ks, vs = dense_shapes(q, k, v, enable_gqa)
    mask_mod, buffers, params = merge_block_mask(block_mask, mask_mod, buffers, params, qs[0], qs[1], qs[2], ks[2])
    grads = grad_outputs(q, buffers, grad_buffers)
    dq, dk, dv = _arrays.empty(q, qs), _arrays.empty(k, ks), _arrays.empty(v, vs)
    if stream is None:
        stream = _arrays.current_stream(q)
    _backward(score_mod, mask_mod, buffers, params, q, k, v, o, lse, grad_out, dq, dk, dv, grads or None,
              launch_scale(scale), deterministic, device_masks(block_mask), stream)
    return dq, dk, dv, grads


def create_block_mask(mask_mod, B, H, Q_LEN, KV_LEN, buffers=None, params=None):
    """The block mask of `mask_mod` (a program in flexjit's language) for these sizes, to pass
    to flex_attention as block_mask=: checked now, built on the device at its first launch
    with each kernel, and reused by every later launch. B or H None (or 1) means the mask is
    the same for every batch entry or head."""
    return BlockMask(mask_mod, B, H, Q_LEN, KV_LEN, buffers, params)


__all__ = ["BlockMask", "const", "create_block_mask", "flex_attention", "flex_attention_backward"]
