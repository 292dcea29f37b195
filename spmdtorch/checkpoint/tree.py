"""A training state as key paths and leaves, and its JSON description.

A state is any nesting of dicts (str or int keys), lists and tuples whose
leaves are xla tensors, CPU tensors or plain Python values (None, bool, int,
float, str). Tensors become arrays in the Orbax tree; everything else is kept,
exactly, in a JSON record beside it. A key path is the tuple of keys from the
root to a leaf; :func:`keystr` prints it the way the state is indexed
(``['optimizer']['state'][0]['exp_avg']``).

Example:
    >>> import torch
    >>> entries = flatten({"step": 3, "w": torch.zeros(2)})
    >>> [(keystr(e.path), e.kind) for e in entries]
    [("['step']", 'value'), ("['w']", 'cpu')]
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping
from typing import Any, TypeAlias

import torch

from spmdtorch.checkpoint.errors import CheckpointCorruptionError, UnsupportedValueError
from spmdtorch.tensor.xla_tensor import XlaTensor

__all__ = [
    "ArrayRef",
    "Entry",
    "decode",
    "decode_state",
    "encode",
    "flatten",
    "keystr",
    "orbax_name",
    "orbax_tree",
    "replace_values",
]

_PLAIN = (type(None), bool, int, float, str)

#: A dict key (str or int) or a list/tuple index on the way to a leaf.
Key: TypeAlias = "str | int"
#: The keys from the root of a state to one leaf.
KeyPath: TypeAlias = "tuple[Key, ...]"
#: A node of the JSON record (see :func:`encode`): a one-key dict.
JsonNode: TypeAlias = "dict[str, Any]"


@dataclasses.dataclass(frozen=True)
class Entry:
    """One leaf of a state.

    Attributes:
        path: the keys from the root to the leaf.
        kind: ``"xla"`` (an xla tensor), ``"cpu"`` (a CPU tensor) or ``"value"``.
        value: the leaf itself.
    """

    path: KeyPath
    kind: str
    value: Any


def keystr(path: KeyPath) -> str:
    """``('optimizer', 'state', 0)`` → ``"['optimizer']['state'][0]"`` (``"<root>"`` for ``()``)."""
    return "".join(f"[{k!r}]" for k in path) or "<root>"


def _kind(value: object, path: KeyPath) -> str:
    if isinstance(value, XlaTensor):
        return "xla"
    if isinstance(value, torch.Tensor):
        if value.device.type != "cpu":
            raise UnsupportedValueError(
                f"state{keystr(path)} is a tensor on {value.device}; spmdtorch.checkpoint saves xla and CPU "
                "tensors: move it with .to('xla') or .cpu() first"
            )
        if value.is_sparse or value.layout != torch.strided:
            raise UnsupportedValueError(
                f"state{keystr(path)} is a {value.layout} tensor; only dense (strided) tensors can be "
                "checkpointed: save t.to_dense()"
            )
        return "cpu"
    if isinstance(value, _PLAIN):
        return "value"
    raise UnsupportedValueError(
        f"state{keystr(path)} is a {type(value).__module__}.{type(value).__qualname__}; a checkpointed state "
        "holds dicts, lists, tuples, tensors and None/bool/int/float/str: convert it (e.g. a numpy array "
        "with torch.from_numpy, an object with its state_dict())"
    )


def _check_key(key: object, path: KeyPath) -> None:
    if isinstance(key, bool) or not isinstance(key, (str, int)):
        raise UnsupportedValueError(
            f"state{keystr(path)} has the key {key!r} of type {type(key).__name__}; dict keys must be str "
            "or int: convert the key"
        )


def flatten(state: object) -> list[Entry]:
    """The leaves of ``state`` in a deterministic order (dict insertion order).

    Raises:
        UnsupportedValueError: a leaf or a dict key that cannot be checkpointed.
    """
    out: list[Entry] = []

    def walk(node: object, path: KeyPath) -> None:
        if isinstance(node, dict):
            for k, v in node.items():
                _check_key(k, path)
                walk(v, path + (k,))
        elif isinstance(node, (list, tuple)) and not isinstance(node, torch.Size):
            for i, v in enumerate(node):
                walk(v, path + (i,))
        else:
            out.append(Entry(path, _kind(node, path), node))

    walk(state, ())
    return out


def _encode_value(v: object) -> JsonNode:
    if isinstance(v, float) and not math.isfinite(v):
        # Strict JSON has no NaN/inf; the record must stay readable by any JSON reader.
        return {"float": repr(v)}
    return {"v": v}


def encode(state: object, array_index: Mapping[KeyPath, int]) -> JsonNode:
    """A JSON description of ``state``; tensors become ``{"array": i}`` (``array_index[path]``)."""

    def enc(node: object, path: KeyPath) -> JsonNode:
        if isinstance(node, dict):
            return {"dict": [[k, enc(v, path + (k,))] for k, v in node.items()]}
        if isinstance(node, (list, tuple)) and not isinstance(node, torch.Size):
            tag = "list" if isinstance(node, list) else "tuple"
            return {tag: [enc(v, path + (i,)) for i, v in enumerate(node)]}
        if path in array_index:
            return {"array": array_index[path]}
        return _encode_value(node)

    return enc(state, ())


_NODE_TAGS = frozenset({"dict", "list", "tuple", "array", "float", "v"})


def _field(path: KeyPath) -> str:
    return f"tree{keystr(path)}" if path else "tree"


def decode(node: JsonNode, where: str = "the checkpoint record") -> dict[KeyPath, tuple[str, Any]]:  # noqa: C901  (why: one check per node kind of an on-disk record, each naming the damage)
    """``{path: ("array", i) | ("value", python value)}`` for every leaf of an encoded state.

    The record is read from disk, so every node is checked against what
    :func:`encode` writes. The walk is iterative: a hand-made record nested
    100,000 deep is refused by name instead of exhausting Python's stack.

    Raises:
        CheckpointCorruptionError: a node that :func:`encode` cannot have
            written (a wrong tag, a non-str/int key, a duplicate key, an array
            index that is not a non-negative int, a float that does not
            parse); the message names ``where`` and the node's key path.
    """
    out: dict[KeyPath, tuple[str, Any]] = {}

    def bad(path: KeyPath, what: str) -> CheckpointCorruptionError:
        return CheckpointCorruptionError(
            f"{where}: field {_field(path)} {what}; the record was altered or damaged: restore another checkpoint"
        )

    stack: list[tuple[Any, KeyPath]] = [(node, ())]
    while stack:
        n, path = stack.pop()
        if not isinstance(n, dict) or len(n) != 1 or next(iter(n)) not in _NODE_TAGS:
            shown = sorted(map(str, n)) if isinstance(n, dict) else type(n).__name__
            raise bad(path, f"must be an object with one of the keys {sorted(_NODE_TAGS)}, got {shown}")
        ((tag, body),) = n.items()
        if tag == "dict":
            if not isinstance(body, list):
                raise bad(path, f"'dict' must be a list of [key, node] pairs, got {type(body).__name__}")
            seen: set[Key] = set()
            children = []
            for pair in body:
                if not isinstance(pair, list) or len(pair) != 2:
                    raise bad(path, f"'dict' holds {pair!r:.80}, not a [key, node] pair")
                k, v = pair
                if isinstance(k, bool) or not isinstance(k, (str, int)):
                    raise bad(path, f"has the key {k!r:.80} of type {type(k).__name__}; keys are str or int")
                if k in seen:
                    raise bad(path, f"holds the key {k!r:.80} twice")
                seen.add(k)
                children.append((v, path + (k,)))
            stack.extend(reversed(children))
        elif tag in ("list", "tuple"):
            if not isinstance(body, list):
                raise bad(path, f"{tag!r} must be a list of nodes, got {type(body).__name__}")
            stack.extend(reversed([(v, path + (i,)) for i, v in enumerate(body)]))
        elif tag == "array":
            if isinstance(body, bool) or not isinstance(body, int) or body < 0:
                raise bad(path, f"'array' must be a non-negative int (an index into 'arrays'), got {body!r:.80}")
            out[path] = ("array", body)
        elif tag == "float":
            try:
                value = float(body) if isinstance(body, str) else None
            except ValueError:
                value = None
            if value is None:
                raise bad(path, f"'float' must be a string such as 'nan' or 'inf', got {body!r:.80}")
            out[path] = ("value", value)
        else:
            if not isinstance(body, _PLAIN):
                raise bad(path, f"'v' must be null, a bool, a number or a string, got {type(body).__name__}")
            out[path] = ("value", body)
    return out


@dataclasses.dataclass(frozen=True)
class ArrayRef:
    """Stands for saved array ``index`` in a decoded state."""

    index: int


def decode_state(node: JsonNode) -> Any:
    """The saved state itself, with an :class:`ArrayRef` at each tensor leaf."""
    if "dict" in node:
        return {k: decode_state(v) for k, v in node["dict"]}
    if "list" in node:
        return [decode_state(v) for v in node["list"]]
    if "tuple" in node:
        return tuple(decode_state(v) for v in node["tuple"])
    if "array" in node:
        return ArrayRef(node["array"])
    if "float" in node:
        return float(node["float"])
    return node["v"]


def replace_values(state: Any, values: Mapping[KeyPath, Any]) -> Any:
    """Put ``values[path]`` at each path of ``state``, in place where the container allows.

    Dicts and lists are updated in place; a tuple on the way is rebuilt (with
    its type, so named tuples survive). Returns the (possibly new) root.
    """
    if not values:
        return state

    def rebuild(node: Any, path: KeyPath) -> Any:
        if path in values:
            return values[path]
        if isinstance(node, dict):
            for k, v in list(node.items()):
                new = rebuild(v, path + (k,))
                if new is not v:
                    node[k] = new
            return node
        if isinstance(node, list):
            for i, v in enumerate(node):
                new = rebuild(v, path + (i,))
                if new is not v:
                    node[i] = new
            return node
        if isinstance(node, tuple) and not isinstance(node, torch.Size):
            items = [rebuild(v, path + (i,)) for i, v in enumerate(node)]
            if all(a is b for a, b in zip(items, node)):
                return node
            return type(node)(*items) if hasattr(node, "_fields") else type(node)(items)
        return node

    return rebuild(state, ())


def orbax_name(path: KeyPath) -> str:
    """The parameter name Orbax stores an array under (its keys joined by ".")."""
    return ".".join(str(k) for k in path)


def orbax_tree(items: Mapping[KeyPath, Any]) -> dict[str, Any]:
    """Nested dicts with str keys (what Orbax saves) from ``{path: leaf}``.

    Raises:
        UnsupportedValueError: two paths that Orbax would store under one name
            (``{"a.b": x, "a": {"b": y}}``, or keys ``0`` and ``"0"`` side by side).
    """
    names: dict[str, KeyPath] = {}
    root: dict[str, Any] = {}
    for path, leaf in items.items():
        if not path:
            raise UnsupportedValueError("the state is a single tensor; wrap it in a dict, e.g. {'weight': t}")
        name = orbax_name(path)
        if name in names:
            raise UnsupportedValueError(
                f"state{keystr(path)} and state{keystr(names[name])} would both be stored as the Orbax "
                f"parameter {name!r}; rename one of the keys"
            )
        names[name] = path
        node = root
        for k in path[:-1]:
            node = node.setdefault(str(k), {})
            if not isinstance(node, dict):
                raise UnsupportedValueError(f"state{keystr(path)} collides with another entry of the Orbax tree")
        node[str(path[-1])] = leaf
    return root
