"""A DLPack capsule that claims a numpy array lives on a CUDA device: lets a machine without a
GPU check that flexjit refuses arrays on another device before it touches them."""
import ctypes

import numpy as np


class DLDevice(ctypes.Structure):
    _fields_ = [("device_type", ctypes.c_int32), ("device_id", ctypes.c_int32)]


class DLDataType(ctypes.Structure):
    _fields_ = [("code", ctypes.c_uint8), ("bits", ctypes.c_uint8), ("lanes", ctypes.c_uint16)]


class DLTensor(ctypes.Structure):
    _fields_ = [("data", ctypes.c_void_p), ("device", DLDevice), ("ndim", ctypes.c_int32), ("dtype", DLDataType),
                ("shape", ctypes.POINTER(ctypes.c_int64)), ("strides", ctypes.POINTER(ctypes.c_int64)), ("byte_offset", ctypes.c_uint64)]


class DLManagedTensor(ctypes.Structure):
    _fields_ = [("dl_tensor", DLTensor), ("manager_ctx", ctypes.c_void_p), ("deleter", ctypes.c_void_p)]


_KDL_CUDA = 2
_alive = []  # the structs and arrays behind every capsule made (a test process is short-lived)

_capsule_new = ctypes.pythonapi.PyCapsule_New
_capsule_new.restype = ctypes.py_object
_capsule_new.argtypes = [ctypes.c_void_p, ctypes.c_char_p, ctypes.c_void_p]


def _capsule(array, device):
    """A "dltensor" capsule over `array`'s memory (float32) that says it is on cuda:`device`."""
    shape = (ctypes.c_int64 * array.ndim)(*array.shape)
    managed = DLManagedTensor()
    managed.dl_tensor.data = array.ctypes.data
    managed.dl_tensor.device = DLDevice(_KDL_CUDA, device)
    managed.dl_tensor.ndim = array.ndim
    managed.dl_tensor.dtype = DLDataType(2, 32, 1)
    managed.dl_tensor.shape = shape
    _alive.append((array, shape, managed))
    return _capsule_new(ctypes.addressof(managed), b"dltensor", None)


class FakeCudaArray:
    """A DLPack producer whose float32 array claims to live on cuda:`device`."""

    def __init__(self, array, device=0):
        self.array = np.ascontiguousarray(array, dtype=np.float32)
        self.shape = self.array.shape
        self.device = device

    def __dlpack__(self, **kwargs):
        return _capsule(self.array, self.device)

    def __dlpack_device__(self):
        return (_KDL_CUDA, self.device)
