"""The router: ``XlaTensor.__torch_dispatch__`` sends every ATen call here.

Resolution order for one ATen overload, decided once per op (``_resolve``)
and stored on its ``OpFacts`` as ``route`` (+ ``decompose_first``):

1. a *special op*: a handler registered with ``@special``, by name or by
   schema-name prefix: transfers, ``copy_``, ``.item()``, metadata-changing
   in-place views, ``equal``/``allclose``, batch norm's decomposition
   (``dispatch._special``); every ``_foreach_*`` overload (``dispatch._foreach``);
   the data-dependent ops, run on CPU copies (``nonzero``, ``unique``...), and
   ``index``/``index_put``, which go there for boolean masks and on to 4/5
   otherwise (the CPU fallback, ``dispatch._fallback``);
2. a CompositeImplicitAutograd op with no lowering: ``op.decompose()`` first
   (``decompose_first``); if torch returns NotImplemented, on to 3-6;
3. a view op: a new tensor sharing the storage, with one more ``ViewStep``;
4. a mutating op with no lowering of its own (``add_``, ``out=``): run the
   functional twin and write the result back;
5. a registered lowering: record a node (output shapes from torch's meta
   kernels, cached by argument signature);
6. otherwise torch's decomposition table, then ``op.decompose()``, else
   ``NotImplementedError`` naming the overload.

Handlers have the signature ``handler(func, args, kwargs, facts)`` and live in
``spmdtorch.tensor.dispatch`` (above the tensor class, which they build);
they register here when that package is imported (``spmdtorch.tensor`` does),
as lowerings register with ``spmdtorch.ops.register``. The per-op cost of
routing is one dict lookup by ``id(func)`` and one call.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any, TypeVar

from spmdtorch.lazy import caches, metrics
from spmdtorch.ops import registry
from spmdtorch.tensor._facts import OpFacts, Route, op_facts

if TYPE_CHECKING:
    from spmdtorch.tensor._facts import Op

__all__ = [
    "PATHS",
    "dispatch",
    "facts_of",
    "path",
    "reset_op_facts",
    "special",
    "special_op",
    "torch_function",
    "torch_function_handler",
]

Handler = Route  # (func, args, kwargs, facts) -> result
# torch_function_handler's: (func, args, kwargs) -> result.
TorchFunctionHandler = Callable[[Any, tuple[Any, ...], dict[str, Any]], Any]
# A registering decorator hands the handler back as it was (its own signature kept).
_H = TypeVar("_H", bound=Handler)

# id(OpOverload) -> OpFacts with its route. OpOverload.__hash__ is Python-level,
# and the hot path looks an op up once per call: an int key keeps that lookup
# cheap (ops are long-lived singletons, so their ids are stable).
_FACTS_BY_ID: dict[int, OpFacts] = {}
_SPECIAL: dict[object, Handler] = {}  # OpOverload -> handler (step 1)
_PREFIXES: list[tuple[str, Handler]] = []  # (schema-name prefix, handler) (step 1)
# The general paths, steps 3-6: "view", "mutation", "lowering", "decompose".
PATHS: dict[str, Handler] = {}
_PATH_KINDS = ("view", "mutation", "lowering", "decompose")


def special(*names: str, prefix: str | None = None) -> Callable[[_H], _H]:
    """Register the decorated handler for the ATen ops ``names`` (``"packet.overload"`` or ``"packet"``).

    ``prefix``: also every op whose schema name starts with it (``"aten::_foreach_"``:
    ``dir(aten)`` lists only the packets loaded so far, so they cannot be enumerated).
    """

    def deco(fn: _H) -> _H:
        for name in names:
            for op in registry.resolve_ops(name):
                if _SPECIAL.get(op, fn) is not fn:
                    raise ValueError(f"{op} already has the special handler {_SPECIAL[op].__qualname__}")
                _SPECIAL[op] = fn
        if prefix is not None:
            _PREFIXES.append((prefix, fn))
        reset_op_facts()
        return fn

    return deco


def special_op(*ops: object) -> Callable[[_H], _H]:
    """Register the decorated handler for operator overloads given as objects (custom ``torch.library`` ops).

    What ``special`` does for ATen names, for ops outside ``torch.ops.aten``:
    the handler runs for the op whether it reaches the router through
    ``XlaTensor.__torch_dispatch__`` or through spmdtorch's own dispatch
    modes (backward passes).
    """

    def deco(fn: _H) -> _H:
        for op in ops:
            if _SPECIAL.get(op, fn) is not fn:
                raise ValueError(f"{op} already has the special handler {_SPECIAL[op].__qualname__}")
            _SPECIAL[op] = fn
        reset_op_facts()
        return fn

    return deco


def path(kind: str) -> Callable[[_H], _H]:
    """Register the decorated handler as general path ``kind`` (one of ``_PATH_KINDS``)."""
    if kind not in _PATH_KINDS:
        raise ValueError(f"unknown dispatch path {kind!r}; expected one of {_PATH_KINDS}")

    def deco(fn: _H) -> _H:
        PATHS[kind] = fn
        reset_op_facts()
        return fn

    return deco


_TORCH_FUNCTION: list[TorchFunctionHandler] = []  # the one torch-level handler (torch_function_handler)


def torch_function_handler(fn: TorchFunctionHandler) -> TorchFunctionHandler:
    """Register the decorated ``fn(func, args, kwargs)`` for torch-level calls with an xla argument.

    ``XlaTensor.__torch_function__`` calls it (``torch_function``) with
    subclass torch-function handling disabled; ``spmdtorch.tensor.device_mode``
    registers it (autocast, index lists, composites that build helper tensors
    on the storage device).
    """
    _TORCH_FUNCTION[:] = [fn]
    return fn


def torch_function(func: Callable[..., Any], args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    """Run one torch-level call that has an xla tensor argument (the registered handler)."""
    if not _TORCH_FUNCTION:
        raise RuntimeError(
            f"no torch-function handler is registered (for {func}): import spmdtorch.tensor, "
            "which registers spmdtorch.tensor.device_mode's"
        )
    return _TORCH_FUNCTION[0](func, args, kwargs)


def reset_op_facts() -> None:
    """Forget every op's cached facts (after changing the lowering or decomposition tables)."""
    op_facts.cache.clear()
    _FACTS_BY_ID.clear()


# Keyed by id(OpOverload): ops are never freed, and torch defines a few thousand.
caches.register(
    "tensor.dispatch.op_facts",
    reset_op_facts,
    size=lambda: len(_FACTS_BY_ID),
    bound="one entry per ATen overload called (a finite set, never freed)",
)


def facts_of(func: Op) -> OpFacts:
    """``func``'s facts, route included (``dispatch`` inlines this lookup)."""
    return _FACTS_BY_ID.get(id(func)) or _resolve(func)


def _resolve(func: Op) -> OpFacts:
    facts = op_facts(func)
    route = _SPECIAL.get(func)
    if route is None:
        name = func._schema.name
        route = next((fn for p, fn in _PREFIXES if name.startswith(p)), None)
    if route is not None:
        facts.route, facts.decompose_first = route, False
    else:
        if facts.is_view:
            kind = "view"
        elif facts.mutable_pos and facts.lowering is None:
            kind = "mutation"
        elif facts.lowering is not None:
            kind = "lowering"
        else:
            kind = "decompose"
        handler = PATHS.get(kind)
        if handler is None:
            raise RuntimeError(
                f"no dispatch path {kind!r} is registered (for {func}): import spmdtorch.tensor, "
                "which registers spmdtorch.tensor.dispatch's handlers"
            )
        facts.route, facts.decompose_first = handler, facts.implicit
    _FACTS_BY_ID[id(func)] = facts
    return facts


_COUNTERS = metrics.counters  # one object for the process (metrics.reset clears it in place)


def dispatch(func: Op, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    """Run one ATen call on xla tensors (``kwargs`` a dict): see the module docstring for the order."""
    _COUNTERS["DispatchedOps"] += 1
    facts = _FACTS_BY_ID.get(id(func)) or _resolve(func)
    if facts.decompose_first:
        out = func.decompose(*args, **kwargs)
        if out is not NotImplemented:
            return out
    return facts.route(func, args, kwargs, facts)
