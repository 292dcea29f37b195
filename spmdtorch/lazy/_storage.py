"""Storages, view chains, the pending set and the holder registry: the lazy engine's data model.

Storage model (why it looks like this): torch programs alias freely --
``x[0].add_(1)`` must change ``x``, ``p.data`` shares ``p``'s data -- while JAX
arrays are immutable. Every xla tensor therefore points at a ``Storage`` (one
mutable cell holding the current value of a dense base array, concrete
``jax.Array`` or pending ``LazyRef``) plus a *view chain*: a tuple of
``ViewStep`` objects leading from the base to the tensor. Reading a view replays the
chain lazily; writing through a view records the inverse ops that produce the
base's next value (``spmdtorch.tensor._values``). This is functionalization done
at the storage level, so eager aliasing semantics hold for lazy graphs.

The engine's data-model state is owned by ``spmdtorch.lazy._engine.ENGINE``;
this module names it for its hot paths:

* ``PENDING``: the storages whose value is pending (the next barrier computes them).
* ``HOLDERS`` / ``CO_HOLDERS``: which storage holds which concrete array
  (buffer donation rests on it: ``holder_of``/``holders_of``).
* ``TRACE_HOOK``: ``spmdtorch.compile``'s callback while it traces.
* ``SEQ``: the order in which pending values were set (program output order).
* ``ON_HOST``: the storages whose value is still on the host (deferred upload).

Deferred upload (PyTorch/XLA's "virtual device"): a storage made with
:meth:`Storage.on_host` holds a private host copy (``host``) instead of a
device array until its value is first needed. The ``value`` property is the
one way to read a storage's value, so every reader (an op recording its input,
a view's replay, ``.cpu()``, a checkpoint, ``spmdtorch.compile``) uploads it
first, replicated or with the storage's sharding; ``mark_sharding`` uploads it
straight to its sharded layout (:meth:`Storage.upload`); a barrier uploads every
one left (:func:`upload_on_host`). Only the readers that must not upload (the
sharding and debug inspections) look at ``host`` first. A write that replaces
the whole value drops the host copy without uploading it.

Nothing here knows about torch tensors: ``spmdtorch.tensor`` wraps storages.
"""

from __future__ import annotations

import weakref
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any, Protocol

from spmdtorch.lazy import metrics, padding
from spmdtorch.lazy._engine import ENGINE
from spmdtorch.lazy._placement import replicated_sharding
from spmdtorch.lazy.graph import Aval, LazyRef

if TYPE_CHECKING:
    import jax
    import numpy as np

__all__ = [
    "CO_HOLDERS",
    "HOLDERS",
    "ON_HOST",
    "PENDING",
    "SEQ",
    "TRACE_HOOK",
    "HostValue",
    "Storage",
    "ViewStep",
    "holder_of",
    "holders_of",
    "sole_holder",
    "upload_on_host",
]

# id(jax.Array) -> a Storage currently holding it. Buffer donation rests on
# this: an array that no storage holds any more can be donated to the step
# that replaces it. Usually one storage holds an array; several do when one
# program output is the value of several tensors (the executor gives equal
# results one buffer, e.g. the step counters of AdamW's parameters). Those
# further holders are listed in CO_HOLDERS, only then, so the common path
# stays one dict operation.
# A plain dict of weak references (not a WeakValueDictionary, whose get, set
# and delete run Python code, three per program output): entries of dead
# storages are swept when the dict has doubled since the last sweep.
HOLDERS = ENGINE.holders  # id(jax.Array) -> weakref.ref(Storage)
_HOLDERS_SWEEP_AT = [4096]
CO_HOLDERS = ENGINE.co_holders  # id(jax.Array) -> {id(Storage): weakref to it} beyond HOLDERS'
_CO_HOLDERS_SWEEP = 1024  # entries kept before those of dead arrays are dropped


# Module-level names for the engine's own objects (spmdtorch.lazy._engine owns
# them; each is mutated in place, never rebound, so these stay the engine's):
# the hot paths read a module global instead of an attribute chain.
PENDING = ENGINE.pending  # the storages whose value is pending; the next barrier computes them
TRACE_HOOK = ENGINE.trace_hook  # spmdtorch.compile's callback while it traces (one slot)
SEQ = ENGINE.seq  # the order in which pending values were set
ON_HOST = ENGINE.on_host  # the storages whose value is still on the host (deferred upload)


class HostValue(Protocol):
    """What a storage needs of a value kept on the host until first use.

    ``spmdtorch.tensor`` provides it (a private copy of a CPU tensor's data);
    this layer only decides *when* and *where* it is placed.

    Attributes:
        shape: the value's shape.
        dtype: the numpy/JAX dtype of its device storage.
    """

    @property
    def shape(self) -> tuple[int, ...]: ...

    @property
    def dtype(self) -> np.dtype: ...

    def place(self, sharding: jax.sharding.Sharding, padded_shape: tuple[int, ...] | None) -> jax.Array:
        """The value on the devices with ``sharding``, zero-padded to ``padded_shape`` when given."""
        ...


class Storage:
    """A mutable cell holding the current value of one dense base array.

    Attributes:
        value: a concrete ``jax.Array`` or a pending ``LazyRef`` (read-only;
            :meth:`set` writes it). Reading it uploads a value still on the host.
        host: the value while it is still on the host (deferred upload), else None.
        version: bumped on every write, so cached view values know they are stale.
        sharding: the ``jax.sharding.Sharding`` the next program must give this
            storage's value (None lets XLA choose). Either a user annotation
            or, after an in-place update, the placement the data already had.
        annotated: ``sharding`` comes from ``mark_sharding`` (so re-marking with
            another sharding is an error until ``clear_sharding``).
    """

    __slots__ = (
        "_value",
        "host",
        "version",
        "sharding",
        "annotated",
        "pseq",
        "logical_shape",
        "unpadded",
        "prev",
        "queued",
        "vcache",
        "__weakref__",
    )

    _value: jax.Array | LazyRef
    host: HostValue | None
    version: int
    sharding: jax.sharding.Sharding | None
    annotated: bool
    pseq: int
    logical_shape: tuple[int, ...] | None
    unpadded: tuple[int, LazyRef] | None
    prev: int | None
    queued: int
    vcache: dict[tuple[ViewStep, ...], Any] | None

    def __init__(self, value: jax.Array | LazyRef, sharding: jax.sharding.Sharding | None = None) -> None:
        self._fields(None, sharding, version=0)
        self.set(value)

    def _fields(self, host: HostValue | None, sharding: jax.sharding.Sharding | None, version: int) -> None:
        """Every field but the value (``__init__`` then sets it; ``on_host`` keeps it on the host)."""
        # None only until set() (or the upload) writes it; typing it Optional
        # would make every reader narrow a value that is never None.
        self._value = None  # type: ignore[assignment]
        self.host = host
        self.queued = 0  # the PENDING generation this storage was added in (0: not a member)
        # {view chain: value} of the views read since the last write (spmdtorch.tensor._values.read_value).
        self.vcache = None
        self.version = version
        self.pseq = 0
        self.sharding = sharding
        self.annotated = False
        # Uneven shardings (spmdtorch.lazy.padding): when set, a concrete
        # ``value`` is padded and this is the shape the tensor really has;
        # ``unpadded`` caches (version, LazyRef) of the slice that reads it.
        self.logical_shape = None
        self.unpadded = None
        # id() of the concrete array a pending value replaced: the executor
        # pairs that (donated) input with this storage's output buffer.
        self.prev = None

    def set(self, value: jax.Array | LazyRef) -> None:
        # Runs once per program output on every step (a replayed decoder step
        # sets ~100): one id() per array, the trace hook read once.
        old = self._value
        hook = TRACE_HOOK[0]
        if old is None and self.host is not None:
            # The whole value is replaced: its host copy need not reach the
            # devices, except while spmdtorch.compile traces, whose hook must
            # see the input array this write replaces.
            if hook is not None:
                old = self.upload()
            else:
                self.host = None
                ON_HOST.discard(self)
        if hook is not None:
            hook(self, old)
        if old is not None and not isinstance(old, LazyRef):
            old_id = id(old)
            r = HOLDERS.get(old_id)
            if r is not None and r() is self:
                del HOLDERS[old_id]
            if CO_HOLDERS and old_id in CO_HOLDERS:
                _release_shared(self, old)
            # An in-place update keeps the placement the data had (parameters
            # keep their sharding across steps).
            if self.sharding is None and self.logical_shape is None and tuple(old.shape) == tuple(value.shape):
                self.sharding = old.sharding
        self._value = value
        self.version += 1
        # Cached reads of the old value (views, the unpadded slice) are stale:
        # drop them now rather than when next read, so they pin no old graph.
        self.vcache = None
        self.unpadded = None
        if type(value) is LazyRef:
            if old is not None and type(old) is not LazyRef:
                self.prev = id(old)
            # Program outputs are ordered by when their value was last set, so
            # the same step gives the same graph key every time.
            self.pseq = next(SEQ)
            PENDING.add(self)
        else:
            self.prev = None
            self._hold(value)

    def _hold(self, value: jax.Array) -> None:
        """Registers this storage as a holder of the concrete ``value`` (buffer donation rests on it)."""
        value_id = id(value)
        r = HOLDERS.get(value_id)
        cur = None if r is None else r()
        if cur is None or cur is self or cur._value is not value:
            HOLDERS[value_id] = weakref.ref(self)
            if len(HOLDERS) > _HOLDERS_SWEEP_AT[0]:
                _sweep_holders()
        else:
            _hold_shared(self, value)

    @property
    def value(self) -> jax.Array | LazyRef:
        """The current value; one still on the host is uploaded first (see the module docstring)."""
        v = self._value
        if v is None:  # only while the value is on the host
            return self.upload()
        return v

    @classmethod
    def on_host(cls, host: HostValue, sharding: jax.sharding.Sharding | None = None) -> Storage:
        """A storage whose value stays on the host until first needed (deferred upload)."""
        st = cls.__new__(cls)
        st._fields(host, sharding, version=1)  # version 1: as if set() had written it once, like every other storage
        ON_HOST.add(st)
        metrics.inc("DeferredTransferToDevice")
        return st

    def upload(self, sharding: jax.sharding.Sharding | None = None) -> jax.Array | LazyRef:
        """Places a value still on the host on the devices and drops the host copy; returns the value.

        Args:
            sharding: where to place it (``mark_sharding``'s target: one transfer
                per shard, straight to its layout). None: the storage's own
                sharding, else replicated, the default placement.

        A storage already on the devices is left as it is.
        """
        host = self.host
        if host is None:
            return self._value
        if sharding is None:
            sharding = self.sharding if self.sharding is not None else replicated_sharding()
        padded = padding.padded_shape(tuple(host.shape), sharding)
        arr = host.place(sharding, padded)
        # The host copy goes now: after the upload the devices hold the only copy.
        self.host = None
        ON_HOST.discard(self)
        if padded is not None:
            self.logical_shape = tuple(host.shape)
        self._value = arr
        self._hold(arr)
        return arr

    @property
    def shape(self) -> tuple[int, ...]:
        host = self.host
        return tuple(host.shape if host is not None else self.value.shape)

    @property
    def dtype(self) -> Any:
        """The dtype of the device storage (a value on the host is not uploaded to tell)."""
        host = self.host
        return host.dtype if host is not None else self.value.dtype


def upload_on_host() -> None:
    """Uploads every live storage whose value is still on the host (a barrier does, as PyTorch/XLA's sync)."""
    for st in list(ON_HOST):
        st.upload()


def _sweep_holders() -> None:
    """Drop the entries of storages that died or moved on (amortised: the bound doubles)."""
    stale = []
    for k, r in HOLDERS.items():
        st = r()
        if st is None or isinstance(st._value, LazyRef) or id(st._value) != k:
            stale.append(k)
    for k in stale:
        del HOLDERS[k]
    _HOLDERS_SWEEP_AT[0] = max(4096, 2 * len(HOLDERS))


def _hold_shared(st: Storage, array: jax.Array) -> None:
    """Record ``st`` as a further holder of ``array`` (another storage holds it already)."""
    if len(CO_HOLDERS) >= _CO_HOLDERS_SWEEP:
        for k in [k for k, refs in CO_HOLDERS.items() if all(r() is None for r in refs.values())]:
            del CO_HOLDERS[k]
    CO_HOLDERS.setdefault(id(array), {})[id(st)] = weakref.ref(st)


def _release_shared(st: Storage, array: jax.Array) -> None:
    """``st`` no longer holds ``array``: forget it, and promote another holder if any."""
    refs = CO_HOLDERS[id(array)]
    refs.pop(id(st), None)
    primary = HOLDERS.get(id(array))
    if primary is None or primary() is None:
        while refs:
            r = refs.pop(next(iter(refs)))
            s = r()
            if s is not None and s._value is array:
                HOLDERS[id(array)] = r
                break
    if not refs:
        del CO_HOLDERS[id(array)]


def _live_holders(array: jax.Array) -> Iterator[Storage]:
    """The storages that currently hold ``array``: the primary first, then the co-holders."""
    r = HOLDERS.get(id(array))
    st = None if r is None else r()
    if st is not None and st._value is array:
        yield st
    if CO_HOLDERS:
        for r in CO_HOLDERS.get(id(array), {}).values():
            s = r()
            if s is not None and s._value is array and s is not st:
                yield s


def holder_of(array: jax.Array) -> Storage | None:
    """A storage that currently holds ``array`` (None if nobody does)."""
    return next(_live_holders(array), None)


def holders_of(array: jax.Array) -> list[Storage]:
    """Every storage that currently holds ``array`` (several when they share one program output)."""
    return list(_live_holders(array))


def sole_holder(array: jax.Array, st: Storage) -> bool:
    """Whether ``st`` is the only storage holding ``array`` (``holders_of(array) == [st]``, without the list)."""
    live = _live_holders(array)
    return next(live, None) is st and next(live, None) is None


class ViewStep:
    """One view op in a chain: ``op(parent, *args)[out_index]``.

    ``template`` holds the op's arguments after ``self`` (all static);
    ``aval`` is the (shape, jax dtype) of the result.
    """

    __slots__ = ("op", "args", "kwargs", "out_index", "aval", "replay")

    # What recording its replay takes: a ``spmdtorch.tensor._values`` object
    # (the layer above), so typed Any here.
    replay: Any

    def __init__(
        self,
        op: Any,
        args: tuple[Any, ...],
        kwargs: tuple[tuple[str, Any], ...],
        out_index: int | None,
        aval: Aval,
    ) -> None:
        self.op = op
        self.args = args
        self.kwargs = kwargs
        self.out_index = out_index
        self.aval = aval
        # What recording its replay takes, built on the first replay (the
        # step is immutable): see spmdtorch.tensor._values.
        self.replay = None

    def __repr__(self) -> str:
        return f"ViewStep({self.op}, {self.args}, {self.kwargs}, {self.out_index})"
