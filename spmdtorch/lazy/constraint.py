"""Sharding constraints in the lazy graph: the node and the view step that carries one.

``mark_sharding`` of a pending value is a sharding constraint on that value
(``jax.lax.with_sharding_constraint``), as PyTorch/XLA's annotation of an IR
value is (its ``CustomSharding`` node). Two shapes of it live here:

* a *node* (``record_constraint``): the storage's next value is the
  constrained one; the executor finds the user's mesh in its template;
* a *view step* (``ConstraintStep``): ``mark_sharding`` of a view constrains
  that view's value, not its base's, so the constraint is the last step of
  the view's chain and every read of the view replays it. Numerically it is
  the identity, and writes through the view pass straight to its parent.

Example:
    >>> import jax, numpy as np
    >>> mesh = jax.sharding.Mesh(np.array(jax.devices()), ("d",))
    >>> sharding = jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec("d"))
    >>> x = jax.numpy.zeros(8)
    >>> ref = record_constraint(x, sharding)   # pending: the next barrier computes it
    >>> constrained_input(ref) is x
    True
"""

from __future__ import annotations

from typing import Any

import jax

from spmdtorch.lazy._record import record
from spmdtorch.lazy._storage import ViewStep
from spmdtorch.lazy.graph import LazyRef, Slot

__all__ = ["CONSTRAINT", "ConstraintStep", "constrain", "constrained_input", "constraint_template", "record_constraint"]

#: The name of every constraint node (``executor`` reads the user's mesh from
#: their ``sharding`` keyword; graph keys hold it with the sharding).
CONSTRAINT = "sharding_constraint"


def constrain(x: jax.Array, *, sharding: jax.sharding.Sharding) -> Any:  # jax.lax is unannotated
    """The constraint node's lowering: ``x`` with its sharding pinned to ``sharding``."""
    return jax.lax.with_sharding_constraint(x, sharding)


def constraint_template(sharding: jax.sharding.Sharding) -> tuple[tuple[Slot], tuple[tuple[str, Any]]]:
    """The node template ``((Slot(0),), (("sharding", sharding),))`` of a constraint."""
    return ((Slot(0),), (("sharding", sharding),))


def record_constraint(value: Any, sharding: jax.sharding.Sharding) -> LazyRef:
    """Record ``constrain(value, sharding)``; ``value`` is a ``LazyRef`` or a concrete array."""
    ref: LazyRef = record(
        constrain, CONSTRAINT, constraint_template(sharding), [value], ((tuple(value.shape), value.dtype),)
    )
    return ref


def constrained_input(value: Any) -> Any:
    """The input of the constraint node ``value`` is an output of, else None."""
    if isinstance(value, LazyRef) and value.node.name == CONSTRAINT:
        return value.node.inputs[0]
    return None


class ConstraintStep(ViewStep):
    """A view step that keeps the value and constrains its sharding.

    ``op`` is an identity view op (the tensor layer passes ``aten.alias``,
    whose inverse passes a write straight through to the parent); a read
    replays the step as a constraint node (``spmdtorch.tensor._values``).

    Attributes:
        sharding: the sharding the view's value is constrained to.
        annotated: the step is ``mark_sharding``'s (re-marking with another
            sharding is an error until ``clear_sharding``); False for the
            replicated constraint ``clear_sharding`` leaves.
    """

    __slots__ = ("sharding", "annotated")

    def __init__(self, op: Any, aval: Any, sharding: jax.sharding.Sharding, annotated: bool) -> None:
        super().__init__(op, (), (), None, aval)
        self.sharding = sharding
        self.annotated = annotated

    def __repr__(self) -> str:
        return f"ConstraintStep({self.sharding}, annotated={self.annotated})"
