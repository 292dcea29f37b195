"""Float optimizer hyperparameters as inputs of a compiled step (``spmdtorch.compile``).

Why: a scheduler writes a new Python float into ``param_groups`` every step
(``OneCycleLR`` cycles ``lr`` and, by default, Adam's ``betas`` or SGD's
``momentum``). The optimizer turns those floats into the numbers its ops take
with Python arithmetic (``1 - beta1``, ``1 - lr * weight_decay``, ``-lr``)
before they reach a traced op, where only the resulting number is seen.
Guarded by value, every change traced the step again.

How: while a compiled step is traced (with its numbers lifted to program
inputs, ``executor._Layout``), each float hyperparameter of a torch optimizer
is a :class:`TracedFloat` during ``optimizer.step()``: a ``float`` (its value
and every result are exactly Python's) that also records the expression it
came from. The program's lifted numbers are then matched, bit for bit, to the
values of these expressions, and a number that exactly one expression gave
gets that expression as its *recipe*. Comparisons (``weight_decay != 0``,
``bool(momentum)``) are recorded as *guards*. A replay re-evaluates the
recipes from the current ``param_groups`` and checks the guards.

Why this is safe (invariants the caller, ``_compile``, keeps):

* A hyperparameter is guarded by type only once it is *proven*: two
  consecutive traces recorded the same program, with the same recipes, while
  its value differed between them. A value that escaped the recording (read
  by C code such as ``math.sqrt``, or passed where an op needs a constant)
  then differs between the two traces' programs, so they are not the same
  and the step is not replayed; a number matched to the wrong expression by
  coincidence does not match it again at another value.
* Only optimizers whose ``step`` is torch's own (``torch.optim``) are
  recorded: their steps use hyperparameters in arithmetic and comparisons
  only. Any other optimizer's hyperparameters stay guarded by value.
* Nothing is recorded when the trace bakes numbers into the program as
  constants: a baked number cannot take a new value at replay.

Example:
    >>> rec = Recording()
    >>> lr = TracedFloat(0.1, ("hp", 0, 0, "lr", None), rec)
    >>> x = 1 - lr * 0.5
    >>> type(x) is TracedFloat, x == 0.95
    (True, True)
    >>> evaluate(x.expr, {("hp", 0, 0, "lr", None): 0.2}.__getitem__)
    0.9
    >>> rec.guards  # ``x == 0.95`` above was a comparison: replays check it
    {(('-', ('c', 1), ('*', ('hp', 0, 0, 'lr', None), ('c', 0.5))), 'eq', ('c', 0.95), True)}
"""

from __future__ import annotations

import dataclasses
import operator
from collections.abc import Callable
from typing import Any

__all__ = ["Recording", "TracedFloat", "evaluate", "liftable", "wrap_groups"]

# An expression: ("hp", id(optimizer), group index, key, tuple index or None)
# for a hyperparameter, ("c", number) for a constant, (op, *operands) otherwise.
Expr = tuple

_BINARY: dict[str, Callable[[Any, Any], Any]] = {
    "+": operator.add,
    "-": operator.sub,
    "*": operator.mul,
    "/": operator.truediv,
    "**": operator.pow,
    "//": operator.floordiv,
    "%": operator.mod,
}
_UNARY: dict[str, Callable[[Any], Any]] = {"neg": operator.neg, "pos": operator.pos, "abs": operator.abs}
_COMPARE: dict[str, Callable[[Any, Any], bool]] = {
    "eq": operator.eq,
    "ne": operator.ne,
    "lt": operator.lt,
    "le": operator.le,
    "gt": operator.gt,
    "ge": operator.ge,
}


@dataclasses.dataclass(eq=False)
class Recording:
    """What one trace's hyperparameters did: values made, comparisons, escapes, groups to restore.

    Attributes:
        values: ``float.hex()`` of every value an expression gave -> the distinct expressions that gave it.
        guards: ``(expr, comparison, other expr, result)`` of each comparison made.
        escaped: hyperparameter leaves converted to an ``int`` or a plain ``float`` (never proven).
        wrapped: ``(group dict, key, original value)`` per wrapped entry, to put back.
    """

    values: dict[str, set[Expr]] = dataclasses.field(default_factory=dict)
    guards: set[tuple] = dataclasses.field(default_factory=set)
    escaped: set[Expr] = dataclasses.field(default_factory=set)
    wrapped: list[tuple[dict, str, Any]] = dataclasses.field(default_factory=list)

    def note(self, value: float, expr: Expr) -> None:
        self.values.setdefault(value.hex(), set()).add(expr)

    def recipe(self, value: float) -> Expr | None:
        """The one expression that gave ``value`` in this trace (None: none, or several different ones)."""
        exprs = self.values.get(value.hex())
        if exprs is None or len(exprs) != 1:
            return None
        return next(iter(exprs))

    def restore(self) -> None:
        """Put the original values back into the param groups (after ``step()``, or when the trace fails)."""
        for group, key, original in reversed(self.wrapped):
            group[key] = original
        self.wrapped.clear()


def leaves(expr: Expr) -> set[Expr]:
    """The hyperparameter leaves an expression reads."""
    if expr[0] == "hp":
        return {expr}
    if expr[0] == "c":
        return set()
    out: set[Expr] = set()
    for e in expr[1:]:
        out |= leaves(e)
    return out


def evaluate(expr: Expr, lookup: Callable[[Expr], Any]) -> Any:
    """The value of ``expr`` with each hyperparameter leaf read by ``lookup``: Python's arithmetic, op by op."""
    head = expr[0]
    if head == "hp":
        return lookup(expr)
    if head == "c":
        return expr[1]
    if head in _UNARY:
        return _UNARY[head](evaluate(expr[1], lookup))
    return _BINARY[head](evaluate(expr[1], lookup), evaluate(expr[2], lookup))


def guards_hold(guards, lookup: Callable[[Expr], Any]) -> bool:
    """Whether every recorded comparison gives the same result with the values ``lookup`` reads."""
    for expr, op, other, result in guards:
        a = evaluate(expr, lookup)
        now = bool(a) if op == "bool" else _COMPARE[op](a, evaluate(other, lookup))
        if now != result:
            return False
    return True


class TracedFloat(float):
    """A float hyperparameter (or a number computed from ones) that records its expression while traced.

    Every arithmetic result is computed by ``float`` itself, so the trace sees
    exactly the numbers eager Python would; a result involving only numbers
    and this trace's ``TracedFloat``\\ s is one too.
    """

    __slots__ = ("expr", "recording")

    expr: Expr
    recording: Recording

    def __new__(cls, value: float, expr: Expr, recording: Recording) -> TracedFloat:
        self = super().__new__(cls, value)
        self.expr = expr
        self.recording = recording
        recording.note(float.__float__(self), expr)
        return self

    def _operand(self, other) -> Expr | None:
        if type(other) is TracedFloat and other.recording is self.recording:
            return other.expr
        if type(other) in (int, float, TracedFloat):  # a TracedFloat of an earlier trace: its value
            return ("c", float.__float__(other) if isinstance(other, float) else other)
        return None  # anything else (a tensor): float's own answer, NotImplemented

    def _binary(self, op: str, other, reflected: bool):
        fn = _BINARY[op]
        me = float.__float__(self)
        rhs = self._operand(other)
        if rhs is None:
            return fn(other, me) if reflected else fn(me, other)
        value = (
            fn(float.__float__(other) if isinstance(other, float) else other, me)
            if reflected
            else fn(me, float.__float__(other) if isinstance(other, float) else other)
        )
        if type(value) is not float:  # complex (a negative number to a fractional power): not recorded
            self._escape()
            return value
        expr = (op, rhs, self.expr) if reflected else (op, self.expr, rhs)
        return TracedFloat(value, expr, self.recording)

    def _compare(self, op: str, other):
        rhs = self._operand(other)
        me = float.__float__(self)
        if rhs is None:
            return _COMPARE[op](me, other)
        result = _COMPARE[op](me, rhs[1] if rhs[0] == "c" else float.__float__(other))
        self.recording.guards.add((self.expr, op, rhs, result))
        return result

    def _escape(self) -> None:
        self.recording.escaped |= leaves(self.expr)

    def __add__(self, o):
        return self._binary("+", o, False)

    def __radd__(self, o):
        return self._binary("+", o, True)

    def __sub__(self, o):
        return self._binary("-", o, False)

    def __rsub__(self, o):
        return self._binary("-", o, True)

    def __mul__(self, o):
        return self._binary("*", o, False)

    def __rmul__(self, o):
        return self._binary("*", o, True)

    def __truediv__(self, o):
        return self._binary("/", o, False)

    def __rtruediv__(self, o):
        return self._binary("/", o, True)

    def __floordiv__(self, o):
        return self._binary("//", o, False)

    def __rfloordiv__(self, o):
        return self._binary("//", o, True)

    def __mod__(self, o):
        return self._binary("%", o, False)

    def __rmod__(self, o):
        return self._binary("%", o, True)

    def __pow__(self, o, mod=None):
        if mod is not None:
            self._escape()
            return pow(float.__float__(self), o, mod)
        return self._binary("**", o, False)

    def __rpow__(self, o, mod=None):
        if mod is not None:
            self._escape()
            return pow(o, float.__float__(self), mod)
        return self._binary("**", o, True)

    def _unary(self, op: str):
        return TracedFloat(_UNARY[op](float.__float__(self)), (op, self.expr), self.recording)

    def __neg__(self):
        return self._unary("neg")

    def __pos__(self):
        return self._unary("pos")

    def __abs__(self):
        return self._unary("abs")

    def __eq__(self, o):
        return self._compare("eq", o)

    def __ne__(self, o):
        return self._compare("ne", o)

    def __lt__(self, o):
        return self._compare("lt", o)

    def __le__(self, o):
        return self._compare("le", o)

    def __gt__(self, o):
        return self._compare("gt", o)

    def __ge__(self, o):
        return self._compare("ge", o)

    __hash__ = float.__hash__

    def __bool__(self):
        result = float.__float__(self) != 0.0
        self.recording.guards.add((self.expr, "bool", None, result))
        return result

    # Conversions leave the recording: the hyperparameters read are never
    # proven (guarded by value), whatever the value is used for next.
    def __float__(self):
        self._escape()
        return float.__float__(self)

    def __int__(self):
        self._escape()
        return float.__int__(self)

    def __trunc__(self):
        self._escape()
        return float.__trunc__(self)

    def __floor__(self):
        self._escape()
        return float.__floor__(self)

    def __ceil__(self):
        self._escape()
        return float.__ceil__(self)

    def __round__(self, ndigits=None):
        self._escape()
        return float.__round__(self, ndigits)

    def __divmod__(self, o):
        self._escape()
        return divmod(float.__float__(self), o)

    def __rdivmod__(self, o):
        self._escape()
        return divmod(o, float.__float__(self))

    def __reduce__(self):  # a copy (deepcopy, pickle) is the plain number
        self._escape()
        return (float, (float.__float__(self),))


def liftable(optimizer) -> bool:
    """Whether ``optimizer``'s step is torch's own (arithmetic and comparisons on its hyperparameters only)."""
    step = getattr(type(optimizer), "step", None)
    return str(getattr(step, "__module__", "")).startswith("torch.optim.")


def wrap_groups(optimizer, recording: Recording) -> None:
    """Replace each float (and each float in a tuple, Adam's ``betas``) of ``optimizer``'s groups by a TracedFloat.

    ``recording.restore()`` puts the originals back; the leaf of ``group[key]``
    (``[index]``) is ``("hp", id(optimizer), group index, key, index)``.
    """
    opt_id = id(optimizer)
    for gi, group in enumerate(optimizer.param_groups):
        for key, value in list(group.items()):
            if key == "params":
                continue
            if type(value) is float:
                recording.wrapped.append((group, key, value))
                group[key] = TracedFloat(value, ("hp", opt_id, gi, key, None), recording)
            elif type(value) is tuple and any(type(v) is float for v in value):
                recording.wrapped.append((group, key, value))
                group[key] = tuple(
                    TracedFloat(v, ("hp", opt_id, gi, key, i), recording) if type(v) is float else v
                    for i, v in enumerate(value)
                )


def read_leaf(optimizers: dict, leaf: Expr) -> Any:
    """The current value of a hyperparameter leaf; ``optimizers``: ``id`` -> ``(weakref, hparams)``."""
    _, opt_id, gi, key, index = leaf
    opt = optimizers[opt_id][0]()
    value = opt.param_groups[gi][key]
    return value if index is None else value[index]
