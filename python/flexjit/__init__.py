"""flexjit: FlexAttention-style attention whose score_mod / mask_mod are compiled at run time
(NVRTC on CUDA GPUs, LLVM on the CPU backend).

    import flexjit
    o = flexjit.flex_attention(q, k, v, score_mod="score + rel_h[b, h, q, kv // 64]",
                               buffers={"rel_h": rel_h})

The arrays may be numpy (CPU backend), torch (CPU or CUDA; autograd and torch.compile
through flexjit.torch) or any DLPack producer. ``flexjit.torch`` holds the drop-in
replacement of torch.nn.attention.flex_attention that takes Python callables.
"""
from ._attention import BlockMask, const, create_block_mask, flex_attention, flex_attention_backward
from ._errors import CompileError, FlexjitError
from ._flexjit import cpu_backend as _cpu_backend
from ._flexjit import device_count
from ._serving import DecodePlan, backward_varlen, decode, forward_varlen, plan_decode
from . import _flexjit

__version__ = "0.1.0"


def has_cpu_backend():
    """Whether this build runs CPU arrays (the LLVM CPU backend was linked)."""
    return bool(_cpu_backend)


def check_errors(device=0, stream=0):
    """Synchronises `stream` on CUDA `device` and raises FlexjitError naming the buffer and the
    expression if a launch clamped an out-of-range index (or divided by zero) since the last check."""
    _flexjit.check_errors(int(device), int(stream))


def spec_of(q, k, v, score_mod=None, mask_mod=None, buffers=None, params=None):
    """The spec (JSON text) a flex_attention launch with these arguments compiles: shows how
    the buffers and parameters were declared."""
    return _flexjit.forward_spec(score_mod, mask_mod, buffers, params, None, q, k, v)


__all__ = ["BlockMask", "CompileError", "DecodePlan", "FlexjitError", "backward_varlen", "check_errors", "const", "create_block_mask", "decode",
           "device_count", "flex_attention", "flex_attention_backward", "forward_varlen", "has_cpu_backend", "plan_decode", "spec_of"]
