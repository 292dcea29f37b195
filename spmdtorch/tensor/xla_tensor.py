"""``XlaTensor``: the torch tensor subclass that lives on the "xla" device.

Storage model (why it looks like this): torch programs alias freely —
``x[0].add_(1)`` must change ``x``, ``p.data`` shares ``p``'s data — while JAX
arrays are immutable. Every ``XlaTensor`` therefore points at a ``Storage``
(one mutable cell holding the current value of a dense base array, concrete
``jax.Array`` or pending ``LazyRef``) plus a *view chain*: the view ops that
lead from the base to this tensor. Reading a view replays the chain lazily;
writing through a view records the inverse ops (``dynamic_update_slice`` and
friends) that produce the base's next value. This is functionalization done at
the storage level, so eager aliasing semantics hold for lazy graphs.

The wrapper's own torch storage is on ``meta`` (autograd needs a device guard,
which "xla" lacks without torch_xla); ``.device`` reports ``xla:0``.
"""

from __future__ import annotations

import itertools
import weakref

import jax
import torch

from spmdtorch import _dtypes
from spmdtorch.lazy._engine import ENGINE
from spmdtorch.lazy.graph import LazyRef

__all__ = ["XlaTensor", "Storage", "XLA_DEVICE", "is_xla_tensor"]

XLA_DEVICE = torch.device("xla", 0)
_META_DEVICE = torch.device("meta")


class _MetaFlag:
    """While torch's Python meta kernels run on our tensors they must see the
    real (meta) device, or they would allocate their outputs on "xla"."""

    active = False


_PYTHON_KEY = torch._C.DispatchKeySet(torch._C.DispatchKey.Python)

# id(jax.Array) -> a Storage currently holding it. Buffer donation rests on
# this: an array that no storage holds any more can be donated to the step
# that replaces it. Usually one storage holds an array; several do when one
# program output is the value of several tensors (the executor gives equal
# results one buffer, e.g. the step counters of AdamW's parameters). Those
# further holders are listed in _CO_HOLDERS, only then, so the common path
# stays one dict operation.
# A plain dict of weak references (not a WeakValueDictionary, whose Python-level
# get/set/delete cost ~1 us each, three per program output): entries of dead
# storages are swept when the dict has doubled since the last sweep.
_HOLDERS: dict = {}  # id(jax.Array) -> weakref.ref(Storage)
_HOLDERS_SWEEP_AT = [4096]
_CO_HOLDERS: dict = {}  # id(jax.Array) -> {id(Storage): weakref to it} beyond _HOLDERS'
_CO_HOLDERS_SWEEP = 1024  # entries kept before those of dead arrays are dropped


class _PendingSet:
    """The storages whose value is pending: a weak set, in insertion order.

    The recording path adds a storage on every write (hundreds per step).
    ``weakref.WeakSet.add`` is Python code and every dying member runs a
    Python callback; here an add is a flag test plus a plain weakref, and dead
    members are simply skipped. A storage's ``queued`` field holds the
    generation it was added in, so ``clear()`` is O(1) and an add is a no-op
    while the storage is already a member.
    """

    __slots__ = ("_compact_at", "_gen", "_refs")
    _COMPACT_MIN = 4096  # references kept before dead ones are dropped

    def __init__(self):
        self._refs: list = []
        self._gen = 1
        self._compact_at = self._COMPACT_MIN

    def add(self, st: Storage) -> None:
        if st.queued != self._gen:
            st.queued = self._gen
            self._refs.append(weakref.ref(st))
            if len(self._refs) >= self._compact_at:
                self._compact()

    def discard(self, st: Storage) -> None:
        if st.queued == self._gen:
            st.queued = 0

    def clear(self) -> None:
        self._refs = []
        self._gen += 1

    def _compact(self) -> None:
        # Storages recorded and dropped without a barrier (a long loop that
        # never syncs) leave dead references: drop them, keep the order.
        self._refs = [ref for ref in self._refs if (st := ref()) is not None and st.queued == self._gen]
        self._compact_at = max(self._COMPACT_MIN, 2 * len(self._refs))

    def __iter__(self):
        gen = self._gen
        seen = set()
        for ref in list(self._refs):
            st = ref()
            if st is not None and st.queued == gen and id(st) not in seen:
                seen.add(id(st))
                yield st

    def __len__(self) -> int:
        return sum(1 for _ in self)


# Storages whose value is pending; the next barrier computes all of them.
_PENDING = _PendingSet()
# spmdtorch.compile installs a callback here while it traces: it sees every
# storage created or overwritten, which is how it learns what a step mutates.
_TRACE_HOOK: list = [None]


def _import_dispatch(func, args, kwargs):
    from spmdtorch.tensor.dispatch import dispatch  # installs itself in _DISPATCH

    return dispatch(func, args, kwargs)


_DISPATCH: list = [_import_dispatch]


def _import_torch_function(func, args, kwargs):
    from spmdtorch.tensor.device_mode import torch_function

    _TORCH_FUNCTION[0] = torch_function
    return torch_function(func, args, kwargs)


_TORCH_FUNCTION: list = [_import_torch_function]
_NO_SUBCLASS_TORCH_FUNCTION = torch._C.DisableTorchFunctionSubclass
_SEQ = itertools.count()


class Storage:
    """A mutable cell holding the current value of one dense base array.

    Attributes:
        value: a concrete ``jax.Array`` or a pending ``LazyRef``.
        version: bumped on every write, so cached view values know they are stale.
        sharding: the ``jax.sharding.Sharding`` the next program must give this
            storage's value (None lets XLA choose). Either a user annotation
            or, after an in-place update, the placement the data already had.
        annotated: ``sharding`` comes from ``mark_sharding`` (so re-marking with
            another sharding is an error until ``clear_sharding``).
    """

    __slots__ = (
        "value",
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

    def __init__(self, value, sharding=None):
        self.value = None
        self.queued = 0  # the _PENDING generation this storage was added in (0: not a member)
        # {view chain: value} of the views read since the last write (dispatch.read_value).
        self.vcache = None
        self.version = 0
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
        self.set(value)

    def set(self, value) -> None:
        old = self.value
        if _TRACE_HOOK[0] is not None:
            _TRACE_HOOK[0](self, old)
        if old is not None and not isinstance(old, LazyRef):
            r = _HOLDERS.get(id(old))
            if r is not None and r() is self:
                del _HOLDERS[id(old)]
            if _CO_HOLDERS and id(old) in _CO_HOLDERS:
                _release_shared(self, old)
            # An in-place update keeps the placement the data had (parameters
            # keep their sharding across steps).
            if self.sharding is None and self.logical_shape is None and tuple(old.shape) == tuple(value.shape):
                self.sharding = old.sharding
        self.value = value
        self.version += 1
        # Cached reads of the old value (views, the unpadded slice) are stale:
        # drop them now rather than when next read, so they pin no old graph.
        self.vcache = None
        self.unpadded = None
        if isinstance(value, LazyRef):
            if old is not None and not isinstance(old, LazyRef):
                self.prev = id(old)
            # Program outputs are ordered by when their value was last set, so
            # the same step gives the same graph key every time.
            self.pseq = next(_SEQ)
            _PENDING.add(self)
        else:
            self.prev = None
            r = _HOLDERS.get(id(value))
            cur = None if r is None else r()
            if cur is None or cur is self or cur.value is not value:
                _HOLDERS[id(value)] = weakref.ref(self)
                if len(_HOLDERS) > _HOLDERS_SWEEP_AT[0]:
                    _sweep_holders()
            else:
                _hold_shared(self, value)

    @property
    def shape(self) -> tuple:
        return tuple(self.value.shape)


def _sweep_holders() -> None:
    """Drop the entries of storages that died or moved on (amortised: the bound doubles)."""
    stale = []
    for k, r in _HOLDERS.items():
        st = r()
        if st is None or isinstance(st.value, LazyRef) or id(st.value) != k:
            stale.append(k)
    for k in stale:
        del _HOLDERS[k]
    _HOLDERS_SWEEP_AT[0] = max(4096, 2 * len(_HOLDERS))


def _hold_shared(st: Storage, array) -> None:
    """Record ``st`` as a further holder of ``array`` (another storage holds it already)."""
    if len(_CO_HOLDERS) >= _CO_HOLDERS_SWEEP:
        for k in [k for k, refs in _CO_HOLDERS.items() if all(r() is None for r in refs.values())]:
            del _CO_HOLDERS[k]
    _CO_HOLDERS.setdefault(id(array), {})[id(st)] = weakref.ref(st)


def _release_shared(st: Storage, array) -> None:
    """``st`` no longer holds ``array``: forget it, and promote another holder if any."""
    refs = _CO_HOLDERS[id(array)]
    refs.pop(id(st), None)
    primary = _HOLDERS.get(id(array))
    if primary is None or primary() is None:
        while refs:
            r = refs.pop(next(iter(refs)))
            s = r()
            if s is not None and s.value is array:
                _HOLDERS[id(array)] = r
                break
    if not refs:
        del _CO_HOLDERS[id(array)]


def _live_holders(array):
    """The storages that currently hold ``array``: the primary first, then the co-holders."""
    r = _HOLDERS.get(id(array))
    st = None if r is None else r()
    if st is not None and st.value is array:
        yield st
    if _CO_HOLDERS:
        for r in _CO_HOLDERS.get(id(array), {}).values():
            s = r()
            if s is not None and s.value is array and s is not st:
                yield s


def holder_of(array) -> Storage | None:
    """A storage that currently holds ``array`` (None if nobody does)."""
    return next(_live_holders(array), None)


def holders_of(array) -> list:
    """Every storage that currently holds ``array`` (several when they share one program output)."""
    return list(_live_holders(array))


class ViewStep:
    """One view op in a chain: ``op(parent, *args)[out_index]``.

    ``template`` holds the op's arguments after ``self`` (all static);
    ``aval`` is the (shape, jax dtype) of the result.
    """

    __slots__ = ("op", "args", "kwargs", "out_index", "aval", "replay")

    def __init__(self, op, args, kwargs, out_index, aval):
        self.op = op
        self.args = args
        self.kwargs = kwargs
        self.out_index = out_index
        self.aval = aval
        # What recording its replay takes, built on the first replay (the
        # step is immutable): see dispatch._record_view_step.
        self.replay = None

    def __repr__(self):
        return f"ViewStep({self.op}, {self.args}, {self.kwargs}, {self.out_index})"


class _MetaKey:
    """``XlaTensor._mk`` for a tensor that has none stored: read from torch, then stored.

    A non-data descriptor, so a value in the instance's ``__dict__`` (set by
    ``XlaTensor.__new__``) wins and the common read is one dict hit.
    """

    def __get__(self, obj, objtype=None):
        if obj is None:
            return self
        mk = (tuple(obj.shape), obj.stride(), obj.storage_offset(), obj.dtype)
        obj.__dict__["_mk"] = mk
        return mk


def forget_meta_key(t: torch.Tensor) -> None:
    """Drop ``t``'s stored (shape, stride, offset, dtype) after its metadata changed in place."""
    t.__dict__.pop("_mk", None)


class XlaTensor(torch.Tensor):
    """A tensor on the ``xla`` device whose data lives in JAX.

    Users never construct it directly: create tensors with ``device="xla"``,
    ``t.to("xla")`` or ``module.to("xla")``.

    Example:
        >>> import spmdtorch, torch
        >>> x = torch.ones(2, 2, device="xla")
        >>> (x + 1).cpu()
        tensor([[2., 2.],
                [2., 2.]])
    """

    @classmethod
    def __torch_function__(cls, func, types, args=(), kwargs=None):
        # Only calls with an xla tensor argument come here (plain CPU torch
        # never does): autocast, index lists and meta-helper capture need the
        # torch-level function; nested calls go straight to __torch_dispatch__.
        with _NO_SUBCLASS_TORCH_FUNCTION():
            return _TORCH_FUNCTION[0](func, args, kwargs or {})

    _st: Storage
    _chain: tuple
    # (shape, stride, storage offset, dtype) as a tuple of tuples: the tensor's
    # part of the shape-cache key (spmdtorch.tensor.dispatch). Reading these
    # through torch is three or four C calls and fresh tuples per argument of
    # every recorded op; they are known when the tensor is made, so __new__
    # stores them. Code that changes a tensor's metadata in place must call
    # ``forget_meta_key``; a tensor without the field computes it here.
    _mk = _MetaKey()

    @staticmethod
    def __new__(cls, storage: Storage, chain: tuple, shape, stride, offset, dtype, requires_grad=False, mk=None):
        if mk is None:
            if stride is None:
                mk = (tuple(shape), _contiguous_strides(tuple(shape)), 0, dtype)
            else:
                mk = (tuple(shape), tuple(stride), offset, dtype)
        if stride is None:  # contiguous at offset 0: torch computes the strides (~0.3 us less per tensor)
            r = torch.Tensor._make_wrapper_subclass(
                cls, shape, dtype=dtype, device=_META_DEVICE, requires_grad=requires_grad
            )
        else:
            r = torch.Tensor._make_wrapper_subclass(
                cls,
                shape,
                strides=stride,
                storage_offset=offset,
                dtype=dtype,
                device=_META_DEVICE,  # a device object: no string parsing per tensor
                requires_grad=requires_grad,
            )
        r._st = storage
        r._chain = chain
        r._mk = mk
        return r

    # No __init__: object.__init__ accepts __new__'s arguments, and a Python
    # __init__ would be one more call per recorded op.

    # -- what users see ---------------------------------------------------
    @property
    def device(self) -> torch.device:  # type: ignore[override]
        return _META_DEVICE if _MetaFlag.active else XLA_DEVICE

    @property
    def is_cuda(self) -> bool:  # type: ignore[override]
        return False

    @property
    def is_meta(self) -> bool:  # type: ignore[override]
        return False

    @property
    def data(self):  # type: ignore[override]
        return torch.Tensor.data.__get__(self)

    @data.setter
    def data(self, new):
        if not isinstance(new, XlaTensor):
            raise RuntimeError(
                f"data set to a tensor that is on {new.device} while the tensor is on xla:0; "
                "move it first: t.data = new.to('xla')"
            )
        # The C++ setter copies sizes/strides/dtype; the Python state (which
        # storage and view chain the tensor reads) must follow it.
        torch.Tensor.data.__set__(self, new)
        self._st = new._st
        self._chain = new._chain
        self._mk = new._mk

    def numpy(self, *, force: bool = False):  # type: ignore[override]
        if not force:
            raise TypeError(
                "can't convert xla:0 device type tensor to numpy. Use Tensor.cpu() to copy "
                "the tensor to host memory first."
            )
        return self.cpu().numpy(force=True)

    def __array__(self, dtype=None):
        return self.numpy()

    def tolist(self):  # type: ignore[override]
        return self.cpu().tolist()

    def __repr__(self, *, tensor_contents=None):  # type: ignore[override]
        from spmdtorch.tensor import transfer

        if tensor_contents is None:
            cpu = transfer.to_cpu(self)
            # torch formats the values of the CPU copy; its own suffix logic
            # (device, dtype, grad_fn, in torch's order) then runs on self.
            tensor_contents = torch._tensor_str._tensor_str(cpu, len("tensor("))
        with torch._C.DisableTorchFunctionSubclass():
            text = torch._tensor_str._str_intern(self, tensor_contents=tensor_contents)
        # torch prefixes subclasses with their class name; users expect "tensor(".
        return "tensor(" + text[text.index("(") + 1 :]

    def __setitem__(self, index, value):
        # For a Python number torch builds the value tensor on the tensor's
        # storage device (meta here), where the number would be lost; a 0-dim
        # CPU tensor carries it into copy_/index_put_ instead.
        if isinstance(value, (int, float, bool, complex)):
            value = torch.tensor(value, dtype=self.dtype)
        return torch.Tensor.__setitem__(self, index, value)

    __str__ = __repr__

    def __format__(self, spec):
        if self.dim() == 0:
            return self.item().__format__(spec)
        return object.__format__(self, spec)

    def __reduce_ex__(self, proto):
        raise RuntimeError(
            "an xla tensor cannot be pickled or torch.save'd directly; save t.cpu() "
            "(or use spmdtorch.checkpoint for sharded state)"
        )

    def __deepcopy__(self, memo):
        if id(self) in memo:
            return memo[id(self)]
        out = self.detach().clone()
        if isinstance(self, torch.nn.Parameter) or getattr(self, "_is_param", False):
            out = torch.nn.Parameter(out, requires_grad=self.requires_grad)
        else:
            out.requires_grad_(self.requires_grad)
        memo[id(self)] = out
        return out

    # -- the wrapper-subclass protocol ---------------------------------------
    # XlaTensor has no inner torch tensors: its data is the Storage (a
    # jax.Array or a lazy node). Implementing the protocol matters for
    # ``Module.to("xla")``: for such subclasses ``nn.Module._apply`` swaps
    # each parameter in place (``torch.utils.swap_tensors``) instead of
    # creating a new Parameter per module, which would untie shared weights
    # (an embedding tied to the output head) and leave optimizers built
    # before the move holding the old CPU parameters.
    def __tensor_flatten__(self):
        return [], (self._st, self._chain, self.storage_offset())

    @staticmethod
    def __tensor_unflatten__(inner_tensors, ctx, outer_size, outer_stride):
        # Only tracing stacks (torch.compile, torch.export) rebuild subclasses
        # from parts; spmdtorch's own tracer is spmdtorch.compile.
        raise NotImplementedError("torch.compile/torch.export cannot trace xla tensors; use spmdtorch.compile")

    @classmethod
    def __torch_dispatch__(cls, func, types, args=(), kwargs=None):
        # dispatch.py installs itself here on import (an import statement per
        # ATen call cost about a microsecond).
        return _DISPATCH[0](func, args, kwargs or {})


def is_xla_tensor(t) -> bool:
    return isinstance(t, XlaTensor)


_MAKE_WRAPPER = torch.Tensor._make_wrapper_subclass


def dense_tensor(storage: Storage, mk: tuple) -> XlaTensor:
    """``XlaTensor(storage, (), shape, None, 0, dtype, False, mk)`` for ``mk = (shape, contiguous strides, 0, dtype)``.

    The recorder makes one per op: calling ``_make_wrapper_subclass`` here
    skips the class call and ``__new__``'s argument handling (~0.2 us).
    """
    r = _MAKE_WRAPPER(XlaTensor, mk[0], dtype=mk[3], device=_META_DEVICE)
    r._st = storage
    r._chain = ()
    r._mk = mk
    return r


def view_tensor(storage: Storage, chain: tuple, mk: tuple) -> XlaTensor:
    """``XlaTensor(storage, chain, *mk, False, mk)``: a view with ``mk = (shape, stride, offset, dtype)``."""
    r = _MAKE_WRAPPER(XlaTensor, mk[0], strides=mk[1], storage_offset=mk[2], dtype=mk[3], device=_META_DEVICE)
    r._st = storage
    r._chain = chain
    r._mk = mk
    return r


def new_base(value, dtype: torch.dtype, requires_grad: bool = False, sharding=None) -> XlaTensor:
    """A fresh contiguous XlaTensor owning a new storage that holds ``value``."""
    shape = tuple(value.shape)
    return XlaTensor(Storage(value, sharding), (), shape, None, 0, dtype, requires_grad)


_STRIDES: dict = {}
ENGINE.register_cache("tensor.xla_tensor.contiguous_strides", _STRIDES)


def _contiguous_strides(shape) -> tuple:
    hit = _STRIDES.get(shape)
    if hit is not None:
        return hit
    strides = []
    acc = 1
    for s in reversed(shape):
        strides.append(acc)
        acc *= max(s, 1)
    out = _STRIDES[shape] = tuple(reversed(strides))
    return out


def storage_aval(t: torch.Tensor) -> tuple:
    return (tuple(t.shape), _dtypes.to_jax_dtype(t.dtype))


def is_concrete(value) -> bool:
    return isinstance(value, jax.Array)
