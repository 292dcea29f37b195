"""Special ops: ATen calls with a handler of their own (step 1 of the router).

Transfers (``copy_``, ``_to_copy`` to another device, ``.item()``), in-place
ops that change a tensor's metadata (``t_``, ``set_``, ``resize_``), ops that
return Python values (``equal``, ``allclose``), and two linear-algebra entry
points. Each registers with ``@special`` by ATen name.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import torch

from spmdtorch.lazy import contract, metrics
from spmdtorch.tensor._facts import view_twin
from spmdtorch.tensor._host import to_device_array
from spmdtorch.tensor._router import dispatch, special
from spmdtorch.tensor._values import to_cpu
from spmdtorch.tensor.dispatch._errors import DeviceMismatchError, MetaFactoryLeak
from spmdtorch.tensor.dispatch._paths import decompose, dispatch_lowering, write
from spmdtorch.tensor.xla_tensor import PYTHON_KEY, XLA_DEVICE, XlaTensor, forget_meta_key, new_base

if TYPE_CHECKING:
    from spmdtorch.tensor._facts import Op, OpFacts

__all__ = ["copy_", "local_scalar_dense"]

aten = torch.ops.aten


@special("copy_.default")
def copy_(func: Op | None, args: tuple[Any, ...], kwargs: dict[str, Any], facts: OpFacts | None = None) -> Any:
    """``dst.copy_(src)`` where either side is an xla tensor."""
    dst, src = args[0], args[1]
    if not isinstance(dst, XlaTensor):
        # xla → cpu (or another device): materialise then let torch copy.
        dst.copy_(to_cpu(src))
        return dst
    if not isinstance(src, XlaTensor):
        if src.device.type == "meta":
            raise MetaFactoryLeak(f"copy_ from a tensor on meta (it has no data) into an xla tensor {tuple(dst.shape)}")
        if src.device.type != "cpu":
            raise DeviceMismatchError(f"copy_ from a tensor on {src.device} into an xla tensor")
        src = new_base(to_device_array(src), src.dtype)
    write(dst, src, fresh=True)
    return dst


@special("_to_copy.default")
def _to_copy(func: Op, args: tuple[Any, ...], kwargs: dict[str, Any], facts: OpFacts) -> Any:
    x = args[0]
    device = kwargs.get("device")
    # C++ code sees an XlaTensor's storage device (meta): ``x.to(dtype)``
    # inside a composite op (softmax with dtype=) asks for a copy on meta,
    # which means "stay where you are". A meta tensor holds no data, so no
    # caller can want the xla value moved there.
    if device is not None and torch.device(device).type not in ("xla", "meta"):
        out = to_cpu(x)
        dtype = kwargs.get("dtype")
        if dtype is not None and dtype != out.dtype:
            out = out.to(dtype)
        if torch.device(device).type != "cpu":
            out = out.to(device)
        return out
    kwargs = {k: v for k, v in kwargs.items() if k in ("dtype",) and v is not None}
    return dispatch_lowering(func, (x,), kwargs, facts)


@special("_local_scalar_dense.default")
def local_scalar_dense(
    func: Op | None, args: tuple[Any, ...], kwargs: dict[str, Any], facts: OpFacts | None = None
) -> Any:
    """``.item()``: the value, computed now."""
    metrics.inc("aten::_local_scalar_dense")
    return to_cpu(args[0]).item()


@special("t_", "transpose_", "squeeze_", "unsqueeze_", "swapdims_", "swapaxes_", "as_strided_")
def _metadata_inplace_view(func: Op, args: tuple[Any, ...], kwargs: dict[str, Any], facts: OpFacts) -> Any:
    """``t_``, ``transpose_``, ``squeeze_``...: self becomes a view of itself."""
    self = args[0]
    view = dispatch(view_twin(func), args, kwargs)
    with torch._C._ExcludeDispatchKeyGuard(PYTHON_KEY):
        torch.ops.aten.as_strided_.default(self, list(view.shape), list(view.stride()), view.storage_offset())
    forget_meta_key(self)
    self._chain = view._chain
    return self


@special("set_.source_Tensor")
def _set_(func: Op, args: tuple[Any, ...], kwargs: dict[str, Any], facts: OpFacts) -> Any:
    self = args[0]
    if len(args) < 2 or not isinstance(args[1], XlaTensor):
        raise NotImplementedError(f"{func} is only supported with another xla tensor as source")
    src = args[1]
    with torch._C._ExcludeDispatchKeyGuard(PYTHON_KEY):
        torch.ops.aten.as_strided_.default(self, list(src.shape), list(src.stride()), src.storage_offset())
    forget_meta_key(self)
    self._st = src._st
    self._chain = src._chain
    return self


@special("resize_.default")
def _resize_(func: Op, args: tuple[Any, ...], kwargs: dict[str, Any], facts: OpFacts) -> Any:
    self, size = args[0], list(args[1])
    if list(self.shape) == size:
        return self
    if self._chain:
        raise RuntimeError("resize_ of a view is not supported on xla tensors")
    with torch._C._ExcludeDispatchKeyGuard(PYTHON_KEY):
        torch.ops.aten.resize_.default(self, size)
    forget_meta_key(self)
    fresh = dispatch(aten.empty.memory_format, (size,), {"dtype": self.dtype, "device": torch.device("xla")})
    self._st = fresh._st
    return self


@special("equal.default")
def _equal(func: Op | None, args: tuple[Any, ...], kwargs: dict[str, Any], facts: OpFacts | None) -> Any:
    """``torch.equal``: a Python bool, so the comparison is computed now."""
    a, b = args[0], args[1]
    if tuple(a.shape) != tuple(b.shape):
        return False
    return bool(
        local_scalar_dense(None, (dispatch(aten.all.default, (dispatch(aten.eq.Tensor, (a, b), {}),), {}),), {})
    )


@special("allclose.default")
def _allclose(func: Op, args: tuple[Any, ...], kwargs: dict[str, Any], facts: OpFacts) -> Any:
    """``torch.allclose``: a Python bool, computed now through ``isclose``."""
    close = dispatch(aten.isclose.default, args, kwargs)
    return bool(local_scalar_dense(None, (dispatch(aten.all.default, (close,), {}),), {}))


@special("_linalg_check_errors.default")
def _linalg_check_errors(func: Op, args: tuple[Any, ...], kwargs: dict[str, Any], facts: OpFacts) -> Any:
    """torch.linalg's ``check_errors``: skipped, as PyTorch/XLA does, because
    raising needs the ``info`` values on the host (a sync per call, and
    impossible inside ``spmdtorch.compile``); a failed factorization shows as
    inf/nan in its results instead."""
    return None


@special("_linalg_det.default", "_linalg_slogdet.default")
def _linalg_det_factors(func: Op, args: tuple[Any, ...], kwargs: dict[str, Any], facts: OpFacts) -> Any:
    """``_linalg_det``/``_linalg_slogdet``: return the LU factors torch's backward expects.

    torch factors ``A^T`` when A is contiguous and real (LAPACK is
    column-major; det(A^T) = det(A)) and ``A`` itself otherwise, and its
    backward picks the solve from the saved A's strides. The lowering sees
    values only and always factors the transpose of what it is given, so a
    non-contiguous real A (a transposed view...) is handed over as the
    contiguous ``A^T``: the same determinant, and the factors of A.
    """
    A = args[0]
    if not A.is_complex() and not A.is_contiguous():
        args = (A.mT.contiguous(),) + tuple(args[1:])
    return dispatch_lowering(func, args, kwargs, facts)


# Ops that update some arguments as a side effect (batch norm's running
# statistics; ``native_batch_norm`` does so without saying it in its schema).
# torch's decompositions express the update as a functional op plus copy_,
# which the engine writes back like any in-place op.
@special("native_batch_norm.default", "_native_batch_norm_legit.default", "_batch_norm_with_update.default")
def _decompose_batch_norm(func: Op, args: tuple[Any, ...], kwargs: dict[str, Any], facts: OpFacts) -> Any:
    """torch's decomposition, with eager CPU's eval-mode outputs: empty
    ``save_mean``/``save_invstd`` (the decomposition returns per-channel ones
    off CPU, as CUDA does; backward in eval mode reads the running stats)."""
    out = decompose(func, args, kwargs)
    names = facts.arg_names
    if "training" not in names:  # _batch_norm_with_update always trains
        return out
    i = names.index("training")
    training = args[i] if i < len(args) else kwargs.get("training")
    if training or not isinstance(out, (tuple, list)) or len(out) != 3:
        return out
    empty = [dispatch(aten.empty.memory_format, ([0],), {"dtype": o.dtype, "device": XLA_DEVICE}) for o in out[1:]]
    return (out[0], *empty)


@special("_nested_tensor_from_mask_left_aligned.default")
def _nested_tensor_from_mask_left_aligned(
    func: Op, args: tuple[Any, ...], kwargs: dict[str, Any], facts: OpFacts
) -> Any:
    """Whether each row of ``mask`` (N, L) is all True then all False: a Python bool.

    ``nn.TransformerEncoder`` asks this in eval mode to choose its nested-tensor
    fast path (which it never takes for xla tensors: they have a
    ``__torch_function__``). Computed as torch's kernel does, then read on the
    host (a sync). While ``spmdtorch.compile`` traces, no value can be read:
    the answer is False, which only ever selects the general path.
    """
    t, mask = args[0], args[1]
    if mask.dtype != torch.bool:
        # torch's TORCH_CHECK messages, word for word.
        name = str(mask.dtype).removeprefix("torch.").capitalize()
        raise RuntimeError(f"Expected mask to be of ScalarType Bool, but got {name} instead.")
    if mask.dim() != 2:
        raise RuntimeError("Padding mask should be 2D")
    if t.dim() != 3:
        raise RuntimeError("Input should be a 3D tensor, N * L * D")
    n, length = t.shape[0], t.shape[1]
    if tuple(mask.shape) != (n, length):
        raise RuntimeError("Mask size should match input size")
    if contract.tracing():
        return False
    # Row i is left-aligned iff mask[i] == (arange(L) < index of its first False).
    dev = {"device": XLA_DEVICE}
    pad = dispatch(aten.zeros.default, ([n, 1],), {"dtype": torch.bool, **dev})
    ints = dispatch(aten._to_copy.default, (dispatch(aten.cat.default, ([mask, pad], 1), {}),), {"dtype": torch.int32})
    first_false = dispatch(aten.argmin.default, (ints, 1), {})
    ar = dispatch(aten.arange.default, (length,), {"dtype": first_false.dtype, **dev})
    want = dispatch(
        aten.lt.Tensor,
        (dispatch(aten.unsqueeze.default, (ar, 0), {}), dispatch(aten.unsqueeze.default, (first_false, 1), {})),
        {},
    )
    return _equal(None, (want, mask), {}, None)


@special("is_pinned.default")
def _is_pinned(func: Op, args: tuple[Any, ...], kwargs: dict[str, Any], facts: OpFacts) -> Any:
    """``t.is_pinned()``: False, an xla tensor lives in device memory, never in pinned host memory.

    ``torch.distributed.checkpoint`` asks it of every tensor it saves.
    """
    return False
