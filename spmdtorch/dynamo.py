"""``torch.compile(fn, backend="spmdtorch")``: TorchDynamo graphs over xla tensors.

TorchDynamo captures a function's tensor operations as an FX graph (guarding
the Python state it depends on) and hands the graph to a *backend*. This
backend runs the captured graph's operations on the real xla tensors through
spmdtorch's lazy engine: they join the lazy program like any other ops, so a
compiled model's forward, its backward and the optimizer step are computed as
one program at the step's ``spmdtorch.sync()``. (``openxla_backend``, what
``backend="openxla"`` is under ``spmdtorch.compat``, computes each graph at the
call, as PyTorch/XLA executes it.) Consequences:

* shardings of the inputs (``mark_sharding``, FSDPv2 parameters) are honoured,
  outputs keep the shardings the program gives them, and
  ``spmdtorch.sharding.mark_sharding`` called inside the compiled function is
  recorded in the graph (as ``torch.ops.spmdtorch.mark_sharding_``) and
  applied when the graph runs;
* gradients flow as in eager: the graph's ops run under autograd on the real
  tensors (no AOTAutograd), so ``loss.backward()`` after a compiled forward
  records the backward lazily, computed at the next sync;
* a graph break runs the Python between graphs lazily, as plain lazy mode;
* Dynamo re-traces only when a guard fails (new shapes, dtypes, Python
  state); a new input sharding does not re-trace, the engine compiles one
  more XLA program for it (cached by the engine like any lazy step).

* ``dynamic=True`` (or Dynamo's automatic dynamic shapes) keeps one graph
  for every size; the engine compiles one XLA program per concrete shape;
* ``functorch``'s ``aot_function`` over xla tensors works too: annotations
  become ``torch.ops.spmdtorch.sharded_copy`` in its forward and backward graphs.

Devices inside the compiled function behave as in eager: ``t.device`` reads
``xla:0``, ``device="xla"`` and ``.to("xla")`` create and move tensors there,
``.cpu()`` leaves, a 0-dim CPU tensor mixes with xla tensors and a larger one
raises Dynamo's "Tensor device mismatch" naming xla:0 and cpu (as cuda and cpu
do). How: Dynamo traces an xla tensor as a ``meta`` fake (torch has no device
guard for "xla" without torch_xla's C++, and autograd needs one), and this
module wraps two pieces of Dynamo's tracing so that those fakes read as xla
to the traced Python (see ``_install_tracing_hooks``). The wraps are installed
when this module is imported, which torch does when it looks the backend up
by name (``torch.compile(fn, backend="spmdtorch")``); a wrapper backend that
looks ``"spmdtorch"`` up only inside its own call should import
``spmdtorch.dynamo`` first.

A graph replays: from its first call on it runs through
``spmdtorch.assume_pure`` (recorded once per input signature, then one lazy
node per call and one for its backward), so a compiled model does not
re-record its ops in Python each call. Graphs assume_pure refuses (an input
updated in place, as an optimizer step's graph; random numbers; an output
that is an input or a view of one) are recorded op by op (``_Replay``).

Example:
    >>> import torch, spmdtorch
    >>> lin = torch.nn.Linear(4, 2).to("xla")
    >>> fast = torch.compile(lin, backend="spmdtorch")
    >>> fast(torch.ones(3, 4, device="xla")).shape
    torch.Size([3, 2])
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Sequence
from typing import Any

import torch
import torch.fx
from torch.utils import _pytree as pytree

from spmdtorch import config
from spmdtorch.lazy import metrics
from spmdtorch.programs import AssumePureError, assume_pure, sync
from spmdtorch.tensor.xla_tensor import XLA_DEVICE, XLA_FAKE_MODES, XlaTensor

__all__ = ["backend", "openxla_backend"]

_META = torch.device("meta")


# -- what the traced Python sees ---------------------------------------------
# Dynamo traces an xla tensor as a ``meta`` fake (see the module docstring): an
# "xla" fake would need torch's device guard for "xla", which only torch_xla's
# C++ registers (autograd on such a fake aborts the process). Two wraps of
# Dynamo's tracing make the meta fakes of a trace that holds xla tensors read
# as xla to the user's Python, while the fakes themselves stay on meta:
#
# * ``TensorVariable.specialize`` (the properties Dynamo answers for a traced
#   tensor without running anything): ``t.device`` is ``xla:0``;
# * ``torch._dynamo.utils.run_node`` (each recorded call run on fakes): an
#   "xla" device argument (``device="xla"``, ``.to("xla")``, ``device=t.device``)
#   runs as ``meta``, so fakes created inside the function meet the inputs on
#   one device; the graph keeps "xla", which the backend runs for real. A mix
#   that torch refuses on one device pair (xla and a non-scalar CPU tensor)
#   is reported as torch reports cuda and cpu mixed: Dynamo's "Tensor device
#   mismatch" (a ``TorchRuntimeError``), naming xla:0 and cpu.
#
# A fake mode takes part once it fakified an xla tensor (``XLA_FAKE_MODES``,
# filled by ``XlaTensor.__tensor_unflatten__``) or ran a call naming an "xla"
# device. Invariant: in such a mode every ``meta`` fake stands for an xla
# tensor (a real ``meta`` tensor passed to the same compiled function would
# read as xla too). Both wraps are installed at the import of this module,
# which torch does when it looks the backend up by name, before it traces.


def _is_xla_device(arg: Any) -> bool:
    if isinstance(arg, torch.device):
        return arg.type == "xla"
    return isinstance(arg, str) and (arg == "xla" or arg.startswith("xla:"))


def _to_meta_device(arg: Any) -> Any:
    return _META if _is_xla_device(arg) else arg


def _stands_for_xla(value: Any) -> bool:
    """Whether ``value`` is a ``meta`` fake of a trace over xla tensors."""
    from torch._subclasses.fake_tensor import FakeTensor

    return isinstance(value, FakeTensor) and value.fake_device == _META and value.fake_mode in XLA_FAKE_MODES


def _xla_named(device: torch.device) -> torch.device:
    return XLA_DEVICE if device == _META else device


def _install_tracing_hooks() -> bool:
    """Wrap Dynamo's ``TensorVariable.specialize`` and ``utils.run_node`` once; False where torch lacks them."""
    from torch._dynamo import utils as dynamo_utils
    from torch._dynamo.variables.tensor import TensorVariable
    from torch._subclasses.fake_tensor import FakeTensorDeviceMismatchError

    orig_specialize = getattr(TensorVariable, "specialize", None)
    orig_run_node = getattr(dynamo_utils, "run_node", None)
    if orig_specialize is None or orig_run_node is None:
        return False
    if getattr(orig_run_node, "_spmdtorch", False):
        return True

    def specialize(value: torch.Tensor) -> dict[str, Any]:
        props = orig_specialize(value)
        if _stands_for_xla(value):
            props["device"] = XLA_DEVICE
        return props

    def run_node(tracer: Any, node: torch.fx.Node, args: Any, kwargs: Any, nnmodule: Any) -> Any:
        from torch._guards import active_fake_mode

        mode = active_fake_mode()
        if mode is None:  # a real run (Dynamo's get_real_value): arguments as recorded
            return orig_run_node(tracer, node, args, kwargs, nnmodule)
        names_xla = any(_is_xla_device(a) for a in pytree.tree_leaves((args, kwargs)))
        if names_xla:
            XLA_FAKE_MODES.add(mode)
        if mode not in XLA_FAKE_MODES:
            return orig_run_node(tracer, node, args, kwargs, nnmodule)
        if names_xla:
            args = pytree.tree_map(_to_meta_device, args)
            kwargs = pytree.tree_map(_to_meta_device, kwargs)
        try:
            return orig_run_node(tracer, node, args, kwargs, nnmodule)
        except RuntimeError as e:
            # FakeTensor's own check names the stand-ins' meta device (run_node chains it as the
            # cause); Dynamo reports it with xla in it, as it reports cuda and cpu mixed in one call.
            cause = e.__cause__ if isinstance(e.__cause__, FakeTensorDeviceMismatchError) else e
            if not isinstance(cause, FakeTensorDeviceMismatchError):
                raise
            named = FakeTensorDeviceMismatchError(cause.func, _xla_named(cause.common_device), _xla_named(cause.device))
            raise RuntimeError(str(e).replace(str(cause), str(named))) from named

    run_node._spmdtorch = True  # type: ignore[attr-defined]
    TensorVariable.specialize = staticmethod(specialize)  # type: ignore[method-assign]
    dynamo_utils.run_node = run_node
    return True


# Code Dynamo must run, never trace: the engine and JAX. Between two graphs
# (after a graph break, or when the traced Python reads a value with ``bool(t)``
# / ``.item()``) the lazy engine computes pending work in Python; Dynamo would
# otherwise try to compile each of those frames (spmdtorch's executor, JAX's
# dispatch) as user code. User-facing spmdtorch functions (``mark_sharding``,
# FSDPv2's forward, MixedPrecision) stay traceable.
_ENGINE_MODULES = ("spmdtorch.lazy", "spmdtorch.tensor", "spmdtorch.ops", "spmdtorch.programs._step", "jax", "jaxlib")


def _skip_engine_frames() -> bool:
    """Add the engine's and JAX's files to Dynamo's skip list; False where torch lacks the call."""
    from torch._dynamo import trace_rules

    add = getattr(trace_rules, "add", None)
    if add is None:
        return False
    for name in _ENGINE_MODULES:
        add(name)
    return True


# -- recompiles ----------------------------------------------------------------
# Dynamo recompiles a frame only when a guard of every compiled version fails;
# torch computes the failed guards (``guards.get_and_maybe_log_recompilation_reasons``,
# which convert_frame calls before it traces the frame again). The wrap below
# keeps them; the backend, called with the new graph, counts the recompile
# (``DynamoRecompiles``) and, with ``SPMDTORCH_LOG_RECOMPILES=1`` (or
# ``spmdtorch.debug.log_recompiles()``), logs them on ``spmdtorch.compile``,
# the logger the engine's own recompile lines use.
_log = logging.getLogger("spmdtorch.compile")


class _Pending(threading.local):
    """The guard failures of the frame Dynamo is recompiling on this thread (``None``: a first compile)."""

    reasons: tuple[str, str] | None = None  # (function and place, guard failures)


_PENDING = _Pending()


def _install_recompile_hook() -> bool:
    """Wrap convert_frame's call to torch's recompile-reason function; False where torch lacks it."""
    from torch._dynamo import convert_frame

    orig = getattr(convert_frame, "get_and_maybe_log_recompilation_reasons", None)
    if orig is None:
        return False
    if getattr(orig, "_spmdtorch", False):
        return True

    def reasons_hook(cache_entries: Any, frame: Any, *args: Any, **kwargs: Any) -> list[str]:
        reasons = orig(cache_entries, frame, *args, **kwargs)
        code = frame.f_code
        where = f"{code.co_name} ({code.co_filename}:{code.co_firstlineno})"
        _PENDING.reasons = (where, "; ".join(r.replace("\n", "; ") for r in reasons) or "no guard failure reported")
        return reasons

    reasons_hook._spmdtorch = True  # type: ignore[attr-defined]
    convert_frame.get_and_maybe_log_recompilation_reasons = reasons_hook
    return True


_NO_HOOK_WARNED = False  # the missing-hook warning below is given once per process


def _note_recompile() -> None:
    """Count (and, when asked, log) the recompile whose first graph the backend was just given."""
    global _NO_HOOK_WARNED
    pending, _PENDING.reasons = _PENDING.reasons, None
    if not _RECOMPILE_HOOK and not _NO_HOOK_WARNED and config.settings().log_recompiles:
        # A torch release without the wrapped function: say so once rather than log nothing silently.
        _NO_HOOK_WARNED = True
        _log.warning(
            f"SPMDTORCH_LOG_RECOMPILES: torch {torch.__version__} has no "
            "torch._dynamo.convert_frame.get_and_maybe_log_recompilation_reasons, so torch.compile's "
            "recompiles are neither counted (DynamoRecompiles) nor logged here; TORCH_LOGS=recompiles "
            "makes torch log them with the failed guard"
        )
    if pending is None:
        return
    metrics.inc("DynamoRecompiles")
    if config.settings().log_recompiles or _log.isEnabledFor(logging.INFO):
        where, reasons = pending
        _log.warning(f"torch.compile traced {where} again: Dynamo guard failed: {reasons}")


_TRACING_HOOKS = _install_tracing_hooks()
_RECOMPILE_HOOK = _install_recompile_hook()
_ENGINE_SKIPPED = _skip_engine_frames()


def _to_xla_device(arg: Any) -> Any:
    """``arg`` with the ``meta`` device (Dynamo's stand-in for xla) replaced by ``xla:0``."""
    if isinstance(arg, torch.device) and arg == _META:
        return XLA_DEVICE
    if isinstance(arg, str) and arg == "meta":
        return "xla"
    return arg


def _retarget_devices(gm: torch.fx.GraphModule) -> None:
    """Point factory calls and ``.to(device)`` in ``gm`` that Dynamo recorded on ``meta`` at ``xla:0``."""
    changed = False
    for node in gm.graph.nodes:
        if node.op not in ("call_function", "call_method"):
            continue
        args = pytree.tree_map(_to_xla_device, node.args)
        kwargs = pytree.tree_map(_to_xla_device, node.kwargs)
        if args != node.args or kwargs != node.kwargs:
            node.args, node.kwargs = args, kwargs
            changed = True
    if changed:
        gm.recompile()


def _has_xla(values: Sequence[Any]) -> bool:
    return any(isinstance(v, XlaTensor) for v in pytree.tree_leaves(list(values)))


def _names_xla(gm: torch.fx.GraphModule) -> bool:
    """Whether a call in ``gm`` names an "xla" device (tensors created on or moved to xla in the graph)."""
    return any(_is_xla_device(leaf) for node in gm.graph.nodes for leaf in pytree.tree_leaves((node.args, node.kwargs)))


class _Replay:
    """Runs a captured graph: recorded op by op at first, then as one cached node per call.

    The first call records the graph's ops as lazy mode would. If that call's
    outputs alias none of its xla inputs (a replayed graph returns fresh
    tensors, which would cut the link a view or an input returned as is
    keeps), later calls go through ``spmdtorch.assume_pure(gm)``: recorded
    once per input signature, then one node (and, with grad, one backward
    node) per call. Dynamo's graphs are pure functions of their inputs except
    where assume_pure refuses them at the first call of a signature (an
    argument updated in place, as an optimizer's graph does; random numbers;
    a CPU tensor argument; a host read; an annotation inside the graph): such
    a graph is recorded op by op from then on. Counters: ``DynamoGraphReplays``
    (calls run as one node), ``DynamoGraphsRecorded`` (graphs that stay op by op).
    """

    def __init__(self, gm: torch.fx.GraphModule, example_inputs: Sequence[Any]) -> None:
        self.gm = gm
        self.replaying = False  # gm.forward is assume_pure's (it marks a module in place)
        self.recorded_why = ""
        why = _replay_refusal(gm, example_inputs)
        if why:
            self._record(why)
        else:
            # torch may hand over a lazily compiled GraphModule whose forward compiles itself and calls
            # the module again: compile it now, so the forward assume_pure wraps is the graph's code.
            real_recompile = getattr(gm, "real_recompile", None)
            if real_recompile is not None:
                real_recompile()
            assume_pure(gm)
            self.replaying = True

    def _record(self, why: str) -> None:
        if self.replaying:
            del self.gm.forward  # the instance attribute assume_pure set: the graph's own forward again
        self.replaying = False
        self.recorded_why = why
        metrics.inc("DynamoGraphsRecorded")

    def __call__(self, *args: Any) -> Any:
        if self.replaying:
            try:
                out = self.gm(*args)
            except AssumePureError as e:
                # Raised while recording a new signature on placeholders: nothing real ran yet.
                self._record(str(e))
            else:
                metrics.inc("DynamoGraphReplays")
                return out
        return self.gm(*args)


def _replay_refusal(gm: torch.fx.GraphModule, example_inputs: Sequence[Any]) -> str:
    """Why ``gm`` must be recorded op by op ("" if it may replay), from Dynamo's fake values of its nodes."""
    from torch.multiprocessing.reductions import StorageWeakRef

    tensors = [t for t in example_inputs if isinstance(t, torch.Tensor)]
    if not tensors or not all(isinstance(t, XlaTensor) for t in tensors):
        return "a graph input is not an xla tensor"
    inputs = set()
    for node in gm.graph.nodes:
        value = node.meta.get("example_value")
        if node.op == "placeholder" and isinstance(value, torch.Tensor):
            inputs.add(StorageWeakRef(value.untyped_storage()))
        if node.op == "output":
            for arg in pytree.tree_leaves(node.args):
                value = arg.meta.get("example_value") if isinstance(arg, torch.fx.Node) else None
                if value is None and isinstance(arg, torch.fx.Node):
                    return "an output has no fake value to check"
                # A replay returns fresh tensors: an output that is an input or a view of one would lose the alias.
                if isinstance(value, torch.Tensor) and StorageWeakRef(value.untyped_storage()) in inputs:
                    return f"output {arg.name} aliases a graph input"
    return ""


def _graph_runner(gm: torch.fx.GraphModule, example_inputs: Sequence[Any], *, sync_at_call: bool) -> Callable[..., Any]:
    metrics.inc("DynamoGraphs")
    _note_recompile()
    on_xla = _has_xla(example_inputs) or _names_xla(gm)
    if not on_xla:
        return gm
    _retarget_devices(gm)
    replay = _Replay(gm, example_inputs)
    if not sync_at_call:
        return replay

    def run(*args: Any) -> Any:
        out = replay(*args)
        sync()
        return out

    return run


def backend(gm: torch.fx.GraphModule, example_inputs: Sequence[Any]) -> Callable[..., Any]:
    """The TorchDynamo backend ``"spmdtorch"``: the captured graph's ops join the lazy program.

    Registered with TorchDynamo under the name ``"spmdtorch"`` (the
    ``torch_dynamo_backends`` entry point), so ``torch.compile(fn,
    backend="spmdtorch")`` finds it without importing anything first.

    The graph's ops are recorded on the xla tensors like any lazy code, so a
    compiled model's forward, the backward after it and the optimizer step
    are one program, computed at the step's ``spmdtorch.sync()`` (or when a
    value is read): a training loop compiles exactly the programs plain lazy
    mode compiles for it.

    Args:
        gm: the FX graph TorchDynamo captured (one per graph break).
        example_inputs: the graph's inputs for this first call.

    Returns:
        A callable taking the graph's inputs and returning its outputs. A
        graph without xla tensors runs as plain torch.
    """
    return _graph_runner(gm, example_inputs, sync_at_call=False)


def openxla_backend(gm: torch.fx.GraphModule, example_inputs: Sequence[Any]) -> Callable[..., Any]:
    """PyTorch/XLA's ``"openxla"`` semantics: as :func:`backend`, then the graph is computed at the call.

    ``spmdtorch.compat`` points ``backend="openxla"`` / ``"openxla_eval"`` here:
    PyTorch/XLA executes each captured graph when it is called, so its
    outputs (and in-place updates of its inputs) are device data on return
    and the next graph starts from concrete values.

    Args:
        gm: the FX graph TorchDynamo captured (one per graph break).
        example_inputs: the graph's inputs for this first call.

    Returns:
        A callable taking the graph's inputs: it records the graph's ops,
        computes them in one program (``spmdtorch.sync()``) and returns the
        outputs, sharded as the program left them.
    """
    return _graph_runner(gm, example_inputs, sync_at_call=True)
