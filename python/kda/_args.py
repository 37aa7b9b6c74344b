"""Argument checks of the kda package, run before any C call.

The rule (README "Use from Python / C"): an argument of the wrong Python type raises TypeError
naming it (an int is expected and a float, str, bool or None came; a sequence of ints and a str
or a set came; a str and bytes came; a tensor without __dlpack__ came). A value of the right type
that the call cannot take raises kda.Error(INVALID_ARGUMENT) naming it: an integer outside the C
type's range (int32, int64, a pointer) or outside the argument's own range (a slot in [0, S), T
in [1, T_max], ...), a string with a NUL character or that UTF-8 cannot encode, an unknown name.
Nothing is coerced: no float or str becomes an int, no int wraps modulo 2**32 through ctypes,
and no string is cut at a NUL by the C side.
"""

import ctypes
import numbers
import operator
import os

from ._errors import INVALID_ARGUMENT, Error

INT32_MIN = -(2 ** 31)
INT32_MAX = 2 ** 31 - 1
INT64_MAX = 2 ** 63 - 1
POINTER_MAX = 2 ** (8 * ctypes.sizeof(ctypes.c_void_p)) - 1

# Iterables that are not sequences of ints here (a str iterates its characters, a set in no
# particular order, a dict its keys).
_NOT_INT_SEQUENCES = (str, bytes, bytearray, memoryview, dict, set, frozenset)


def _type_name(value):
    return type(value).__name__


def _is_bool(value):
    return isinstance(value, bool) or _type_name(value) == "bool_"  # numpy.bool_ too


def integer(value, call, name, lo=INT32_MIN, hi=INT32_MAX, *, hi_open=False, note=""):
    """``value`` as a Python int: any integer (int, numpy integer, ``__index__``) but bool, in
    [lo, hi] ([lo, hi) with ``hi_open``); ``note`` follows the range in the message."""
    if _is_bool(value):
        raise TypeError(f"{call}: {name}: expected an int, got bool")
    try:
        v = operator.index(value)
    except TypeError:
        raise TypeError(f"{call}: {name}: expected an int, got {_type_name(value)}") from None
    if v < lo or v > hi or (hi_open and v == hi):
        raise Error(INVALID_ARGUMENT, f"{call}: {name} = {v} out of range [{lo}, {hi}"
                    f"{')' if hi_open else ']'}{note}")
    return v


def int_array(values, call, name, lo=INT32_MIN, hi=INT32_MAX, *, hi_open=False, note=""):
    """A 1-D sequence of ints (list, tuple, range, 1-D array, any iterable but a str, bytes, a
    set or a dict), each checked as integer(); returns (ctypes int32 array, count)."""
    if isinstance(values, _NOT_INT_SEQUENCES):
        raise TypeError(f"{call}: {name}: expected a sequence of ints, got {_type_name(values)}")
    ndim = getattr(values, "ndim", 1)
    if ndim != 1:
        raise Error(INVALID_ARGUMENT, f"{call}: {name}: expected a 1-D sequence of ints, got "
                    f"{ndim} dims")
    try:
        iterator = iter(values)
    except TypeError:
        raise TypeError(f"{call}: {name}: expected a sequence of ints, got "
                        f"{_type_name(values)}") from None
    items = [integer(v, call, f"{name}[{i}]", lo, hi, hi_open=hi_open, note=note)
             for i, v in enumerate(iterator)]
    if len(items) > INT32_MAX:
        raise Error(INVALID_ARGUMENT, f"{call}: {name}: {len(items)} entries, at most "
                    f"{INT32_MAX}")
    return (ctypes.c_int32 * max(len(items), 1))(*items), len(items)


def string(value, call, name):
    """A str as NUL-terminated UTF-8 bytes: no NUL inside (C would stop there), encodable."""
    if not isinstance(value, str):
        raise TypeError(f"{call}: {name}: expected a str, got {_type_name(value)}")
    nul = value.find("\0")
    if nul >= 0:
        raise Error(INVALID_ARGUMENT, f"{call}: {name}: {value!r} has a NUL character at index "
                    f"{nul} (the C string would end there)")
    try:
        return value.encode("utf-8")
    except UnicodeEncodeError as e:
        raise Error(INVALID_ARGUMENT, f"{call}: {name}: {value!r} is not encodable as UTF-8 "
                    f"({e.reason} at index {e.start})") from None


def path(value, call, name):
    """A file system path (str or os.PathLike to a str) without a NUL; None stays None."""
    if value is None:
        return None
    try:
        fs = os.fspath(value)
    except TypeError:
        raise TypeError(f"{call}: {name}: expected a path (str or os.PathLike), got "
                        f"{_type_name(value)}") from None
    if not isinstance(fs, str):
        raise TypeError(f"{call}: {name}: expected a str path, got {_type_name(fs)}")
    string(fs, call, name)
    return fs


def real(value, call, name):
    """A real number (int or float, numpy's too) as a float; not a bool or a str."""
    if _is_bool(value) or not isinstance(value, numbers.Real):
        raise TypeError(f"{call}: {name}: expected a float, got {_type_name(value)}")
    return float(value)


def flag(value, call, name):
    """A bool, or an int 0 / 1, as 0 or 1."""
    if _is_bool(value):
        return 1 if value else 0
    return integer(value, call, name, 0, 1)


def stream(value, call):
    """A cudaStream_t handle: None (0), a non-negative int, or an object with ``.cuda_stream``
    (e.g. a torch.cuda.Stream)."""
    if value is None:
        return 0
    if hasattr(value, "cuda_stream"):
        return integer(value.cuda_stream, call, "stream.cuda_stream", 0, POINTER_MAX)
    return integer(value, call, "stream", 0, POINTER_MAX)


def sequence(values, call, name):
    """A list or tuple (not a str) as a list, for sequences of strings (flags)."""
    if isinstance(values, _NOT_INT_SEQUENCES):
        raise TypeError(f"{call}: {name}: expected a sequence of str, got {_type_name(values)}")
    try:
        return list(values)
    except TypeError:
        raise TypeError(f"{call}: {name}: expected a sequence of str, got "
                        f"{_type_name(values)}") from None
