"""The ``spmdtorch.compile`` contract: no tensor value may steer Python while tracing."""

from __future__ import annotations

__all__ = ["CompileContractError", "TraceState", "tracing", "check_not_tracing"]


class CompileContractError(RuntimeError):
    """A compiled function broke the ``spmdtorch.compile`` contract."""


class TraceState:
    """Global trace state (spmdtorch traces one function at a time)."""

    active = False
    created: list = []
    replaced: dict = {}
    optimizers: dict = {}
    modules: dict = {}  # id(module) -> (module, its plain attributes when first called), while tracing


def tracing() -> bool:
    """True while ``spmdtorch.compile`` is tracing a function body."""
    return TraceState.active


def check_not_tracing(what: str) -> None:
    """Raise ``CompileContractError`` when ``what`` happens during a trace."""
    if TraceState.active:
        raise CompileContractError(
            f"spmdtorch.compile: the compiled function {what}. Like jax.jit, its Python "
            "control flow must not depend on tensor values: move .item()/.cpu()/print()/"
            "bool(), data-dependent ops (nonzero, boolean masks) and spmdtorch.sync() out "
            "of the compiled function, or run it in lazy mode."
        )
