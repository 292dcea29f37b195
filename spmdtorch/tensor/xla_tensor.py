"""``XlaTensor``: the torch tensor subclass that lives on the "xla" device.

An ``XlaTensor`` is a ``Storage`` (one mutable cell holding the current value
of a dense base array) plus a *view chain* of ``ViewStep``\\ s: see
``spmdtorch.lazy._storage`` for why, and ``spmdtorch.tensor._values`` for how
values are read and written through the chain. Every ATen call on it goes to
``spmdtorch.tensor._router.dispatch``; the op handlers that build new tensors
(``spmdtorch.tensor.dispatch``) sit above this module.

The wrapper's own torch storage is on ``meta`` (autograd needs a device guard,
which "xla" lacks without torch_xla); ``.device`` reports ``xla:0``.
"""

from __future__ import annotations

import threading
import weakref
from collections import OrderedDict
from collections.abc import Callable, Sequence
from types import MethodWrapperType
from typing import TYPE_CHECKING, Any, NamedTuple, NoReturn, Self, SupportsIndex, cast, overload

import jax
import torch

from spmdtorch import _dtypes, config
from spmdtorch.lazy import Storage, caches
from spmdtorch.tensor._host import HostCopy, to_device_array
from spmdtorch.tensor._router import dispatch, torch_function
from spmdtorch.tensor._values import to_cpu

if TYPE_CHECKING:
    import numpy as np
    from torch._subclasses.fake_tensor import FakeTensorMode

    from spmdtorch.lazy import ViewStep
    from spmdtorch.lazy.graph import LazyRef
    from spmdtorch.tensor._facts import Op

__all__ = [
    "PYTHON_KEY",
    "XLA_DEVICE",
    "XLA_FAKE_MODES",
    "MetaFlag",
    "MetaKey",
    "XlaTensor",
    "contiguous_strides",
    "dense_tensor",
    "forget_meta_key",
    "from_host",
    "is_xla_tensor",
    "set_view_chain",
    "storage_of",
    "view_chain",
    "new_base",
    "storage_stand_in",
    "view_tensor",
    "wrap_jax_array",
]

XLA_DEVICE = torch.device("xla", 0)
_META_DEVICE = torch.device("meta")


class _MetaFlag(threading.local):
    """While torch's Python meta kernels run on our tensors they must see the
    real (meta) device, or they would allocate their outputs on "xla".

    Per thread: another thread's tensors keep reporting ``xla`` meanwhile.
    """

    active = False


MetaFlag = _MetaFlag()


PYTHON_KEY = torch._C.DispatchKeySet(torch._C.DispatchKey.Python)
_NO_SUBCLASS_TORCH_FUNCTION = torch._C.DisableTorchFunctionSubclass

# Calls that ``XlaTensor.__torch_function__`` runs at once, without the handler
# (``spmdtorch.tensor.device_mode.torch_function``): none builds a tensor, so
# neither autocast, index lists nor meta-helper capture applies to them, and
# the handler would only run them as they are. A training step makes hundreds
# (``opt.zero_grad()`` and AdamW read and write ``p.grad`` and test
# ``torch.is_complex(p)`` per parameter), each paying the handler's checks.
# Attribute reads and writes (``t.grad``, ``t.shape``, ``p.grad = None``)
# arrive as the C property's bound ``__get__`` / ``__set__`` (a method-wrapper);
# only properties that compute nothing are listed (``.real``, ``.mT`` run ops).
_METHOD_WRAPPER = MethodWrapperType
_ATTRIBUTE_ACCESS = frozenset({"__get__", "__set__", "__delete__"})
_PLAIN_ATTRIBUTES = frozenset(
    {
        "grad",
        "_grad",
        "data",
        "shape",
        "dtype",
        "device",
        "layout",
        "ndim",
        "is_sparse",
        "requires_grad",
        "retains_grad",
        "is_leaf",
        "grad_fn",
        "_grad_fn",
        "_base",
        "_version",
        "_backward_hooks",
        "_post_accumulate_grad_hooks",
        "itemsize",
        "nbytes",
    }
)
_QUERIES: frozenset[Callable[..., Any]] = frozenset(
    {
        torch.is_complex,
        torch.is_floating_point,
        torch.Tensor.is_complex,
        torch.Tensor.is_floating_point,
        torch.Tensor.dim,
        torch.Tensor.size,
        torch.Tensor.numel,
    }
)


class MetaKey(NamedTuple):
    """A tensor's metadata as the shape-cache key sees it (``XlaTensor._mk``)."""

    shape: tuple[int, ...]
    stride: tuple[int, ...]
    offset: int
    dtype: torch.dtype


# MetaKey(...) without the NamedTuple's Python-level __new__ (tensors are made per op).
_mk = tuple.__new__


class _MetaKeyField:
    """``XlaTensor._mk`` for a tensor that has none stored: read from torch, then stored.

    A non-data descriptor, so a value in the instance's ``__dict__`` (set by
    ``XlaTensor.__new__``) wins and the common read is one dict hit.
    """

    @overload
    def __get__(self, obj: None, objtype: type | None = None) -> _MetaKeyField: ...
    @overload
    def __get__(self, obj: torch.Tensor, objtype: type | None = None) -> MetaKey: ...
    def __get__(self, obj: torch.Tensor | None, objtype: type | None = None) -> MetaKey | _MetaKeyField:
        if obj is None:
            return self
        mk = _mk(MetaKey, (tuple(obj.shape), obj.stride(), obj.storage_offset(), obj.dtype))
        obj.__dict__["_mk"] = mk
        return mk


def forget_meta_key(t: torch.Tensor) -> None:
    """Drop ``t``'s stored (shape, stride, offset, dtype) after its metadata changed in place."""
    t.__dict__.pop("_mk", None)


# The FakeTensorModes (TorchDynamo's, AOTAutograd's) that have fakified an xla
# tensor. Their ``meta`` fakes stand for xla tensors: spmdtorch.dynamo reports
# such a fake's device as ``xla:0`` to the traced Python. Weak: a mode lives
# as long as its trace.
XLA_FAKE_MODES: weakref.WeakSet[FakeTensorMode] = weakref.WeakSet()


class _FlattenContext(NamedTuple):
    """``XlaTensor.__tensor_flatten__``'s context: what ``__tensor_unflatten__`` needs besides the shape."""

    dtype: torch.dtype


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
    def __torch_function__(
        cls,
        func: Callable[..., Any],
        types: Sequence[type],
        args: tuple[Any, ...] = (),
        kwargs: dict[str, Any] | None = None,
    ) -> Any:
        # Only calls with an xla tensor argument come here (plain CPU torch
        # never does): autocast, index lists and meta-helper capture need the
        # torch-level function; nested calls go straight to __torch_dispatch__.
        if func in _QUERIES or (
            type(func) is _METHOD_WRAPPER
            and func.__name__ in _ATTRIBUTE_ACCESS
            and func.__self__.__name__ in _PLAIN_ATTRIBUTES  # type: ignore[attr-defined]  # the getset descriptor
        ):
            with _NO_SUBCLASS_TORCH_FUNCTION():
                return func(*args, **kwargs) if kwargs else func(*args)
        with _NO_SUBCLASS_TORCH_FUNCTION():
            return torch_function(func, args, kwargs or {})

    _st: Storage
    _chain: tuple[ViewStep, ...]
    # (shape, stride, storage offset, dtype) as a MetaKey: the tensor's
    # part of the shape-cache key (spmdtorch.tensor.dispatch._meta). Reading these
    # through torch is three or four C calls and fresh tuples per argument of
    # every recorded op; they are known when the tensor is made, so __new__
    # stores them. Code that changes a tensor's metadata in place must call
    # ``forget_meta_key``; a tensor without the field computes it here.
    _mk = _MetaKeyField()

    @staticmethod
    def __new__(
        cls,
        storage: Storage,
        chain: tuple[ViewStep, ...],
        shape: Sequence[int],
        stride: Sequence[int] | None,
        offset: int | torch.SymInt,
        dtype: torch.dtype,
        requires_grad: bool = False,
        mk: MetaKey | None = None,
    ) -> Self:
        if mk is None:
            if stride is None:
                mk = _mk(MetaKey, (tuple(shape), contiguous_strides(tuple(shape)), 0, dtype))
            else:
                mk = _mk(MetaKey, (tuple(shape), tuple(stride), offset, dtype))
        if stride is None:  # contiguous at offset 0: torch computes the strides (cheaper than passing them)
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
    # torch's stub declares device/is_cuda/is_meta as writable attributes (they
    # are read-only C properties): mypy calls a read-only property over one an override error.
    @property
    def device(self) -> torch.device:  # type: ignore[override]
        return _META_DEVICE if MetaFlag.active else XLA_DEVICE

    @property
    def is_cuda(self) -> bool:  # type: ignore[override]
        return False

    @property
    def is_meta(self) -> bool:  # type: ignore[override]
        return False

    @property
    def data(self) -> torch.Tensor:
        # Tensor.data is a C getset descriptor; torch's stub declares a plain Tensor attribute
        # (so it has no typed __get__; the annotation restores the type the descriptor returns).
        value: torch.Tensor = torch.Tensor.data.__get__(self)  # type: ignore[attr-defined]
        return value

    @data.setter
    def data(self, new: torch.Tensor) -> None:
        if not isinstance(new, XlaTensor):
            raise RuntimeError(
                f"data set to a tensor that is on {new.device} while the tensor is on xla:0; "
                "move it first: t.data = new.to('xla')"
            )
        # The C++ setter copies sizes/strides/dtype; the Python state (which
        # storage and view chain the tensor reads) must follow it.
        torch.Tensor.data.__set__(self, new)  # type: ignore[attr-defined]  # a C descriptor (see the getter)
        self._st = new._st
        self._chain = new._chain
        self._mk = new._mk

    def untyped_storage(self) -> torch.UntypedStorage:
        """A host-side stand-in for this tensor's storage that identifies it.

        Libraries find aliases by ``untyped_storage().data_ptr()`` (torch's
        own helpers, safetensors' ``_find_shared_tensors``, accelerate's
        ``save_model``, Hugging Face's shard splitter). The wrapper's own
        storage is on ``meta``, whose address is 0 for every tensor, so every
        pair of equal-size xla tensors looked like one tensor saved twice.
        This answers a ``meta`` storage at a fake address owned by the
        tensor's ``Storage`` cell: views of one base and tied weights share
        it, distinct storages never do, and nothing can read through it.
        """
        return storage_stand_in(self._st)

    def data_ptr(self) -> int:
        """The storage's fake address plus the view's byte offset (see ``untyped_storage``)."""
        return storage_stand_in(self._st).data_ptr() + int(self.storage_offset()) * self.element_size()

    def numpy(self, *, force: bool = False) -> np.ndarray:
        if not force:
            raise TypeError(
                "can't convert xla:0 device type tensor to numpy. Use Tensor.cpu() to copy "
                "the tensor to host memory first."
            )
        return self.cpu().numpy(force=True)

    def __array__(self, dtype: np.dtype[Any] | None = None) -> np.ndarray:
        return self.numpy()

    def tolist(self) -> list[Any]:
        return self.cpu().tolist()

    # mypy finds torch's unannotated keyword-only __repr__ incompatible with any annotation of it.
    def __repr__(self, *, tensor_contents: Any = None) -> str:  # type: ignore[override]
        if tensor_contents is None:
            cpu = to_cpu(self)
            # torch formats the values of the CPU copy; its own suffix logic
            # (device, dtype, grad_fn, in torch's order) then runs on self.
            tensor_contents = torch._tensor_str._tensor_str(cpu, len("tensor("))
        with torch._C.DisableTorchFunctionSubclass():
            text: str = torch._tensor_str._str_intern(self, tensor_contents=tensor_contents)
        # torch prefixes subclasses with their class name; users expect "tensor(".
        return "tensor(" + text[text.index("(") + 1 :]

    def __setitem__(self, index: Any, value: Any) -> None:
        # For a Python number torch builds the value tensor on the tensor's
        # storage device (meta here), where the number would be lost; a 0-dim
        # CPU tensor carries it into copy_/index_put_ instead.
        if isinstance(value, (int, float, bool, complex)):
            value = torch.tensor(value, dtype=self.dtype)
        return torch.Tensor.__setitem__(self, index, value)

    __str__ = __repr__

    def __format__(self, spec: str) -> str:
        if self.dim() == 0:
            return self.item().__format__(spec)
        return object.__format__(self, spec)

    def __reduce_ex__(self, proto: SupportsIndex) -> tuple[Any, ...]:
        # What stock torch does for devices without host storage (the "xla"
        # branch of Tensor._reduce_ex_internal), minus the subclass wrapper
        # torch adds around subclasses (it would pickle the Storage and the
        # view chain): the values as a CPU tensor, rebuilt on load by
        # ``_rebuild_device_tensor_from_cpu_tensor``, which honours
        # ``map_location`` and is on ``torch.load``'s weights_only allowlist.
        # The CPU copy is detached, so the rebuilt tensor is a leaf that can
        # take ``requires_grad``. Shardings and storage sharing between views
        # are not saved (as torch_xla).
        if getattr(self, "_is_param", False):
            return (torch._utils._rebuild_parameter, (self.detach(), self.requires_grad, OrderedDict()))
        return (
            torch._utils._rebuild_device_tensor_from_cpu_tensor,
            (to_cpu(self), self.dtype, str(XLA_DEVICE), self.requires_grad),
        )

    def __deepcopy__(self, memo: dict[int, Any]) -> torch.Tensor:
        if id(self) in memo:
            copied: torch.Tensor = memo[id(self)]  # this method's own entry
            return copied
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
    def __tensor_flatten__(self) -> tuple[list[str], _FlattenContext]:
        # One inner tensor, a plain meta stand-in (``_meta``): tracing stacks
        # fakify a subclass through its inner tensors, and AOTAutograd takes a
        # subclass with none for an already-fake input. The context is the same
        # for every tensor of a dtype: TorchDynamo guards on it, and neither the
        # storage nor the sharding changes the captured graph (the engine
        # compiles one XLA program per input sharding by itself). Its guards
        # call this per xla input on every call of a compiled function: the
        # stored MetaKey's dtype, not ``self.dtype`` (a torch-function round trip).
        return ["_meta"], _mk(_FlattenContext, (self._mk.dtype,))

    @property
    def _meta(self) -> torch.Tensor:
        """A plain ``meta`` tensor with this tensor's shape, strides and dtype (see ``__tensor_flatten__``)."""
        # TorchDynamo's guards read it on every call of a compiled function:
        # kept per tensor while its metadata (``_mk``) is the same object.
        mk = self._mk
        cached: tuple[MetaKey, torch.Tensor] | None = self.__dict__.get("_meta_stand_in")
        if cached is not None and cached[0] is mk:
            return cached[1]
        if torch._C._len_torch_dispatch_stack():
            # A real meta tensor whatever dispatch modes are active: inside a
            # fake mode (AOTAutograd asks there) a fake one would make the xla
            # tensor look fake already; spmdtorch's backward mode would make
            # it an xla one.
            with torch.utils._python_dispatch._disable_current_modes():
                stand_in = torch.empty_strided(mk.shape, mk.stride, dtype=mk.dtype, device=_META_DEVICE)
        else:
            stand_in = torch.empty_strided(mk.shape, mk.stride, dtype=mk.dtype, device=_META_DEVICE)
        self.__dict__["_meta_stand_in"] = (mk, stand_in)
        return stand_in

    def __coerce_same_metadata_as_tangent__(
        self, expected_metadata: Any, expected_type: type | None = None
    ) -> XlaTensor:
        """An xla gradient fed to an AOTAutograd backward traced with plain fakes.

        AOTAutograd traced the graph with ``meta`` stand-ins (plain tensors)
        and refuses a gradient that is a traceable subclass there. The backward
        graph runs on xla tensors all the same: this answers the same data as
        an ``XlaTensor`` that does not present the subclass protocol.
        """
        # Contiguous too: AOTAutograd restrides any other layout through a
        # fresh tensor, which would be an ordinary (traceable) XlaTensor again.
        src = self if self.is_contiguous() else cast(XlaTensor, self.contiguous())
        return _UnflattenableXlaTensor(
            src._st, src._chain, src.shape, src.stride(), src.storage_offset(), src.dtype, False, src._mk
        )

    @staticmethod
    def __tensor_unflatten__(
        inner_tensors: dict[str, torch.Tensor], ctx: _FlattenContext, outer_size: Any, outer_stride: Any
    ) -> torch.Tensor:
        """The fake stand-in TorchDynamo / AOTAutograd trace with: the fakified ``meta`` inner tensor.

        Only tracing stacks rebuild subclasses from parts, and only from fake
        inner tensors. The stand-in stays on ``meta``, not "xla": torch has no
        device guard for "xla" without torch_xla, and autograd needs one for
        every tensor that requires grad (the reason the wrapper's storage is on
        meta too). ``spmdtorch.dynamo`` maps the ``meta`` device that a
        captured graph records back to xla.
        """
        from torch._subclasses.fake_tensor import FakeTensor  # loaded with torch._dynamo, the only caller

        stand_in = inner_tensors.get("_meta")
        if not isinstance(stand_in, FakeTensor):
            raise NotImplementedError(
                "an xla tensor can be rebuilt from parts only as a fake tensor inside torch.compile / "
                "AOTAutograd tracing; to run a function as one program use torch.compile(fn, backend='spmdtorch') "
                "or spmdtorch.compile(fn)"
            )
        # The fake mode now traces xla tensors: its meta fakes stand for xla (spmdtorch.dynamo reads this).
        XLA_FAKE_MODES.add(stand_in.fake_mode)
        return stand_in

    # A classmethod, as torch documents __torch_dispatch__; torch's stub types the
    # base attribute as the (instance-level) disabled implementation.
    @classmethod
    def __torch_dispatch__(  # type: ignore[override]
        cls, func: Op, types: Sequence[type], args: tuple[Any, ...] = (), kwargs: dict[str, Any] | None = None
    ) -> Any:
        # The router resolves the op once (spmdtorch.tensor._router); a global
        # lookup here, so tests can wrap it (monkeypatch this module's ``dispatch``).
        return dispatch(func, args, kwargs or {})


class _Absent:
    """A class attribute that reads as missing: ``hasattr`` answers False."""

    def __get__(self, obj: object, objtype: type | None = None) -> NoReturn:
        raise AttributeError("__tensor_flatten__")


class _UnflattenableXlaTensor(XlaTensor):
    """An xla tensor that tracing stacks take for a plain tensor (see ``__coerce_same_metadata_as_tangent__``).

    Ops on it give ordinary ``XlaTensor`` results.
    """

    __tensor_flatten__ = _Absent()


def _restore_xla_location(storage: torch.serialization.STORAGE, location: str) -> torch.serialization.STORAGE | None:
    """``torch.load``'s deserializer for the "xla" location (``map_location="xla"``).

    Storages stay on the host: an xla tensor is saved as a CPU copy that
    ``_rebuild_device_tensor_from_cpu_tensor`` then moves to the location
    ``map_location`` names. A tensor saved from CPU therefore loads as a CPU
    tensor even under ``map_location="xla"`` (the deserializer never learns
    where it was saved from); ``load_state_dict`` copies it into xla params.
    """
    if location.startswith("xla"):
        return storage
    return None


# The tagger never claims a storage (xla tensors have none on the host), so
# saving plain tensors is unchanged; priority after torch's cpu/cuda/mps/meta.
torch.serialization.register_package(30, lambda storage: None, _restore_xla_location)


# -- storage identity ---------------------------------------------------------
# One fake address range per live Storage cell, handed out on first ask and
# never reused while the cell lives, so ``[data_ptr, data_ptr + nbytes)`` of two
# storages never overlap (safetensors compares such ranges). Not an engine
# cache: clearing it would change the identity of live tensors. Keyed weakly,
# so it holds no storage alive; nothing is stored for tensors never asked.
_STAND_INS: weakref.WeakKeyDictionary[Storage, tuple[torch.UntypedStorage, int]] = weakref.WeakKeyDictionary()
_ADDR_LOCK = threading.Lock()
_NEXT_ADDR = [1 << 44]  # far above 0 (torch's "no storage") and page aligned
_ADDR_ALIGN = 1 << 12


def _storage_nbytes(st: Storage) -> int:
    """Bytes of the storage's dense base array (its logical shape when padded)."""
    shape = st.logical_shape if st.logical_shape is not None else st.shape
    numel = 1
    for s in shape:
        numel *= s
    return numel * _dtypes.to_torch_dtype(st.dtype).itemsize


def storage_stand_in(st: Storage) -> torch.UntypedStorage:
    """The ``meta`` ``UntypedStorage`` that stands for ``st`` on the host (see ``XlaTensor.untyped_storage``).

    The same object for the storage's whole life (its ``_cdata`` identifies it
    as torch's ``StorageWeakRef`` expects), unless the base grows past its
    address range (``resize_``), which moves it to a fresh one.
    """
    nbytes = _storage_nbytes(st)
    hit = _STAND_INS.get(st)
    if hit is not None and hit[1] >= nbytes:
        if hit[0].nbytes() == nbytes:
            return hit[0]
        addr, reserved = hit[0].data_ptr(), hit[1]
    else:
        # Room for the bytes plus one spare page, so ranges never touch.
        reserved = -(-max(nbytes, 1) // _ADDR_ALIGN) * _ADDR_ALIGN
        with _ADDR_LOCK:
            addr = _NEXT_ADDR[0]
            _NEXT_ADDR[0] += reserved + _ADDR_ALIGN
    # Non-owning and on meta: nothing frees or reads the fake address. (torch's
    # stub names the C base class; the object is an UntypedStorage.)
    stand_in = cast(torch.UntypedStorage, torch._C._construct_storage_from_data_pointer(addr, _META_DEVICE, nbytes))
    _STAND_INS[st] = (stand_in, reserved)
    return stand_in


def is_xla_tensor(t: object) -> bool:
    return isinstance(t, XlaTensor)


_MAKE_WRAPPER = torch.Tensor._make_wrapper_subclass


def dense_tensor(storage: Storage, mk: MetaKey) -> XlaTensor:
    """``XlaTensor(storage, (), shape, None, 0, dtype, False, mk)`` for ``mk`` contiguous at offset 0.

    The recorder makes one per op: calling ``_make_wrapper_subclass`` here
    skips the class call and ``__new__``'s argument handling.
    """
    r = _MAKE_WRAPPER(XlaTensor, mk.shape, dtype=mk.dtype, device=_META_DEVICE)
    r._st = storage
    r._chain = ()
    r._mk = mk
    return r


def view_tensor(storage: Storage, chain: tuple[ViewStep, ...], mk: MetaKey) -> XlaTensor:
    """``XlaTensor(storage, chain, *mk, False, mk)``: a view with metadata ``mk``."""
    r = _MAKE_WRAPPER(
        XlaTensor, mk.shape, strides=mk.stride, storage_offset=mk.offset, dtype=mk.dtype, device=_META_DEVICE
    )
    r._st = storage
    r._chain = chain
    r._mk = mk
    return r


def new_base(
    value: jax.Array | LazyRef,
    dtype: torch.dtype,
    requires_grad: bool = False,
    sharding: jax.sharding.Sharding | None = None,
) -> XlaTensor:
    """A fresh contiguous XlaTensor owning a new storage that holds ``value``."""
    shape = tuple(value.shape)
    return XlaTensor(Storage(value, sharding), (), shape, None, 0, dtype, requires_grad)


def storage_of(t: XlaTensor) -> Storage:
    """The ``Storage`` cell behind ``t`` (shared by its views and by tensors that alias it).

    The declared way for packages above ``tensor`` to reach a tensor's data
    model (``XlaTensor._st`` is the tensor package's own).

    Example:
        >>> import torch
        >>> x = torch.ones(4, device="xla")
        >>> storage_of(x[1:]) is storage_of(x)
        True
    """
    return t._st


def view_chain(t: XlaTensor) -> tuple[ViewStep, ...]:
    """The view steps (``ViewStep``, ``ConstraintStep``) from ``storage_of(t)``'s base to ``t``; ``()`` for a base.

    Example:
        >>> import torch
        >>> x = torch.ones(4, 2, device="xla")
        >>> view_chain(x), len(view_chain(x.t()))
        ((), 1)
    """
    return t._chain


def set_view_chain(t: XlaTensor, chain: tuple[ViewStep, ...]) -> None:
    """Makes ``t`` read its base through ``chain`` (a sharding constraint added or removed at its end)."""
    t._chain = chain


def from_host(t: torch.Tensor) -> XlaTensor:
    """A new xla tensor holding a copy of the CPU tensor ``t``, uploaded on its first use.

    The copy behind ``t.to("xla")`` (``spmdtorch.tensor.transfer`` describes
    the deferred upload); with ``SPMDTORCH_DEFER_UPLOAD=0`` it is uploaded
    at once, replicated.

    Raises:
        RuntimeError: ``t`` is not on the CPU.
        OverflowError: an int64 value does not fit the int32 device storage.
    """
    if not config.settings().defer_upload:
        return new_base(to_device_array(t), t.dtype)
    return XlaTensor(Storage.on_host(HostCopy(t)), (), tuple(t.shape), None, 0, t.dtype)


_STRIDES: caches.BoundedCache[tuple[int, ...], tuple[int, ...]] = caches.bounded(
    "tensor.xla_tensor.contiguous_strides", maxsize=4096
)


def contiguous_strides(shape: tuple[int, ...]) -> tuple[int, ...]:
    """Row-major strides of ``shape`` (cached per shape)."""
    hit = _STRIDES.get(shape)
    if hit is not None:
        return hit
    strides: list[int] = []
    acc = 1
    for s in reversed(shape):
        strides.append(acc)
        acc *= max(s, 1)
    out = tuple(reversed(strides))
    _STRIDES.put(shape, out)
    return out


def wrap_jax_array(arr: jax.Array, dtype: torch.dtype | None = None, requires_grad: bool = False) -> XlaTensor:
    """Wrap a concrete JAX array as an XlaTensor (the array is owned, not copied)."""
    if dtype is None:
        dtype = _dtypes.to_torch_dtype(arr.dtype)
    return new_base(arr, dtype, requires_grad=requires_grad)
