"""PyTorch/XLA's ``CheckpointManager`` signature on spmdtorch's (Orbax) manager.

``torch_xla.experimental.distributed_checkpoint.CheckpointManager(path,
save_interval, max_to_keep=0, ...)`` with ``save`` (blocking), ``save_async``,
``restore(step, state_dict)`` (in place, returns None), ``all_steps``,
``join`` and ``reached_preemption``. It writes spmdtorch's native Orbax
format (PyTorch/XLA's writes ``torch.distributed.checkpoint`` files), with
its atomic steps, fingerprints and fallbacks; the step directories are
readable by :func:`spmdtorch.checkpoint.load` and plain Orbax.
"""

from __future__ import annotations

from typing import Any

import torch

from spmdtorch import _checks
from spmdtorch.checkpoint.errors import CheckpointArgumentError, CheckpointArgumentTypeError
from spmdtorch.checkpoint.manager import CheckpointManager as _NativeManager
from spmdtorch.checkpoint.optim import init_optimizer_state
from spmdtorch.checkpoint.paths import CheckpointPath

__all__ = ["XlaCheckpointManager", "prime_optimizer"]


_FUNC = "CheckpointManager"  # PyTorch/XLA's name for it (distributed_checkpoint.CheckpointManager)


def _int_at_least(value: Any, name: str, minimum: int, hint: str = "") -> int:
    expected = f"an int >= {minimum}"
    if not _checks.is_int(value):
        _checks.fail(CheckpointArgumentTypeError, _FUNC, name, expected, value, hint)
    number = int(value)
    if number < minimum:
        # "got <value>" (no type name for an int): the form users and tests match on.
        raise CheckpointArgumentError(
            f"{_FUNC}: {name} must be {expected}, got {value!r}" + (f"; {hint}" if hint else "")
        )
    return number


def _assign_in_place(target: Any, new: Any) -> None:
    """Write ``new``'s values into the containers of ``target`` (dicts and lists), keeping them."""
    if isinstance(target, dict) and isinstance(new, dict):
        for k, v in new.items():
            if k in target and isinstance(target[k], (dict, list)) and type(v) is type(target[k]):
                _assign_in_place(target[k], v)
            elif target.get(k) is not v:
                target[k] = v
    elif isinstance(target, list) and isinstance(new, list) and len(target) == len(new):
        for i, v in enumerate(new):
            if isinstance(target[i], (dict, list)) and type(v) is type(target[i]):
                _assign_in_place(target[i], v)
            elif target[i] is not v:
                target[i] = v


class XlaCheckpointManager(_NativeManager):
    """``CheckpointManager`` with PyTorch/XLA's signature and semantics (Orbax format on disk).

    Args:
        path: The base directory; step ``s`` goes to ``path/s``.
        save_interval: ``should_save(step)`` is True when ``step % save_interval == 0``
            (or after a preemption).
        max_to_keep: Keep the steps written last, this many (by write time, not step
            number, also for a manager re-opened on the directory); 0 keeps all
            (PyTorch/XLA's default).
        max_pending_async: Accepted (>= 1); spmdtorch runs one background save at a
            time, a new one waits for the previous (PyTorch/XLA's default of 1).
        num_of_threads: Accepted (>= 1); Orbax sizes its own writers.
        process_group: Must be None: the processes of an spmdtorch job are JAX's.
        chkpt_on_preemption: Save at the step after a SIGTERM (see
            :class:`spmdtorch.checkpoint.CheckpointManager`).

    Raises:
        CheckpointArgumentError: an argument is out of range or of the wrong
            type, or ``process_group`` is given (a ``ValueError``;
            ``CheckpointArgumentTypeError`` for a wrong type).

    Example:
        >>> import tempfile, torch, spmdtorch
        >>> from spmdtorch.checkpoint.distributed_checkpoint import CheckpointManager
        >>> w = torch.zeros(2, device="xla")
        >>> mgr = CheckpointManager(tempfile.mkdtemp(), 2)
        >>> for step in range(4):
        ...     _ = w.add_(1)
        ...     _ = mgr.save_async(step, {"w": w, "step": step})
        >>> mgr.join(); mgr.all_steps()
        [0, 2]
        >>> state = {"w": torch.zeros(2, device="xla"), "step": -1}
        >>> mgr.restore(2, state); state["step"], state["w"].cpu()
        (2, tensor([3., 3.]))
        >>> mgr.close()
    """

    # PyTorch/XLA retires the checkpoint written longest ago, also after a restart.
    _retire_oldest_written = True

    def __init__(
        self,
        path: CheckpointPath,
        save_interval: int,
        max_to_keep: int | None = 0,
        max_pending_async: int | None = 1,
        num_of_threads: int | None = 1,
        process_group: Any = None,
        chkpt_on_preemption: bool = True,
    ) -> None:
        _checks.check_path(path, _FUNC, "path", CheckpointArgumentTypeError)
        self.save_interval = _int_at_least(save_interval, "save_interval", 1)
        keep = 0 if max_to_keep is None else _int_at_least(max_to_keep, "max_to_keep", 0, "0 or None keeps every step")
        if max_pending_async is not None:
            _int_at_least(max_pending_async, "max_pending_async", 1, "None means 1")
        if num_of_threads is not None:
            _int_at_least(num_of_threads, "num_of_threads", 1, "None means 1")
        if process_group is not None:
            raise CheckpointArgumentError(
                f"{_FUNC}: process_group must be None, got {type(process_group).__name__}: an spmdtorch job's "
                "processes are JAX's (joined at import), and every process calls save/restore; drop the argument"
            )
        self.max_to_keep = keep
        self.chkpt_on_preemption = _checks.check_bool(
            chkpt_on_preemption, _FUNC, "chkpt_on_preemption", CheckpointArgumentTypeError
        )
        super().__init__(
            path,
            save_interval_steps=self.save_interval,
            max_to_keep=keep or None,
            async_save=False,  # save() blocks, as in PyTorch/XLA; save_async() does not
            save_on_preemption=self.chkpt_on_preemption,
        )

    @property
    def base_path(self) -> str:
        """The base directory, as PyTorch/XLA names it."""
        return str(self.directory)

    def _due(self, step: int) -> bool:
        return step % self.save_interval == 0

    def save_async(self, step: int, state: object, force: bool = False) -> bool:
        """Start saving ``state`` as ``step`` (if due, or ``force``); the write goes on in the background.

        Returns after the device→host copy, once Orbax's background write has
        started; ``join()`` waits for it, and ``all_steps()`` lists the step once
        it is written.

        The copy runs here, on the caller's thread (spmdtorch's executor is not
        shared with a worker thread): PyTorch/XLA instead hands a host copy to a
        worker that calls ``self._save``. Code that patches ``_save`` to hold that
        worker back (PyTorch/XLA's own test does) therefore does not hold this
        save back; calling the patched method here instead would block the
        caller forever.
        """
        return _NativeManager._save(self, step, state, force, asynchronous=True, func="save_async")

    def restore(self, step: int, state_dict: Any, **kwargs: Any) -> None:  # type: ignore[override]
        """Restore ``step`` into ``state_dict`` in place (PyTorch/XLA's argument order; returns None).

        Tensors are filled in place (xla tensors keep their shardings); other
        values (ints, strings...) are written into ``state_dict``'s dicts and lists.
        Keyword arguments (``strict``, ``cast``) go to
        :meth:`spmdtorch.checkpoint.CheckpointManager.restore`.

        Raises:
            spmdtorch.checkpoint.StepNotFoundError: ``step`` is not saved.
        """
        new = super().restore(state_dict, step, **kwargs)
        _assign_in_place(state_dict, new)


def prime_optimizer(optimizer: torch.optim.Optimizer) -> torch.optim.Optimizer:
    """Give a fresh optimizer its state entries so a checkpoint can fill them (PyTorch/XLA's name).

    Same as :func:`spmdtorch.checkpoint.init_optimizer_state` (a zero-learning-rate
    step: parameters do not change); returns ``optimizer``.

    Example:
        >>> import torch, spmdtorch
        >>> opt = torch.optim.SGD(torch.nn.Linear(2, 2).to("xla").parameters(), lr=0.1, momentum=0.9)
        >>> prime_optimizer(opt) is opt, sorted(opt.state_dict()["state"][0])
        (True, ['momentum_buffer'])
    """
    _checks.check_instance(
        optimizer,
        torch.optim.Optimizer,
        "prime_optimizer",
        "optimizer",
        CheckpointArgumentTypeError,
        "a torch.optim.Optimizer",
    )
    init_optimizer_state(optimizer)
    return optimizer
