"""The torch functions and tensor methods a mod may apply to symbolic values (reached through
Expr.__torch_function__), mapped to the language; any other is a TranslationError naming it."""
import torch

from . import _expr as E

_UNARY = {
    "abs": lambda a: E.call("abs", a), "absolute": lambda a: E.call("abs", a), "exp": lambda a: E.call("exp", a),
    "exp2": lambda a: E.call("exp2", a), "log": lambda a: E.call("log", a), "log2": lambda a: E.call("log2", a),
    "log1p": lambda a: E.call("log1p", a), "sqrt": lambda a: E.call("sqrt", a), "rsqrt": lambda a: E.call("rsqrt", a),
    "tanh": lambda a: E.call("tanh", a), "sigmoid": lambda a: E.call("sigmoid", a), "sin": lambda a: E.call("sin", a),
    "cos": lambda a: E.call("cos", a), "floor": lambda a: E.call("floor", a), "ceil": lambda a: E.call("ceil", a),
    "round": lambda a: E.call("round", a), "sign": lambda a: E.call("sign", a), "neg": E.negate, "negative": E.negate,
    "square": lambda a: E.arith("*", a, a), "logical_not": lambda a: E.invert(E.to_bool(a)), "bitwise_not": E.invert,
    "invert": E.invert, "float": E.to_float, "double": E.to_float, "int": E.to_int, "long": E.to_int, "bool": E.to_bool,
    "clone": E.literal, "detach": E.literal, "contiguous": E.literal,
}

_BINARY = {
    "add": lambda a, b: E.arith("+", a, b), "sub": lambda a, b: E.arith("-", a, b), "subtract": lambda a, b: E.arith("-", a, b),
    "mul": lambda a, b: E.arith("*", a, b), "multiply": lambda a, b: E.arith("*", a, b), "truediv": E.true_div,
    "true_divide": E.true_div, "floordiv": lambda a, b: E.arith("//", a, b), "floor_divide": lambda a, b: E.arith("//", a, b),
    "mod": lambda a, b: E.arith("%", a, b), "remainder": lambda a, b: E.arith("%", a, b), "pow": E.power,
    "minimum": lambda a, b: E.minmax("min", a, b), "maximum": lambda a, b: E.minmax("max", a, b),
    "fmin": lambda a, b: E.minmax("min", a, b), "fmax": lambda a, b: E.minmax("max", a, b),
    "eq": lambda a, b: E.compare("==", a, b), "ne": lambda a, b: E.compare("!=", a, b), "not_equal": lambda a, b: E.compare("!=", a, b),
    "lt": lambda a, b: E.compare("<", a, b), "less": lambda a, b: E.compare("<", a, b), "le": lambda a, b: E.compare("<=", a, b),
    "less_equal": lambda a, b: E.compare("<=", a, b), "gt": lambda a, b: E.compare(">", a, b),
    "greater": lambda a, b: E.compare(">", a, b), "ge": lambda a, b: E.compare(">=", a, b),
    "greater_equal": lambda a, b: E.compare(">=", a, b),
    "and": lambda a, b: E.logic("&", a, b), "or": lambda a, b: E.logic("|", a, b), "xor": lambda a, b: E.logic("^", a, b),
    "bitwise_and": lambda a, b: E.logic("&", a, b), "bitwise_or": lambda a, b: E.logic("|", a, b),
    "bitwise_xor": lambda a, b: E.logic("^", a, b),
    "logical_and": lambda a, b: E.logic("&", E.to_bool(a), E.to_bool(b)),
    "logical_or": lambda a, b: E.logic("|", E.to_bool(a), E.to_bool(b)),
    "logical_xor": lambda a, b: E.logic("^", E.to_bool(a), E.to_bool(b)),
    "lshift": lambda a, b: E.shift("<<", a, b), "rshift": lambda a, b: E.shift(">>", a, b),
    "bitwise_left_shift": lambda a, b: E.shift("<<", a, b), "bitwise_right_shift": lambda a, b: E.shift(">>", a, b),
}


def _divide(a, b, rounding_mode=None):
    if rounding_mode is None:
        return E.true_div(a, b)
    if rounding_mode == "floor":
        return E.arith("//", a, b)
    raise E.TranslationError(f"torch.div with rounding_mode={rounding_mode!r} (flexjit has true division and floor division, //)")


def _like(value):
    def make(like, *args, dtype=None, **kwargs):
        return E.constant(value if value is not None else args[0], dtype, like)

    return make


_OTHER = {
    "where": lambda cond, a, b: E.where(cond, a, b),
    "clamp": lambda x, min=None, max=None: E.clamp(x, min, max),
    "clip": lambda x, min=None, max=None: E.clamp(x, min, max),
    "clamp_min": lambda x, m: E.clamp(x, m, None),
    "clamp_max": lambda x, m: E.clamp(x, None, m),
    "div": _divide, "divide": _divide,
    "zeros_like": _like(0), "ones_like": _like(1), "full_like": _like(None),
    "to": E.convert, "type": E.convert,
}


def dispatch(func, args, kwargs):
    """The Expr of torch `func` applied to args with at least one symbolic value."""
    from ._trace import current_tracer

    name = getattr(func, "__name__", repr(func))
    tracer = current_tracer()
    if name == "__getitem__":
        tensor, index = args
        return tracer.load(tensor, index)
    reverse = name.startswith("__r") and name.endswith("__") and name[3:-2] in _BINARY
    base = name[3:-2] if reverse else name.strip("_")
    if base in _UNARY and len(args) == 1 and not kwargs:
        handler = _UNARY[base]
    elif base in _BINARY and len(args) == 2 and not kwargs:
        handler = (lambda a, b: _BINARY[base](b, a)) if reverse else _BINARY[base]
    elif base in _OTHER:
        handler = _OTHER[base]
    else:
        raise E.TranslationError(f"torch.{base} has no counterpart in flexjit's language; a mod may use arithmetic, comparisons, "
                                 "& | ~, //, %, indexing of captured tensors, torch.where, torch.clamp, torch.minimum/maximum and "
                                 "abs exp exp2 log log2 log1p sqrt rsqrt tanh sigmoid sin cos floor ceil round sign pow")
    args = [tracer.tensor_value(a) if isinstance(a, torch.Tensor) else E.literal(a) if hasattr(type(a), "_value") else a for a in args]
    try:
        return handler(*args, **kwargs)
    except TypeError as e:
        raise E.TranslationError(f"torch.{base} called with arguments flexjit does not take ({e})") from None
