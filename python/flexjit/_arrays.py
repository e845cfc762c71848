"""Outputs in the caller's array library, and the CUDA stream a launch goes to.

flexjit writes into arrays allocated here with the library of the operand they follow
(numpy, torch or any array-API library), on its device, so nothing is ever copied.
"""
import sys


def _torch_tensor_type():
    torch = sys.modules.get("torch")
    return torch.Tensor if torch is not None else None


def is_torch(x):
    tensor = _torch_tensor_type()
    return tensor is not None and isinstance(x, tensor)


def _numpy_empty(like, shape, f32):
    import numpy

    return numpy.empty(shape, dtype=numpy.float32 if f32 else like.dtype)


def _torch_empty(like, shape, f32):
    import torch

    return torch.empty(shape, dtype=torch.float32 if f32 else like.dtype, device=like.device)


def _array_api_empty(like, shape, f32):
    xp = like.__array_namespace__()
    return xp.empty(shape, dtype=xp.float32 if f32 else like.dtype, device=like.device)


_EMPTY = {}


def _empty_for(like):
    kind = type(like)
    empty = _EMPTY.get(kind)
    if empty is None:
        module = getattr(kind, "__module__", "") or ""
        if module.split(".")[0] == "numpy":
            empty = _numpy_empty
        elif is_torch(like):
            empty = _torch_empty
        elif hasattr(like, "__array_namespace__"):
            empty = _array_api_empty
        else:
            raise TypeError(
                f"flexjit allocates its outputs with the library of q, but q is a {kind.__module__}.{kind.__qualname__}; "
                "pass numpy arrays, torch tensors or arrays of an array-API library"
            )
        _EMPTY[kind] = empty
    return empty


def empty(like, shape):
    """An uninitialised array of `shape` with the dtype and device of `like`."""
    return _empty_for(like)(like, shape, False)


def empty_f32(like, shape):
    """An uninitialised float32 array of `shape` on the device of `like`."""
    return _empty_for(like)(like, shape, True)


def current_stream(like):
    """The handle of the caller's current CUDA stream for arrays like `like` (0: the legacy
    default stream, and what CPU launches get)."""
    if is_torch(like):
        if not like.is_cuda:
            return 0
        import torch

        # The raw handle, as flexjit.torch's ops read it: torch.cuda.current_stream builds a Stream object per call.
        return torch._C._cuda_getCurrentRawStream(like.get_device())
    module = type(like).__module__.split(".")[0]
    if module == "cupy":
        import cupy

        return cupy.cuda.get_current_stream().ptr
    return 0


def shape_of(x, name, rank, layout):
    """x's shape as a tuple of ints, checked to have `rank` dimensions (`layout` names them)."""
    shape = getattr(x, "shape", None)
    if shape is None:
        raise TypeError(f"{name} must be an array (numpy, torch, ...), got {type(x).__name__}")
    shape = tuple(int(d) for d in shape)
    if len(shape) != rank:
        raise ValueError(f"{name} must have {rank} dimensions {layout}, but has shape {list(shape)}")
    return shape
