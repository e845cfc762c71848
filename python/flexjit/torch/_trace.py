"""Translating a FlexAttention score_mod / mask_mod (a Python callable) into flexjit's language
by symbolic tracing: the callable runs once on symbolic b, h, q_idx, kv_idx (and score), with
every value it captures replaced by a proxy. Captured tensors become buffers; captured Python
numbers become constants of the translation, as torch.compile specialises them (the kernel then
gets what constants give: exact range proofs, constant divisors, staged columns), and a number
whose value changes between calls becomes a runtime parameter from the next translation on, so
a mod made for many values costs one more kernel, not one per value (torch.compile's automatic
dynamic); a parameter that Python needs the value of (an `if`, range()) stays a constant.
Captured functions and objects are traced through.

A translation records the path from the callable to each capture (closure cell, attribute,
global, ...), so the values of a new closure of the same code are read again at each call
without tracing, and so torch.compile can read them as graph inputs.
"""
import functools
import numbers
import re
import threading
import types
from typing import NamedTuple

import torch

from . import _expr as E
from ._expr import Expr, TranslationError

_RESERVED = {
    "b", "h", "q", "kv", "score", "batch", "head", "q_idx", "kv_idx", "kv_head", "k0", "j", "B", "H", "Hkv", "Sq", "Skv", "D",
    "abs", "min", "max", "clamp", "exp", "exp2", "log", "log2", "log1p", "sqrt", "rsqrt", "tanh", "sigmoid", "sin", "cos", "floor",
    "ceil", "round", "pow", "sign", "where", "float", "int", "bool", "let", "and", "or", "not", "true", "false", "inf",
}
# Element types flexjit has no buffers of, converted when the buffer is read (the conversion is
# differentiable, so gradients still reach the captured tensor).
_CONVERT = {torch.float64: "float32", torch.int8: "int32", torch.int16: "int32", torch.uint16: "int32", torch.uint32: "int64"}

_state = threading.local()


def current_tracer():
    tracer = getattr(_state, "tracer", None)
    if tracer is None:
        raise TranslationError("a symbolic value of a mod was used outside of its translation")
    return tracer


class Translation(NamedTuple):
    text: str        # the program
    buffers: tuple   # (name, path) of each captured tensor
    params: tuple    # (name, path) of each captured number that is a runtime parameter
    checks: tuple    # (path, signature): what must hold for another callable of the same code to reuse it
    consts: tuple    # (path, value) of each captured number the text holds as a constant


def resolve(fn, path):
    """The value at `path` from callable `fn` (plain attribute and item reads, so torch.compile
    traces them)."""
    x = fn
    for step in path:
        op = step[0]
        if op == "cell":
            x = x.__closure__[step[1]].cell_contents
        elif op == "attr":
            x = getattr(x, step[1])
        elif op == "self":
            x = x.__self__
        elif op == "func":
            x = x.__func__
        elif op == "global":
            x = x.__globals__[step[1]]
        elif op == "item":
            x = x[step[1]]
        elif op == "scalar":
            x = x.reshape(1)
        elif op == "as":
            x = x.to(getattr(torch, step[1]))
    return x


def _signature(value):
    if isinstance(value, torch.Tensor):
        return ("tensor", value.dim(), E.dtype_kind(value.dtype))
    if isinstance(value, (bool, numbers.Number)):
        return ("number", type(value))
    if isinstance(value, types.FunctionType):
        return ("function", value.__code__)
    if isinstance(value, types.MethodType):
        return ("method", value.__func__.__code__)
    if isinstance(value, (list, tuple)):
        return ("sequence", type(value), len(value))
    return ("object", type(value))


class BufferProxy:
    """A captured tensor: indexing it with symbolic values loads from the buffer; a 0-d one is
    also a value (read as buffer[0])."""

    def __init__(self, tracer, tensor, name, path, source):
        # path: how a launch reads the buffer; source: where the tensor was captured (path without conversions).
        self._tracer, self._tensor, self._name, self._path, self._source = tracer, tensor, name, path, source
        self._kind = E.dtype_kind(tensor.dtype)

    def __getitem__(self, index):
        return self._tracer.index(self, index if isinstance(index, tuple) else (index,))

    def _value(self):
        if self._tensor.dim() != 0:
            raise TranslationError(f"the captured tensor `{self._name}` is used as a whole; a mod may only index it "
                                   "(with b, h, q_idx, kv_idx and values computed from them)")
        return self._tracer.scalar(self)

    # Static facts about the tensor are constants of the translation.
    @property
    def shape(self):
        self._tracer.checks.append((self._path, ("shape", tuple(self._tensor.shape))))
        return self._tensor.shape

    def size(self, dim=None):
        shape = self.shape
        return shape if dim is None else shape[dim]

    def dim(self):
        return self._tensor.dim()

    def __len__(self):
        return self.shape[0]

    @property
    def ndim(self):
        return self._tensor.dim()

    @property
    def dtype(self):
        return self._tensor.dtype

    @property
    def device(self):
        return self._tensor.device

    def __getattr__(self, name):
        return getattr(self._value(), name)

    @classmethod
    def __torch_function__(cls, func, types_, args=(), kwargs=None):
        return E.Expr.__torch_function__(func, types_, args, kwargs)


def _delegate(name):
    def method(self, *args):
        return getattr(self._value(), name)(*args)

    method.__name__ = name
    return method


for _op in ("add", "radd", "sub", "rsub", "mul", "rmul", "truediv", "rtruediv", "floordiv", "rfloordiv", "mod", "rmod", "pow", "rpow",
            "and", "rand", "or", "ror", "xor", "rxor", "invert", "neg", "pos", "abs", "lt", "le", "gt", "ge", "eq", "ne", "bool", "index",
            "int", "float", "floor", "ceil", "round", "trunc"):
    setattr(BufferProxy, f"__{_op}__", _delegate(f"__{_op}__"))
BufferProxy.__hash__ = object.__hash__


class PartialLoad:
    """A buffer indexed with fewer indices than its rank (``bias[h][q]`` in two steps)."""

    def __init__(self, buffer, indices):
        self.buffer, self.indices = buffer, indices

    def __getitem__(self, index):
        return self.buffer._tracer.index(self.buffer, self.indices + (index if isinstance(index, tuple) else (index,)))

    def __getattr__(self, name):
        raise TranslationError(f"the captured tensor `{self.buffer._name}` is indexed with {len(self.indices)} of its "
                               f"{self.buffer._tensor.dim()} dimensions and then used; index every dimension")


class ObjectProxy:
    """A captured object (an nn.Module, say): its attributes are traced as captures too."""

    def __init__(self, tracer, obj, path, hint):
        self._tracer, self._obj, self._path, self._hint = tracer, obj, path, hint

    def __getattr__(self, name):
        return self._tracer.wrap(getattr(self._obj, name), self._path + (("attr", name),), name)

    def __getitem__(self, key):
        if isinstance(key, (Expr, BufferProxy)):
            raise TranslationError(f"indexing the captured {type(self._obj).__name__} `{self._hint}` with a symbolic value; "
                                   "only tensors can be indexed by position")
        return self._tracer.wrap(self._obj[key], self._path + (("item", key),), f"{self._hint}_{key}")

    def __call__(self, *args, **kwargs):
        return self.__getattr__("__call__")(*args, **kwargs)


# Globals a mod reads as they are: modules (torch, math), classes, builtins and torch's functions.
_UNTRACED = (types.ModuleType, type, types.BuiltinFunctionType, types.BuiltinMethodType, functools.partial, str, bytes, type(None))


class _TracedGlobals(dict):
    """The globals a rebound function runs with: a read of a tensor, function or object goes
    through the tracer (captured tensors become buffers); a number stays a constant that the
    translation checks at reuse."""

    def __init__(self, tracer, scope, path):
        super().__init__(scope)
        self._tracer, self._path = tracer, path

    def __getitem__(self, name):
        value = super().__getitem__(name)
        if isinstance(value, _UNTRACED):
            return value
        path = self._path + (("global", name),)
        if isinstance(value, (bool, numbers.Number)):
            self._tracer.checks.append((path, ("value", type(value), value)))
            return value
        return self._tracer.wrap(value, path, name)


class Tracer:
    def __init__(self, kind, demoted, avoid, dynamic=frozenset()):
        self.kind = kind
        self.demoted = demoted        # paths of numbers Python needs as constants
        self.dynamic = dynamic        # paths of numbers seen with several values: runtime parameters
        self.consts = {}              # path -> value of the captured numbers the text holds as constants
        self.names = set(avoid)
        self.buffers = {}             # path -> (name, BufferProxy)
        self.by_tensor = {}           # id(tensor) -> path
        self.params = {}              # path -> (name, Expr)
        self.checks = []              # (path, signature)
        self.globals = []             # (path of a traced function, its globals)
        self.rebinding = set()

    def unique_name(self, hint):
        name = re.sub(r"\W", "_", hint or "capture")
        if not name or name[0].isdigit():
            name = "c_" + name
        base, n = name, 1
        while name in _RESERVED or name in self.names or re.fullmatch(r"tmp\d+", name):
            n += 1
            name = f"{base}_{n}"
        self.names.add(name)
        return name

    def wrap(self, value, path, hint):
        if isinstance(value, (Expr, BufferProxy, ObjectProxy, PartialLoad)):
            return value
        if isinstance(value, torch.Tensor):
            return self.buffer(value, path, hint)
        if isinstance(value, (bool, numbers.Number)) and not isinstance(value, complex):
            if path not in self.demoted and (path in self.dynamic or value != value):  # NaN has no literal
                return self.param(value, path, hint)
            self.checks.append((path, ("value", type(value), value)))
            self.consts[path] = value
            return value
        if isinstance(value, (types.FunctionType, types.MethodType)):
            return self.rebind(value, path)
        if isinstance(value, (list, tuple)) and not hasattr(value, "_fields"):
            self.checks.append((path, _signature(value)))
            return type(value)(self.wrap(v, path + (("item", i),), f"{hint}_{i}") for i, v in enumerate(value))
        if hasattr(value, "__dict__") and not isinstance(value, (type, types.ModuleType, functools.partial)):
            self.checks.append((path, _signature(value)))
            return ObjectProxy(self, value, path, hint)
        self.checks.append((path, ("raw", type(value))))
        return value

    def rebind(self, fn, path):
        """`fn` with every capture replaced by its proxy."""
        if isinstance(fn, types.MethodType):
            self.checks.append((path, _signature(fn)))
            this = self.wrap(fn.__self__, path + (("self",),), "self")
            return functools.partial(self.rebind(fn.__func__, path + (("func",),)), this)
        code = fn.__code__
        self.checks.append((path, _signature(fn)))
        self.globals.append((path, fn.__globals__))
        if id(fn) in self.rebinding:
            return fn
        self.rebinding.add(id(fn))
        cells = []
        for i, (var, cell) in enumerate(zip(code.co_freevars, fn.__closure__ or ())):
            try:
                value = cell.cell_contents
            except ValueError:  # a cell not yet filled
                cells.append(cell)
                continue
            cells.append(types.CellType(self.wrap(value, path + (("cell", i),), var)))
        rebound = types.FunctionType(code, _TracedGlobals(self, fn.__globals__, path), fn.__name__, fn.__defaults__, tuple(cells) or None)
        rebound.__kwdefaults__ = fn.__kwdefaults__
        return rebound

    def param(self, value, path, hint):
        if path not in self.params:
            kind = "bool" if isinstance(value, bool) else "int" if isinstance(value, numbers.Integral) else "float"
            self.checks.append((path, _signature(value)))
            name = self.unique_name(hint)
            self.params[path] = (name, Expr.leaf(name, kind, dynamic=False, params=frozenset([path])))
        return self.params[path][1]

    def buffer(self, tensor, path, hint):
        first = self.by_tensor.get(id(tensor))
        if first is not None:
            # One buffer serves both paths; a later callable must hold one tensor there too.
            self.checks.append((path, ("same", self.buffers[first][1]._source)))
            return self.buffers[first][1]
        self.checks.append((path, _signature(tensor)))
        original, source = tensor, path
        if tensor.dtype in _CONVERT:
            path = path + (("as", _CONVERT[tensor.dtype]),)
            tensor = tensor.to(getattr(torch, _CONVERT[tensor.dtype]))
        name = self.unique_name(hint)
        proxy = BufferProxy(self, tensor, name, path, source)
        self.buffers[path] = (name, proxy)
        self.by_tensor[id(original)] = path
        return proxy

    def index(self, proxy, indices):
        rank = proxy._tensor.dim()
        if len(indices) > rank:
            raise TranslationError(f"the captured tensor `{proxy._name}` has {rank} dimensions but is indexed with {len(indices)}")
        parts = []
        for i in indices:
            if isinstance(i, (slice, type(Ellipsis), type(None))) or (isinstance(i, torch.Tensor) and i.dim() > 0):
                raise TranslationError(f"indexing the captured tensor `{proxy._name}` with {i!r}; a mod indexes one element with "
                                       "b, h, q_idx, kv_idx, integers and values computed from them")
            part = i._value() if isinstance(i, BufferProxy) else E.literal(i)
            if part.kind == "bool":
                raise TranslationError(f"indexing the captured tensor `{proxy._name}` with a bool (a boolean mask)")
            parts.append(part)
        if len(parts) < rank:
            return PartialLoad(proxy, tuple(indices))
        return Expr.node(proxy._kind, "load", proxy._name, *parts)

    def scalar(self, proxy):
        """A 0-d captured tensor as a value: the buffer is passed as [1] and read at [0]."""
        path = proxy._path
        if path in self.buffers:
            self.buffers[path + (("scalar",),)] = self.buffers.pop(path)
            for key, value in self.by_tensor.items():
                if value == path:
                    self.by_tensor[key] = path + (("scalar",),)
        return Expr.node(proxy._kind, "load", proxy._name, E.literal(0))

    def _find(self, tensor):
        path = self.by_tensor.get(id(tensor))
        if path is not None:
            return self.buffers[path][1]
        for fpath, scope in self.globals:
            for name, value in scope.items():
                if value is tensor:
                    return self.buffer(tensor, fpath + (("global", name),), name)
        raise TranslationError("the mod uses a tensor it did not capture (one made inside the mod, such as torch.tensor(...), or one "
                               "reached other than through its closure, a captured object's attributes or its module's globals), so "
                               "flexjit cannot read it again at the next call; capture it in the mod's closure, or use a number")

    def load(self, tensor, index):
        return self.index(self._find(tensor), index if isinstance(index, tuple) else (index,))

    def tensor_value(self, tensor):
        return self._find(tensor)._value()

    def run(self, fn):
        previous = getattr(_state, "tracer", None)
        _state.tracer = self
        try:
            traced = self.wrap(fn, (), getattr(fn, "__name__", "mod"))
            index = [Expr.leaf(n, "int") for n in ("b", "h", "q", "kv")]
            args = [Expr.leaf("score", "float")] + index if self.kind == "score_mod" else index
            try:
                result = traced(*args)
            except (TranslationError, E.Demote):
                raise
            except Exception as e:
                raise TranslationError(f"running it on symbolic values failed: {type(e).__name__}: {e}") from e
            if isinstance(result, BufferProxy):
                result = result._value()
            result = E.literal(result)
            if self.kind == "mask_mod" and result.kind != "bool":
                raise TranslationError(f"a mask_mod must return a bool, but this one returns an {result.kind}")
            if self.kind == "score_mod":
                if result.kind == "bool":
                    raise TranslationError("a score_mod must return a number, but this one returns a bool")
                result = E.to_float(result)
            return E.render(result)
        finally:
            _state.tracer = previous


def _valid(translation, fn):
    try:
        for path, signature in translation.checks:
            value = resolve(fn, path)
            if signature[0] == "shape":
                ok = tuple(value.shape) == signature[1]
            elif signature[0] == "same":
                ok = value is resolve(fn, signature[1])
            elif signature[0] == "value":
                ok = type(value) is signature[1] and value == signature[2]
            elif signature[0] == "raw":
                ok = type(value) is signature[1]
            else:
                ok = _signature(value) == signature
            if not ok:
                return False
        return True
    except Exception:
        return False


_cache = {}
_dynamic = {}  # cache key -> paths of the specialised numbers that changed value: parameters from then on


def _changed_consts(entries, fn):
    """Paths of numbers that earlier translations hold as constants and that `fn` holds with another value (one that
    Python needs as a constant is demoted again while tracing)."""
    changed = set()
    for translation in entries:
        for path, value in translation.consts:
            try:
                now = resolve(fn, path)
            except Exception:
                continue
            if type(now) is not type(value) or now != value:
                changed.add(path)
    return changed


def _code_of(fn):
    if isinstance(fn, types.MethodType):
        fn = fn.__func__
    return getattr(fn, "__code__", None) or type(fn)


def _where(fn):
    code = getattr(getattr(fn, "__func__", fn), "__code__", None)
    name = getattr(fn, "__qualname__", type(fn).__name__)
    return f"`{name}` ({code.co_filename}:{code.co_firstlineno})" if code else f"`{name}`"


def translate(fn, kind, avoid=()):
    """The Translation of callable `fn` as a `kind` ("score_mod" or "mask_mod"), whose capture
    names avoid `avoid`: cached per code, reused while the captures keep their signatures (and the
    specialised numbers their values)."""
    if not callable(fn):
        raise TypeError(f"{kind} must be callable (or a str in flexjit's language), got {type(fn).__name__}")
    key = (_code_of(fn), kind, tuple(avoid))
    entries = _cache.setdefault(key, [])
    for translation in entries:
        if _valid(translation, fn):
            return translation
    dynamic = _dynamic.setdefault(key, set())
    dynamic |= _changed_consts(entries, fn)
    demoted = set()
    while True:
        tracer = Tracer(kind, demoted, avoid, frozenset(dynamic))
        try:
            text = tracer.run(fn)
        except E.Demote as d:
            if d.params <= demoted:
                raise TranslationError(f"cannot translate {kind} {_where(fn)}: Python needs the value of a parameter") from None
            demoted |= d.params
            continue
        except TranslationError as e:
            raise TranslationError(f"cannot translate {kind} {_where(fn)}: {e}") from None
        translation = Translation(text, tuple((name, path) for path, (name, _) in tracer.buffers.items()),
                                  tuple((name, path) for path, (name, _) in tracer.params.items()), tuple(tracer.checks),
                                  tuple(tracer.consts.items()))
        entries.append(translation)
        return translation
