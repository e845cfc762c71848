"""The drop-in replacement of torch.nn.attention.flex_attention: the same signature and Python
callables, translated once per function into flexjit's language (flexjit.torch._trace)."""
import torch
from torch.nn.attention import flex_attention as _flex

from .._block_mask import BlockMask
from . import _ops, _trace


@torch.compiler.assume_constant_result
def _translated(fn, kind, avoid):
    # A constant of the compiled graph: torch.compile calls this once per guarded callable.
    t = _trace.translate(fn, kind, avoid)
    return t.text, t.buffers, t.params, t.consts


def _captures(fn, translation):
    _, buffers, params, consts = translation
    for path, value in consts:
        # In eager mode translate() has just checked these. Under torch.compile, _translated is a constant of the graph:
        # reading each number the text holds makes the graph guard on it, so a new value traces (and translates) again.
        if _trace.resolve(fn, path) != value:
            raise RuntimeError(f"flexjit: a captured number changed between translating a mod and launching it ({path})")
    return ({name: _trace.resolve(fn, path) for name, path in buffers}, {name: _trace.resolve(fn, path) for name, path in params})


def _mod(fn, kind, avoid=()):
    """(text, buffers, params) of a mod given as a callable or as text."""
    if isinstance(fn, str):
        return fn, {}, {}
    translation = _translated(fn, kind, tuple(avoid))
    buffers, params = _captures(fn, translation)
    return translation[0], buffers, params


def create_block_mask(mask_mod, B, H, Q_LEN, KV_LEN, device=None, BLOCK_SIZE=128, _compile=False):
    """torch.nn.attention.flex_attention.create_block_mask for flexjit: `mask_mod` is translated
    now, with the tensors and numbers it captures; the device tile lists are built at the first
    launch of each kernel that uses the mask. `device`, BLOCK_SIZE and _compile are accepted for
    compatibility (the launch's device and kernel decide the tiles)."""
    text, buffers, params = _mod(mask_mod, "mask_mod")
    return BlockMask(text, B, H, Q_LEN, KV_LEN, buffers, params, source=mask_mod)


def flex_attention(query, key, value, score_mod=None, block_mask=None, scale=None, enable_gqa=False, return_lse=False,
                   kernel_options=None, *, return_aux=None):
    """torch.nn.attention.flex_attention.flex_attention on flexjit. score_mod(score, b, h, q_idx,
    kv_idx) is translated once per function (captured tensors become buffers, with gradients when
    they require grad; captured Python numbers become constants, and runtime parameters once their
    value changes between calls); block_mask comes from
    flexjit.torch.create_block_mask (a torch BlockMask is accepted too: its mask_mod is translated
    and the tile lists are built per launch). kernel_options are Triton tuning knobs and are ignored.
    Anything the translation cannot express raises flexjit.torch.TranslationError naming it."""
    mask_mod = None
    if isinstance(block_mask, _flex.BlockMask):
        mask_mod, mask_buffers, mask_params = _mod(block_mask.mask_mod, "mask_mod")
        block_mask = None
    else:
        mask_buffers, mask_params = {}, {}
    avoid = list(mask_buffers) + list(mask_params)
    if block_mask is not None and isinstance(block_mask, BlockMask):
        avoid += list(block_mask.buffers) + list(block_mask.params)
    score_text, buffers, params = _mod(score_mod, "score_mod", avoid) if score_mod is not None else (None, {}, {})
    buffers.update(mask_buffers)
    params.update(mask_params)
    want_lse = return_lse or (return_aux is not None and return_aux.lse)
    if return_aux is not None and return_aux.max_scores:
        raise NotImplementedError("flexjit.torch.flex_attention: AuxRequest(max_scores=True) is not supported")
    out = _ops.flex_attention(query, key, value, score_text, mask_mod, buffers, params, block_mask, scale, enable_gqa, want_lse)
    if return_aux is not None:
        o, lse = out if want_lse else (out, None)
        return o, _flex.AuxOutput(lse=lse if return_aux.lse else None)
    return out
