"""``torch_xla.core.xla_builder``: ``call_jax`` runs a JAX function on xla tensors inside the traced program.

``call_jax(jax_func, args, kwargs=None, name=None, override_hash=None)`` is
:func:`spmdtorch.call_jax`: one node of the lazy graph (or of a compiled
step) whose function is ``jax_func``, run with the active mesh (the one
``xs.set_global_mesh`` set) as JAX's abstract mesh, differentiable through
``jax.vjp``. PyTorch/XLA's HLO builder (``Op``, ``create_computation``...)
has no spmdtorch meaning: spmdtorch builds no HLO of its own; write the
computation as a JAX function and call it with ``call_jax``.
"""

from __future__ import annotations

from spmdtorch import CallJaxError, call_jax

__all__ = ["CallJaxError", "call_jax"]
