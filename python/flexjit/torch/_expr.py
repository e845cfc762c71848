"""Symbolic values of flexjit's language, built by running a FlexAttention score_mod / mask_mod
on them: Python operators, tensor methods and torch functions (through __torch_function__)
build a DAG, rendered as a program (shared subexpressions become lets).

A value knows its type in the language (int, float, bool, following torch's promotion of the
int32 index tensors and the float32 score FlexAttention passes), whether it depends on the
index variables (else it is made of parameters and constants only), and which parameters it
uses, so Python control flow on a parameter can fall back to its constant value.
"""
import math
import numbers

import torch

from .._errors import FlexjitError


class TranslationError(FlexjitError):
    """A score_mod / mask_mod uses an operation flexjit's language does not have; the message
    names it and the mod."""


class Demote(Exception):
    """Python needs the concrete value of these parameters (control flow, range(), int())."""

    def __init__(self, params):
        super().__init__(params)
        self.params = params


_FLOAT_DTYPES = {torch.float16, torch.bfloat16, torch.float32, torch.float64}


def dtype_kind(dtype):
    if dtype == torch.bool:
        return "bool"
    return "float" if dtype in _FLOAT_DTYPES else "int"


def _promote(*kinds):
    return "float" if "float" in kinds else "int"


class Expr:
    """A value of the language: a leaf (a variable, parameter, literal or load) or an
    operation over other values."""

    __slots__ = ("kind", "op", "args", "dynamic", "params")

    def __init__(self, kind, op, args, dynamic=False, params=frozenset()):
        self.kind, self.op, self.args = kind, op, args
        self.dynamic, self.params = dynamic, params

    @staticmethod
    def leaf(text, kind, dynamic=True, params=frozenset()):
        return Expr(kind, "leaf", (text,), dynamic, params)

    @staticmethod
    def node(kind, op, *args):
        exprs = [a for a in args if isinstance(a, Expr)]
        return Expr(kind, op, args, any(e.dynamic for e in exprs), frozenset().union(*(e.params for e in exprs)))

    # Tensor-like attributes mods sometimes read.
    @property
    def dtype(self):
        return {"bool": torch.bool, "int": torch.int32, "float": torch.float32}[self.kind]

    @property
    def shape(self):
        return torch.Size([])

    ndim = 0
    device = None

    def dim(self):
        return 0

    def size(self, dim=None):
        return torch.Size([]) if dim is None else 1

    # Python protocols that need a concrete value.
    def _concrete(self, what):
        if not self.dynamic and self.params:
            raise Demote(self.params)
        raise TranslationError(f"{what} on a value that depends on b, h, q_idx, kv_idx or score: flexjit translates the mod once for "
                               "all positions, so it cannot branch on one; use torch.where(cond, a, b), & | ~ for and/or/not, "
                               "torch.minimum / torch.maximum for min / max")

    def __bool__(self):
        self._concrete("Python control flow (if, and, or, not, min(), max(), a chained comparison)")

    def __index__(self):
        self._concrete("using it as a Python int (range(), list indexing)")

    def __int__(self):
        self._concrete("int(x) (use x.int() or x.long())")

    def __float__(self):
        self._concrete("float(x) or a math.* function (use x.float() or the torch function, e.g. torch.tanh)")

    def __iter__(self):
        raise TranslationError("iterating over a scalar value of a mod")

    def __hash__(self):
        return id(self)

    # Operators.
    def __add__(self, o): return arith("+", self, o)
    def __radd__(self, o): return arith("+", o, self)
    def __sub__(self, o): return arith("-", self, o)
    def __rsub__(self, o): return arith("-", o, self)
    def __mul__(self, o): return arith("*", self, o)
    def __rmul__(self, o): return arith("*", o, self)
    def __truediv__(self, o): return true_div(self, o)
    def __rtruediv__(self, o): return true_div(o, self)
    def __floordiv__(self, o): return arith("//", self, o)
    def __rfloordiv__(self, o): return arith("//", o, self)
    def __mod__(self, o): return arith("%", self, o)
    def __rmod__(self, o): return arith("%", o, self)
    def __pow__(self, o): return power(self, o)
    def __rpow__(self, o): return power(o, self)
    def __and__(self, o): return logic("&", self, o)
    def __rand__(self, o): return logic("&", o, self)
    def __or__(self, o): return logic("|", self, o)
    def __ror__(self, o): return logic("|", o, self)
    def __xor__(self, o): return logic("^", self, o)
    def __rxor__(self, o): return logic("^", o, self)
    def __lshift__(self, o): return shift("<<", self, o)
    def __rshift__(self, o): return shift(">>", self, o)
    def __invert__(self): return invert(self)
    def __neg__(self): return negate(self)
    def __pos__(self): return self
    def __abs__(self): return call("abs", self)
    def __lt__(self, o): return compare("<", self, o)
    def __le__(self, o): return compare("<=", self, o)
    def __gt__(self, o): return compare(">", self, o)
    def __ge__(self, o): return compare(">=", self, o)
    def __eq__(self, o): return compare("==", self, o)
    def __ne__(self, o): return compare("!=", self, o)
    def __floor__(self): return call("floor", self)
    def __ceil__(self): return call("ceil", self)
    def __round__(self, ndigits=None): return call("round", self)
    def __trunc__(self): return to_int(self)

    # Tensor methods.
    def abs(self): return call("abs", self)
    def exp(self): return call("exp", self)
    def exp2(self): return call("exp2", self)
    def log(self): return call("log", self)
    def log2(self): return call("log2", self)
    def log1p(self): return call("log1p", self)
    def sqrt(self): return call("sqrt", self)
    def rsqrt(self): return call("rsqrt", self)
    def tanh(self): return call("tanh", self)
    def sigmoid(self): return call("sigmoid", self)
    def sin(self): return call("sin", self)
    def cos(self): return call("cos", self)
    def floor(self): return call("floor", self)
    def ceil(self): return call("ceil", self)
    def round(self): return call("round", self)
    def sign(self): return call("sign", self)
    def neg(self): return negate(self)
    def square(self): return arith("*", self, self)
    def pow(self, e): return power(self, e)
    def clamp(self, min=None, max=None): return clamp(self, min, max)
    def clip(self, min=None, max=None): return clamp(self, min, max)
    def clamp_min(self, m): return clamp(self, m, None)
    def clamp_max(self, m): return clamp(self, None, m)
    def minimum(self, o): return minmax("min", self, o)
    def maximum(self, o): return minmax("max", self, o)
    def where(self, cond, other): return where(cond, self, other)
    def float(self): return to_float(self)
    def double(self): return to_float(self)
    def half(self): return to_float(self)
    def bfloat16(self): return to_float(self)
    def int(self): return to_int(self)
    def long(self): return to_int(self)
    def bool(self): return to_bool(self)
    def logical_and(self, o): return logic("&", to_bool(self), to_bool(o))
    def logical_or(self, o): return logic("|", to_bool(self), to_bool(o))
    def logical_xor(self, o): return logic("^", to_bool(self), to_bool(o))
    def logical_not(self): return invert(to_bool(self))
    def to(self, *args, **kwargs): return convert(self, *args, **kwargs)
    def type(self, dtype): return convert(self, dtype)
    def type_as(self, other): return convert(self, other.dtype)
    def new_ones(self, *args, dtype=None, **kwargs): return constant(1, dtype, self)
    def new_zeros(self, *args, dtype=None, **kwargs): return constant(0, dtype, self)
    def new_full(self, size, value, dtype=None, **kwargs): return constant(value, dtype, self)
    def new_tensor(self, value, dtype=None, **kwargs): return constant(value, dtype, self)
    def item(self): return self
    def detach(self): return self
    def clone(self): return self
    def contiguous(self): return self
    def __getitem__(self, index):
        raise TranslationError("indexing a scalar value of the mod (only captured tensors can be indexed)")

    @classmethod
    def __torch_function__(cls, func, types, args=(), kwargs=None):
        from ._torch_functions import dispatch

        return dispatch(func, args, kwargs or {})


def literal(value):
    """The Expr of a Python (or numpy) number or bool."""
    if isinstance(value, Expr):
        return value
    as_value = getattr(type(value), "_value", None)  # a captured 0-d tensor (flexjit.torch._trace.BufferProxy)
    if as_value is not None:
        return as_value(value)
    if isinstance(value, bool):
        return Expr.leaf("true" if value else "false", "bool", dynamic=False)
    if isinstance(value, numbers.Integral):
        v = int(value)
        return Expr.leaf(str(v) if v >= 0 else f"(-{-v})", "int", dynamic=False)
    if isinstance(value, numbers.Real):
        v = float(value)
        if math.isnan(v):
            raise TranslationError("a NaN constant (the language has no NaN literal)")
        text = "inf" if math.isinf(v) else repr(abs(v))
        return Expr.leaf(text if v >= 0 else f"(-{text})", "float", dynamic=False)
    if isinstance(value, torch.Tensor):
        from ._trace import current_tracer

        return current_tracer().tensor_value(value)
    raise TranslationError(f"a value of type {type(value).__name__} ({value!r:.60}) in an expression")


def _bool_to_int(e):
    return Expr.node("int", "call", "int", e) if e.kind == "bool" else e


def arith(op, a, b):
    a, b = _bool_to_int(literal(a)), _bool_to_int(literal(b))
    return Expr.node(_promote(a.kind, b.kind), "bin", op, a, b)


def true_div(a, b):
    a, b = _bool_to_int(literal(a)), _bool_to_int(literal(b))
    return Expr.node("float", "bin", "/", a, b)


def power(a, b):
    a, b = literal(a), literal(b)
    if b.op == "leaf" and b.args[0] == "2":
        return arith("*", a, a)
    return Expr.node("float", "call", "pow", to_float(a), to_float(b))


def logic(op, a, b):
    a, b = literal(a), literal(b)
    if a.kind == "bool" and b.kind == "bool":
        return Expr.node("bool", "bin", {"&": "&&", "|": "||", "^": "^"}[op], a, b)
    if "float" in (a.kind, b.kind):
        raise TranslationError(f"`{op}` on a float value")
    return Expr.node("int", "bin", op, _bool_to_int(a), _bool_to_int(b))


def shift(op, a, b):
    a, b = literal(a), literal(b)
    if a.kind != "int" or b.kind != "int":
        raise TranslationError(f"`{op}` on a value that is not an int")
    return Expr.node("int", "bin", op, a, b)


def invert(a):
    a = literal(a)
    if a.kind == "bool":
        return Expr.node("bool", "un", "!", a)
    if a.kind == "int":
        return Expr.node("int", "un", "~", a)
    raise TranslationError("`~` on a float value")


def negate(a):
    a = literal(a)
    if a.kind == "bool":
        raise TranslationError("negating a bool (use ~)")
    return Expr.node(a.kind, "un", "-", a)


def compare(op, a, b):
    a, b = literal(a), literal(b)
    if (a.kind == "bool") != (b.kind == "bool") or (a.kind == "bool" and op not in ("==", "!=")):
        a, b = _bool_to_int(a), _bool_to_int(b)
    return Expr.node("bool", "bin", op, a, b)


_FLOAT_CALLS = {"exp", "exp2", "log", "log2", "log1p", "sqrt", "rsqrt", "tanh", "sigmoid", "sin", "cos"}


def call(name, a):
    a = literal(a)
    if name in _FLOAT_CALLS:
        return Expr.node("float", "call", name, to_float(a))
    return Expr.node(_promote(_bool_to_int(a).kind), "call", name, _bool_to_int(a))


def minmax(name, a, b):
    a, b = _bool_to_int(literal(a)), _bool_to_int(literal(b))
    return Expr.node(_promote(a.kind, b.kind), "call", name, a, b)


def clamp(x, lo, hi):
    if lo is not None and hi is not None:
        x, lo, hi = (_bool_to_int(literal(v)) for v in (x, lo, hi))
        return Expr.node(_promote(x.kind, lo.kind, hi.kind), "call", "clamp", x, lo, hi)
    if lo is not None:
        return minmax("max", x, lo)
    if hi is not None:
        return minmax("min", x, hi)
    return literal(x)


def where(cond, a, b):
    cond, a, b = literal(cond), literal(a), literal(b)
    if cond.kind != "bool":
        cond = to_bool(cond)
    if a.kind == "bool" and b.kind == "bool":
        return Expr.node("bool", "call", "where", cond, a, b)
    a, b = _bool_to_int(a), _bool_to_int(b)
    return Expr.node(_promote(a.kind, b.kind), "call", "where", cond, a, b)


def to_float(a):
    a = literal(a)
    return a if a.kind == "float" else Expr.node("float", "call", "float", a)


def to_int(a):
    a = literal(a)
    return a if a.kind == "int" else Expr.node("int", "call", "int", a)


def to_bool(a):
    a = literal(a)
    return a if a.kind == "bool" else compare("!=", a, 0)


def convert(a, *args, **kwargs):
    dtype = kwargs.get("dtype")
    for arg in args:
        if isinstance(arg, torch.dtype):
            dtype = arg
    if dtype is None:
        return literal(a)
    return {"bool": to_bool, "int": to_int, "float": to_float}[dtype_kind(dtype)](a)


def constant(value, dtype, like):
    kind = dtype_kind(dtype) if dtype is not None else (like.kind if isinstance(like, Expr) else None)
    if isinstance(value, numbers.Number) and kind is not None:
        value = {"bool": bool, "int": int, "float": float}[kind](value)
    v = literal(value)
    if kind is None or kind == v.kind:
        return v
    return {"bool": to_bool, "int": to_int, "float": to_float}[kind](v)


def render(root):
    """The program of an Expr: a let for every non-leaf value used more than once, then the result."""
    uses = {}
    order = []

    def visit(e):
        if id(e) in uses:
            uses[id(e)] += 1
            return
        uses[id(e)] = 1
        for a in e.args:
            if isinstance(a, Expr):
                visit(a)
        order.append(e)

    visit(root)
    names = {}
    lets = []
    text = {}
    for e in order:
        if e.op == "leaf":
            t = e.args[0]
        elif e.op == "bin":
            op, a, b = e.args
            t = f"({text[id(a)]} {op} {text[id(b)]})"
        elif e.op == "un":
            op, a = e.args
            t = f"({op}{text[id(a)]})"
        elif e.op == "call":
            t = f"{e.args[0]}({', '.join(text[id(a)] for a in e.args[1:])})"
        else:  # load
            t = f"{e.args[0]}[{', '.join(text[id(a)] for a in e.args[1:])}]"
        if e.op != "leaf" and uses[id(e)] > 1 and e is not root:
            name = names[id(e)] = f"tmp{len(names)}"
            lets.append(f"let {name} = {t};")
            t = name
        text[id(e)] = t
    return "\n".join(lets + [text[id(root)]])
