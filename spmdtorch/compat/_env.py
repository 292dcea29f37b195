"""PyTorch/XLA's environment variables, honoured or refused by name at ``install()``.

Read through :mod:`spmdtorch.config` (knobs ``pt_xla_debug_level``,
``xla_use_bf16``, ``xla_downcast_bf16``, ``xla_ir_debug``, ``xla_hlo_debug``,
``xla_save_tensors_file``/``_fmt``, ``xla_metrics_file``):

* ``PT_XLA_DEBUG_LEVEL`` >= 1: log why each program compiles (spmdtorch's
  recompilation log); >= 2: also a line per barrier that executed programs.
* ``XLA_SAVE_TENSORS_FILE``: at every barrier (``xm.mark_step()``,
  ``torch_xla.sync()``, ``with torch_xla.step()``, ``MpDeviceLoader``), the
  pending graph is appended to ``<file>.0`` (PyTorch/XLA's name: the device
  ordinal appended) in PyTorch/XLA's layout (``## BEGIN_GRAPH`` ... ``## END_GRAPH``),
  as StableHLO (``XLA_SAVE_TENSORS_FMT=text``, the default) or HLO text
  (``hlo``, followed by the program's ``#OUTPUT_SHARDING`` block). ``dot`` is refused.
* ``XLA_METRICS_FILE``: the metrics report is appended at every barrier.
* ``XLA_USE_BF16``, ``XLA_DOWNCAST_BF16``, ``XLA_IR_DEBUG``, ``XLA_HLO_DEBUG``:
  refused with :class:`UnsupportedEnvironmentError` (the message says why and
  what to use).
"""

from __future__ import annotations

import hashlib
import logging
from collections.abc import Callable

from spmdtorch import config, debug, programs, runtime, sharding
from spmdtorch.compat.errors import GUIDE, UnsupportedEnvironmentError
from spmdtorch.lazy import metrics

__all__ = ["apply", "remove"]

_HOOKS: list[Callable[[str], None]] = []
_LOG = logging.getLogger("spmdtorch.compat")

_BF16 = (
    "{name}=1 asks PyTorch/XLA to store float tensors as bfloat16 behind torch's back; spmdtorch keeps every "
    "tensor's torch dtype (PyTorch/XLA 2.6 removed the variable too). Unset {name} and ask for bfloat16 "
    "explicitly: model.to(torch.bfloat16), FSDPv2(..., mixed_precision=MixedPrecision(param_dtype=torch.bfloat16)) "
    "or `with torch.autocast('xla', dtype=torch.bfloat16):`"
)
_IR = (
    "{name}=1 asks PyTorch/XLA to record the Python frame of every IR node; spmdtorch records no Python frames "
    "(it would cost every op on the recording path), so the HLO it prints carries spmdtorch's own source "
    "locations, not yours. Unset {name}; to see a step's program use XLA_SAVE_TENSORS_FILE, "
    "torch_xla._XLAC._get_xla_tensors_hlo(tensors) or spmdtorch.debug.get_hlo_text(), and "
    "PT_XLA_DEBUG_LEVEL=1 (or SPMDTORCH_LOG_RECOMPILES=1) to see why a step recompiles"
)


def _refuse(settings: config.Settings) -> None:
    for field, env, template in (
        ("xla_use_bf16", "XLA_USE_BF16", _BF16),
        ("xla_downcast_bf16", "XLA_DOWNCAST_BF16", _BF16),
        ("xla_ir_debug", "XLA_IR_DEBUG", _IR),
        ("xla_hlo_debug", "XLA_HLO_DEBUG", _IR),
    ):
        if getattr(settings, field):
            raise UnsupportedEnvironmentError(template.format(name=env) + f" ({GUIDE})")
    if settings.xla_save_tensors_file and settings.xla_save_tensors_fmt == "dot":
        raise UnsupportedEnvironmentError(
            "XLA_SAVE_TENSORS_FMT=dot (Graphviz) is not available: spmdtorch writes the step's program as "
            "StableHLO (XLA_SAVE_TENSORS_FMT=text) or HLO text (hlo); set one of those"
        )


#: numpy dtype name -> XLA's primitive type name (PyTorch/XLA prints shapes as ``f32[8,32]``).
_XLA_TYPES = {
    "float32": "f32",
    "float64": "f64",
    "float16": "f16",
    "bfloat16": "bf16",
    "int64": "s64",
    "int32": "s32",
    "int16": "s16",
    "int8": "s8",
    "uint8": "u8",
    "uint32": "u32",
    "bool": "pred",
    "complex64": "c64",
}


def save_tensors_path(path: str) -> str:
    """Where ``XLA_SAVE_TENSORS_FILE=path`` writes: ``path.<ordinal>``, as PyTorch/XLA names it.

    PyTorch/XLA appends the current device's ordinal; in SPMD mode that is the
    virtual device ``SPMD:0`` of each process, so ``path.0`` on one host. With
    several processes spmdtorch appends the process index, so hosts sharing a
    filesystem do not write into one file.
    """
    return f"{path}.{runtime.process_index()}"


def _output_shardings() -> str:
    """PyTorch/XLA's ``#OUTPUT_SHARDING`` lines (``f32[8,32] {devices=[8,1]0,...}``) of the last program run."""
    lines = []
    for out in debug.last_executable_outputs():
        shape = f"{_XLA_TYPES.get(out.dtype.name, out.dtype.name)}[{','.join(str(d) for d in out.shape)}]"
        lines.append(f"{shape} {sharding.hlo_sharding_string(out.sharding, len(out.shape))}")
    return "\n".join(lines) + "\n" if lines else ""


def _tensors_file_hook(path: str, fmt: str) -> Callable[[str], None]:
    """Appends each barrier's graph to ``path.<ordinal>`` in PyTorch/XLA's layout.

    One entry per barrier that computes something: ``[ScheduleSyncTensorsGraph]``,
    ``TensorsGraphInfo`` (empty: spmdtorch records no Python frames), the graph
    between ``## BEGIN_GRAPH`` and ``Graph Hash: ...`` / ``## END_GRAPH``; with
    ``XLA_SAVE_TENSORS_FMT=hlo`` the program's output shardings follow between
    ``#OUTPUT_SHARDING_BEGIN`` and ``#OUTPUT_SHARDING_END``, as PyTorch/XLA writes them.
    """
    executed = [metrics.counters.get("ExecuteCount", 0)]
    wrote = [False]

    def hook(when: str) -> None:
        if when == "before":
            executed[0] = metrics.counters.get("ExecuteCount", 0)
            text = debug.get_hlo_text() if fmt == "hlo" else debug.get_stablehlo()
            wrote[0] = bool(text)
            if not text:
                return
            digest = hashlib.blake2b(text.encode(), digest_size=16).hexdigest()
            with open(save_tensors_path(path), "a") as f:
                f.write(
                    "[ScheduleSyncTensorsGraph]\nTensorsGraphInfo:\n\n"
                    f"Root Hashes: ({digest})\n\n## BEGIN_GRAPH\n{text}\n\n"
                    f"Graph Hash: {digest}\n\n## END_GRAPH\n\n"
                )
        elif fmt == "hlo" and wrote[0] and metrics.counters.get("ExecuteCount", 0) != executed[0]:
            with open(save_tensors_path(path), "a") as f:
                f.write(f"\n#OUTPUT_SHARDING_BEGIN\n\n{_output_shardings()}\n#OUTPUT_SHARDING_END\n\n")

    return hook


def _metrics_file_hook(path: str) -> Callable[[str], None]:
    def hook(when: str) -> None:
        if when == "after":
            with open(path, "a") as f:
                f.write(debug.metrics_report())

    return hook


def _execution_log_hook() -> Callable[[str], None]:
    last = [metrics.counters.get("ExecuteCount", 0)]

    def hook(when: str) -> None:
        if when != "after":
            return
        now = metrics.counters.get("ExecuteCount", 0)
        if now != last[0]:
            _LOG.warning("Execution Analysis: a barrier ran %d program(s) (ExecuteCount %d)", now - last[0], now)
        last[0] = now

    return hook


def apply() -> None:
    """Refuses the meaningless variables, then installs the hooks the others ask for.

    Raises:
        UnsupportedEnvironmentError: see the module docstring.
        spmdtorch.config.ConfigError: a variable is malformed.
    """
    settings = config.read()
    _refuse(settings)
    level = settings.pt_xla_debug_level or 0
    if level >= 1:
        debug.log_recompiles(True)
        for name in ("spmdtorch.compile", "spmdtorch.compat"):
            log = logging.getLogger(name)
            if not log.handlers and not logging.getLogger().handlers:
                log.addHandler(logging.StreamHandler())
            log.setLevel(logging.INFO)
    if level >= 2:
        _HOOKS.append(_execution_log_hook())
    if settings.xla_save_tensors_file:
        _HOOKS.append(_tensors_file_hook(settings.xla_save_tensors_file, settings.xla_save_tensors_fmt))
    if settings.xla_metrics_file:
        _HOOKS.append(_metrics_file_hook(settings.xla_metrics_file))
    programs.BARRIER_HOOKS.extend(_HOOKS)


def remove() -> None:
    """Removes the hooks :func:`apply` installed."""
    for hook in _HOOKS:
        if hook in programs.BARRIER_HOOKS:
            programs.BARRIER_HOOKS.remove(hook)
    _HOOKS.clear()
