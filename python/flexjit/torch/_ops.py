"""flexjit attention as torch custom ops: ``flexjit::attention`` and its backward, with fake
(meta) implementations and an autograd formula, so models train with it (gradients for q, k,
v and every buffer that requires grad), compile under torch.compile without graph breaks, and
replay in CUDA graphs.

Ops take tensors, numbers and strings only, so a launch's mods, buffer names and parameter
types travel as one config string (a constant of the compiled graph) and a block mask as the
handle (a string) of its flexjit.BlockMask.
"""
import torch

from .. import _flexjit as _ext
from .. import _attention
from .._attention import launch_scale
from .._block_mask import block_mask_by_handle, device_masks_by_handle, merge_block_mask

_ext.register_torch(torch.Tensor, {torch.float32: "f32", torch.float16: "f16", torch.bfloat16: "bf16", torch.int32: "i32",
                                   torch.int64: "i64", torch.uint8: "u8", torch.bool: "bool",
                                   # FP8 KV caches of decode (torch >= 2.1)
                                   **{getattr(torch, name): name for name in ("float8_e4m3fn", "float8_e5m2") if hasattr(torch, name)}})

_FIELD, _ITEM = "\x1e", "\x1f"


def current_stream(t):
    """The handle of the current CUDA stream of t's device (0 for CPU tensors)."""
    return torch._C._cuda_getCurrentRawStream(t.get_device()) if t.is_cuda else 0


def param_kind(value):
    """How a parameter value travels: (kind, value as a float)."""
    const = isinstance(value, _attention.const)
    inner = value.value if const else value
    if isinstance(inner, bool):
        kind = "bool"
    elif isinstance(inner, (int, torch.SymInt)):
        kind = "int"
    else:
        kind = "float"
    return ("const-" + kind if const else kind), float(inner)


def make_config(score_mod, mask_mod, buffer_entries, param_entries, grads):
    """The config string of a launch: the mods, buffer entries ("name" or "name=dims"),
    parameter entries ("name:kind") and the buffers whose gradients the backward computes."""
    return _FIELD.join([score_mod or "", mask_mod or "", _ITEM.join(buffer_entries), _ITEM.join(param_entries), _ITEM.join(grads)])


class _Config:
    def __init__(self, text):
        score, mask, buffers, params, grads = text.split(_FIELD)
        self.score_mod = score or None
        self.mask_mod = mask or None
        self.buffers = [entry.partition("=") for entry in buffers.split(_ITEM)] if buffers else []
        self.params = [entry.partition(":")[::2] for entry in params.split(_ITEM)] if params else []
        self.grads = grads.split(_ITEM) if grads else []
        self.grad_indices = [i for i, (name, _, _) in enumerate(self.buffers) if name in self.grads]

    def buffer_dict(self, tensors):
        if len(tensors) != len(self.buffers):
            raise ValueError(f"flexjit: {len(tensors)} buffer tensors for {len(self.buffers)} buffer names")
        return {name: ((t, dims) if dims else t) for (name, _, dims), t in zip(self.buffers, tensors)} or None

    def param_dict(self, values):
        out = {}
        for (name, kind), value in zip(self.params, values):
            base = kind.replace("const-", "")
            value = bool(value) if base == "bool" else int(value) if base == "int" else value
            out[name] = _attention.const(value) if kind.startswith("const-") else value
        return out or None


_configs = {}


def parse_config(text):
    config = _configs.get(text)
    if config is None:
        config = _configs[text] = _Config(text)
    return config


def _forward(q, k, v, buffers, config, params, scale, block_mask):
    """O and LSE of a launch (what the forward op computes)."""
    c = parse_config(config)
    o = q.new_empty((q.shape[0], q.shape[1], q.shape[2], v.shape[3]))
    lse = q.new_empty(q.shape[:3], dtype=torch.float32)
    _ext.forward(c.score_mod, c.mask_mod, c.buffer_dict(buffers), c.param_dict(params), c.grads or None, q, k, v, o, lse, scale,
                 device_masks_by_handle(block_mask), current_stream(q))
    return o, lse


def _backward_grads(q, k, v, o, lse, grad_out, buffers, config, params, scale, block_mask):
    """dq, dk, dv and the f32 gradients of the buffers the config marks (what the backward op computes)."""
    c = parse_config(config)
    dq, dk, dv = torch.empty_like(q), torch.empty_like(k), torch.empty_like(v)
    grads = {c.buffers[i][0]: buffers[i].new_empty(buffers[i].shape, dtype=torch.float32) for i in c.grad_indices}
    _ext.backward(c.score_mod, c.mask_mod, c.buffer_dict(buffers), c.param_dict(params), q, k, v, o, lse, grad_out, dq, dk, dv,
                  grads or None, scale, False, device_masks_by_handle(block_mask), current_stream(q))
    return dq, dk, dv, list(grads.values())


def _buffer_grads(config, buffers, buffer_grads):
    """One entry per buffer: its gradient in the buffer's dtype, or None where the config marks none."""
    grads = [None] * len(buffers)
    for i, g in zip(parse_config(config).grad_indices, buffer_grads):
        grads[i] = g.to(buffers[i].dtype)
    return grads


@torch.library.custom_op("flexjit::attention", mutates_args=())
def attention_op(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, buffers: list[torch.Tensor], config: str, params: list[float],
                 scale: float, block_mask: str) -> tuple[torch.Tensor, torch.Tensor]:
    return _forward(q, k, v, buffers, config, params, scale, block_mask)


@attention_op.register_fake
def _attention_fake(q, k, v, buffers, config, params, scale, block_mask):
    return q.new_empty((q.shape[0], q.shape[1], q.shape[2], v.shape[3])), q.new_empty(q.shape[:3], dtype=torch.float32)


@torch.library.custom_op("flexjit::attention_backward", mutates_args=())
def attention_backward_op(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, o: torch.Tensor, lse: torch.Tensor, grad_out: torch.Tensor,
                          buffers: list[torch.Tensor], config: str, params: list[float], scale: float,
                          block_mask: str) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, list[torch.Tensor]]:
    return _backward_grads(q, k, v, o, lse, grad_out, buffers, config, params, scale, block_mask)


@attention_backward_op.register_fake
def _attention_backward_fake(q, k, v, o, lse, grad_out, buffers, config, params, scale, block_mask):
    c = parse_config(config)
    grads = [buffers[i].new_empty(buffers[i].shape, dtype=torch.float32) for i in c.grad_indices]
    return torch.empty_like(q), torch.empty_like(k), torch.empty_like(v), grads


def _setup_context(ctx, inputs, output):
    q, k, v, buffers, config, params, scale, block_mask = inputs
    o, lse = output
    ctx.save_for_backward(q, k, v, o, lse, *buffers)
    ctx.config, ctx.params, ctx.scale, ctx.block_mask = config, params, scale, block_mask
    # Keeps the forward's block mask (and its device tile lists) alive for the backward.
    ctx.block_mask_object = block_mask_by_handle(block_mask)
    ctx.mark_non_differentiable(lse)


def _backward(ctx, grad_o, grad_lse):
    q, k, v, o, lse, *buffers = ctx.saved_tensors
    dq, dk, dv, buffer_grads = attention_backward_op(q, k, v, o, lse, grad_o.contiguous(), buffers, ctx.config, ctx.params, ctx.scale,
                                                     ctx.block_mask)
    # A list of floats is one leaf of the inputs' structure, but an empty list is an empty node.
    return dq, dk, dv, _buffer_grads(ctx.config, buffers, buffer_grads), None, (None if ctx.params else []), None, None


attention_op.register_autograd(_backward, setup_context=_setup_context)


class _EagerAttention(torch.autograd.Function):
    """The same forward and backward as the custom ops, for eager mode: a custom op's Python dispatch and autograd
    wrapping cost about 130 us of host time per call (a plain call takes 5-8 us over C++), while an
    autograd.Function costs a few. torch.compile traces the custom op instead (flex_attention chooses)."""

    @staticmethod
    def forward(ctx, q, k, v, config, params, scale, block_mask, *buffers):
        o, lse = _forward(q, k, v, list(buffers), config, params, scale, block_mask)
        _setup_context(ctx, (q, k, v, buffers, config, params, scale, block_mask), (o, lse))
        return o, lse

    @staticmethod
    def backward(ctx, grad_o, grad_lse):
        q, k, v, o, lse, *buffers = ctx.saved_tensors
        dq, dk, dv, buffer_grads = _backward_grads(q, k, v, o, lse, grad_o.contiguous(), buffers, ctx.config, ctx.params, ctx.scale,
                                                   ctx.block_mask)
        return dq, dk, dv, None, None, None, None, *_buffer_grads(ctx.config, buffers, buffer_grads)


def _needs_grad(q, k, v, tensors):
    if not torch.is_grad_enabled():
        return False
    return q.requires_grad or k.requires_grad or v.requires_grad or any(t.requires_grad for t in tensors)


def flex_attention(q, k, v, score_mod, mask_mod, buffers, params, block_mask, scale, enable_gqa, return_lse):
    """The string API on torch tensors (flexjit.flex_attention's torch path)."""
    qs, ks, vs = q.shape, k.shape, v.shape
    if len(qs) != 4 or len(ks) != 4 or len(vs) != 4:
        raise ValueError(f"q, k and v must have 4 dimensions [B, H, S, D], but have shapes {list(qs)}, {list(ks)} and {list(vs)}")
    if qs[1] != ks[1] and not enable_gqa:
        raise ValueError(f"q has {qs[1]} heads but k and v have {ks[1]}: pass enable_gqa=True for grouped-query attention")
    if block_mask is not None:
        mask_mod, buffers, params = merge_block_mask(block_mask, mask_mod, buffers, params, qs[0], qs[1], qs[2], ks[2])
    scale = 0.0 if scale is None else launch_scale(scale)
    if buffers:
        tensors = [b[0] if isinstance(b, tuple) else b for b in buffers.values()]
    else:
        buffers, tensors = {}, []
    if not torch.compiler.is_compiling() and not _needs_grad(q, k, v, tensors):
        # Inference in eager mode: straight to the launch, without the dispatcher's overhead.
        o = q.new_empty((qs[0], qs[1], qs[2], vs[3]))
        lse = q.new_empty(qs[:3], dtype=torch.float32) if return_lse else None
        _ext.forward(score_mod, mask_mod, buffers or None, params or None, None, q, k, v, o, lse, scale,
                     None if block_mask is None else block_mask._masks, current_stream(q))
        return (o, lse) if return_lse else o
    params = params or {}
    entries = [name + "=" + b[1] if isinstance(b, tuple) else name for name, b in buffers.items()]
    kinds = [param_kind(value) for value in params.values()]
    grad_names = [name for name, t in zip(buffers, tensors) if t.requires_grad and torch.is_grad_enabled()]
    config = make_config(score_mod, mask_mod, entries, [name + ":" + kind for name, (kind, _) in zip(params, kinds)], grad_names)
    handle = block_mask.handle if block_mask is not None else ""
    values = [value for _, value in kinds]
    if torch.compiler.is_compiling():
        o, lse = attention_op(q, k, v, tensors, config, values, scale, handle)
    else:
        o, lse = _EagerAttention.apply(q, k, v, config, values, scale, handle, *tensors)
    return (o, lse) if return_lse else o
