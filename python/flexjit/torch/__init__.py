"""flexjit for PyTorch.

- ``flexjit.torch.flex_attention`` / ``create_block_mask``: drop-in replacements of
  torch.nn.attention.flex_attention's, taking the same Python callables (translated once per
  function into flexjit's language).
- ``flexjit.flex_attention`` (the string API) on torch tensors goes through the custom op
  ``torch.ops.flexjit.attention`` (autograd for q, k, v and buffers that require grad;
  torch.compile without graph breaks; CUDA-graph capture once warm).
"""
from . import _ops  # noqa: F401  (registers the custom ops)
from ._dropin import create_block_mask, flex_attention
from ._expr import TranslationError
from ._trace import translate

__all__ = ["TranslationError", "create_block_mask", "flex_attention", "translate"]
