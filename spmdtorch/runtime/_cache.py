"""The persistent XLA compilation cache (``initialize_cache``)."""

from __future__ import annotations

import os

import jax

from spmdtorch import _checks
from spmdtorch._checks import ArgumentTypeError

# --------------------------------------------------------------------------
# Persistent compilation cache
# --------------------------------------------------------------------------


def initialize_cache(path: str | os.PathLike[str], readonly: bool = False) -> None:
    """Turns on JAX's persistent compilation cache in directory ``path``.

    Compiled XLA executables are stored in ``path`` and looked up there before
    compiling, so a restarted training job skips recompilation. Every program
    is cached, however small or fast to compile (JAX's default skips programs
    that compile in under a second).

    ``readonly=True`` reads existing entries but never adds one: JAX has no
    read-only switch, so this sets the minimum compile time for writing to
    infinity and keeps size-based eviction off (it would write access-time
    files). Use it on every worker but one when several share a cache
    directory. Two limits remain, both JAX's: JAX creates ``path`` if it does
    not exist, and on GPU, XLA's per-fusion autotuning cache (a subdirectory
    of ``path``) is still updated by process 0 (turning that cache off would
    change the cache keys, so no entry written by a writer would ever match).

    The cache applies to programs compiled after this call; programs already
    compiled in this process stay in memory and are not written. Calling it
    again switches to the new settings for later compilations.

    Args:
        path: Cache directory (local path, or a URL that JAX's ``etils.epath``
            support understands, e.g. ``gs://...``).
        readonly: Read entries but never write them.

    Raises:
        ArgumentError: ``path`` is empty or not a path, or ``readonly`` not a bool
            (a ``ValueError``; ``ArgumentTypeError``, also a ``TypeError``, for a wrong type).

    Example:
        >>> import spmdtorch.runtime as xr
        >>> xr.initialize_cache("/tmp/spmdtorch_cache")          # doctest: +SKIP
        >>> xr.initialize_cache("/shared/cache", readonly=True)  # doctest: +SKIP
    """
    path = os.fspath(_checks.check_path(path, "initialize_cache", "path", ArgumentTypeError))
    readonly = _checks.check_bool(readonly, "initialize_cache", "readonly", ArgumentTypeError)

    from jax.experimental.compilation_cache import compilation_cache as cc

    jax.config.update("jax_enable_compilation_cache", True)
    jax.config.update("jax_compilation_cache_dir", path)
    # -1 means "no size threshold, and let no backend override it".
    jax.config.update("jax_persistent_cache_min_entry_size_bytes", -1)
    if readonly:
        jax.config.update("jax_persistent_cache_min_compile_time_secs", float("inf"))
        jax.config.update("jax_compilation_cache_max_size", -1)
    else:
        jax.config.update("jax_persistent_cache_min_compile_time_secs", 0.0)
    # JAX opens its cache once per process; drop it so the settings above
    # (notably a new path) take effect at the next compilation.
    cc.reset_cache()
