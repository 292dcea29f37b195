"""PyTorch/XLA's environment variables, honoured or refused by name at ``install()``.

Read through :mod:`spmdtorch.config` (knobs ``pt_xla_debug_level``,
``xla_use_bf16``, ``xla_downcast_bf16``, ``xla_ir_debug``, ``xla_hlo_debug``,
``xla_save_tensors_file``/``_fmt``, ``xla_metrics_file``):

* ``PT_XLA_DEBUG_LEVEL`` >= 1: log why each program compiles (spmdtorch's
  recompilation log); >= 2: also a line per barrier that executed programs.
* ``XLA_SAVE_TENSORS_FILE``: at every barrier (``xm.mark_step()``,
  ``torch_xla.sync()``, ``with torch_xla.step()``, ``MpDeviceLoader``), the
  pending graph is appended to the file, as StableHLO (``XLA_SAVE_TENSORS_FMT=text``,
  the default) or HLO text (``hlo``). ``dot`` is refused.
* ``XLA_METRICS_FILE``: the metrics report is appended at every barrier.
* ``XLA_USE_BF16``, ``XLA_DOWNCAST_BF16``, ``XLA_IR_DEBUG``, ``XLA_HLO_DEBUG``:
  refused with :class:`UnsupportedEnvironmentError` (the message says why and
  what to use).
"""

from __future__ import annotations

import logging
from collections.abc import Callable

from spmdtorch import _step, config, debug
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


def _tensors_file_hook(path: str, fmt: str) -> Callable[[str], None]:
    steps = [0]

    def hook(when: str) -> None:
        if when != "before":
            return
        text = debug.get_hlo_text() if fmt == "hlo" else debug.get_stablehlo()
        if not text:
            return
        steps[0] += 1
        with open(path, "a") as f:
            f.write(f"[spmdtorch.compat] XLA_SAVE_TENSORS_FILE: graph of barrier {steps[0]} ({fmt})\n{text}\n")

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
    _step.BARRIER_HOOKS.extend(_HOOKS)


def remove() -> None:
    """Removes the hooks :func:`apply` installed."""
    for hook in _HOOKS:
        if hook in _step.BARRIER_HOOKS:
            _step.BARRIER_HOOKS.remove(hook)
    _HOOKS.clear()
