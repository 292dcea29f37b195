"""Draw a sharding as a grid of device blocks, like PyTorch/XLA's debugging tools.

PyTorch/XLA's ``torch_xla.distributed.spmd.debugging.visualize_sharding(sharding:
str, use_color=True, scale=1., min_width=9, max_width=80)`` parses an HLO
sharding string, prints a ``rich`` table with one block per tile, labelled with
the devices that hold it, and returns the table; ``visualize_tensor_sharding(t)``
does the same for a tensor's current sharding. The layout follows
``jax.debug.visualize_array_sharding``: a 1-D tensor is one row of blocks, a 2-D
tensor a grid (rows = tiles of dim 0, columns = tiles of dim 1), a replicated
tensor one block naming every device, and a partially replicated tensor
(``last_tile_dim_replicate``) one block per tile naming its replica group.

Differences from PyTorch/XLA, all deliberate:

* Labels read ``"CPU 0,1"`` (the device kind, then the sorted ordinals joined by
  commas, as JAX writes them) for every block, where PyTorch/XLA writes
  ``"CPU 0"`` for a tile but ``"CPU [0, 1]"`` for a replica group. Ordinals and
  tile counts of any size work (PyTorch/XLA's parser reads one digit).
  ``style="torch_xla"`` draws PyTorch/XLA's exact blocks instead (its labels,
  blocks as wide as them, no colours), for text compared with PyTorch/XLA's.
* Blocks holding the same devices get the same background colour when the
  console has colours; without colours the grid has box lines.
* Keyword-only extras: ``shape`` sizes blocks by the rows/columns each tile
  really holds (uneven tiles look uneven); ``device_kind``, ``num_devices``,
  ``console`` and ``print_`` make it usable without a terminal.
* Tensors of rank > 2 raise :class:`VisualizationError` (a ``ValueError``)
  instead of drawing garbage: neither PyTorch/XLA nor JAX draws them.

Example:
    >>> table = visualize_sharding("{devices=[2,2]0,1,2,3}", device_kind="CPU")
    ┌─────────┬─────────┐
    │         │         │
    │  CPU 0  │  CPU 1  │
    │         │         │
    ├─────────┼─────────┤
    │         │         │
    │  CPU 2  │  CPU 3  │
    │         │         │
    └─────────┴─────────┘
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any, cast

import jax
import numpy as np
import rich.align
import rich.box
import rich.console
import rich.padding
import rich.style
import rich.table
import rich.text

from spmdtorch import _checks
from spmdtorch._checks import ArgumentTypeError
from spmdtorch.sharding._hlo_sharding import (
    HloShardingError,
    ParsedHloSharding,
    _hlo_and_assignment,
    _is_single_device,
    _ordinal_map,
    hlo_sharding_string,
    parse_hlo_sharding_string,
)

__all__ = ["VisualizationError", "visualize_sharding", "visualize_array_sharding"]


class VisualizationError(ValueError):
    """The sharding cannot be drawn as a 1-D or 2-D grid (or a drawing option is invalid)."""


class VisualizationTypeError(VisualizationError, ArgumentTypeError):
    """An argument of the wrong type (a ``TypeError`` too, as before it was named)."""


# matplotlib's "tab20" palette: distinct, readable background colours.
_PALETTE = (
    "#1f77b4", "#aec7e8", "#ff7f0e", "#ffbb78", "#2ca02c", "#98df8a", "#d62728",
    "#ff9896", "#9467bd", "#c5b0d5", "#8c564b", "#c49c94", "#e377c2", "#f7b6d2",
    "#7f7f7f", "#c7c7c7", "#bcbd22", "#dbdb8d", "#17becf", "#9edae5",
)  # fmt: skip

# Height of one block (in lines) at scale 1 when all rows are equal.
_BASE_HEIGHT = 3

_JAX_PLATFORM_KIND = {"cpu": "CPU", "gpu": "CUDA", "cuda": "CUDA", "rocm": "ROCM", "tpu": "TPU"}


def _text_color(bg: str) -> str:
    """Black or white, whichever reads better on ``bg`` (``#rrggbb``)."""
    r, g, b = (int(bg[i : i + 2], 16) / 255 for i in (1, 3, 5))
    return "black" if 0.299 * r + 0.587 * g + 0.114 * b > 0.5 else "white"


def _default_device_kind() -> str:
    # PyTorch/XLA labels blocks with PJRT_DEVICE; spmdtorch.runtime.device_type
    # is the same thing (PJRT_DEVICE when set, else the JAX platform).
    from spmdtorch import runtime

    return runtime.device_type()


def _shard_fractions(size: int, count: int) -> list[float]:
    """Fraction of a dimension of ``size`` each of ``count`` tiles holds.

    XLA pads a dimension to a multiple of the tile count: every tile but the
    last ones holds ``ceil(size / count)``; trailing tiles may be short or empty.
    """
    if size <= 0:
        return [1.0 / count] * count
    chunk = math.ceil(size / count)
    return [max(0, min(chunk, size - i * chunk)) / size for i in range(count)]


def _grid(parsed: ParsedHloSharding, replicated_devices: Sequence[int], spec: str) -> np.ndarray:
    """Returns a 2-D object array of device tuples, one per block.

    Raises:
        VisualizationError: The sharding tiles a tensor of rank > 2.
    """
    if parsed.is_replicated:
        cells = [[tuple(replicated_devices)]]
    elif parsed.is_maximal:
        cells = [[parsed.devices]]
    else:
        rank = cast(int, parsed.tensor_rank)  # tiled: neither replicated nor maximal
        if rank > 2:
            raise VisualizationError(
                f"cannot draw sharding {spec!r}: it tiles a rank-{rank} tensor and only "
                "1-D and 2-D tilings can be drawn (as in PyTorch/XLA and "
                "jax.debug.visualize_array_sharding); read the string instead, or "
                "visualize a 2-D view of the tensor"
            )
        grid = parsed.device_grid()
        depth = parsed.tile_dims[-1] if parsed.last_tile_dim_replicate else 1
        # One row of blocks for a 1-D (or 0-D) tensor, a rows x cols grid for 2-D;
        # the trailing axis is each block's replica group.
        tiles = list(parsed.tile_dims[:rank])
        rows, cols = tiles if rank == 2 else [1, tiles[0] if tiles else 1]
        grid = grid.reshape(rows, cols, depth)
        cells = [[tuple(int(d) for d in grid[i, j]) for j in range(cols)] for i in range(rows)]
    out = np.empty((len(cells), len(cells[0])), dtype=object)
    for i, row in enumerate(cells):
        for j, devs in enumerate(row):
            out[i, j] = devs
    return out


def _render(
    grid: np.ndarray,
    shape: Sequence[int] | None,
    tensor_rank: int | None,
    device_kind: str,
    use_color: bool,
    scale: float,
    min_width: int,
    max_width: int,
    spec: str,
) -> rich.table.Table:
    rows, cols = grid.shape
    labels = np.empty(grid.shape, dtype=object)
    for (i, j), devs in np.ndenumerate(grid):
        ids = ",".join(str(d) for d in sorted(devs))
        labels[i, j] = f"{device_kind} {ids}" if device_kind else ids

    # Fractions of the tensor each block row/column covers: even unless a shape
    # says otherwise (then uneven tiles draw uneven).
    row_frac = [1.0 / rows] * rows
    col_frac = [1.0 / cols] * cols
    if shape is not None and tensor_rank is not None:
        if len(shape) != tensor_rank:
            raise VisualizationError(
                f"shape {tuple(shape)} has rank {len(shape)} but sharding {spec!r} tiles a rank-{tensor_rank} tensor"
            )
        if tensor_rank == 2:
            row_frac = _shard_fractions(shape[0], rows)
            col_frac = _shard_fractions(shape[1], cols)
        elif tensor_rank == 1:
            col_frac = _shard_fractions(shape[0], cols)

    # A column is at least as wide as its longest label (+1 space each side) and
    # min_width; beyond that, its share of cols * min_width * scale.
    naturals = [max(len(labels[i, j]) for i in range(rows)) + 2 for j in range(cols)]
    widths = [max(min_width, naturals[j], round(col_frac[j] * cols * min_width * scale)) for j in range(cols)]
    # Too wide for max_width: shrink every column in proportion, but never below
    # its longest label, so labels stay on one line whenever they can.
    budget = max_width - (0 if use_color else cols + 1)
    if sum(widths) > budget:
        total = sum(widths)
        widths = [max(naturals[j], (widths[j] * budget) // total) for j in range(cols)]
    heights = [max(1, round(row_frac[i] * rows * _BASE_HEIGHT * scale)) for i in range(rows)]

    colors: dict[tuple[int, ...], str] = {}
    table = rich.table.Table(
        show_header=False,
        show_lines=not use_color,
        padding=0,
        highlight=False,
        pad_edge=False,
        box=None if use_color else rich.box.SQUARE,
    )
    for _ in range(cols):
        table.add_column(justify="center", vertical="middle", overflow="fold")
    for i in range(rows):
        row = []
        for j in range(cols):
            label = labels[i, j]
            left, extra = divmod(max(widths[j] - len(label), 0), 2)
            top, extra_v = divmod(heights[i] - 1, 2)
            style = rich.style.Style()
            if use_color:
                bg = colors.setdefault(grid[i, j], _PALETTE[len(colors) % len(_PALETTE)])
                style = rich.style.Style(bgcolor=bg, color=_text_color(bg))
            row.append(
                rich.padding.Padding(
                    rich.text.Text(label, no_wrap=False),
                    (top, left + extra, top + extra_v, left),
                    style=style,
                )
            )
        table.add_row(*row)
    # Keep the whole table within max_width; rich folds labels only if even
    # the labels alone do not fit.
    table.width = min(sum(widths) + (0 if use_color else cols + 1), max_width)
    return table


def _check_options(
    func: str,
    shape: Any,
    use_color: Any,
    scale: Any,
    min_width: Any,
    max_width: Any,
    device_kind: Any,
    console: Any,
    print_: Any,
) -> tuple[int, ...] | None:
    """Checks the drawing options on entry; returns ``shape`` as a tuple (or None)."""
    err = VisualizationError
    if not (isinstance(scale, (int, float)) and not isinstance(scale, bool) and scale > 0):
        raise err(f"{func}: scale must be a positive number, got {scale!r}")
    _checks.check_int(min_width, func, "min_width", err, minimum=1)
    if not (_checks.is_int(max_width) and max_width >= min_width):
        raise err(f"{func}: max_width must be an int >= min_width ({min_width}), got {max_width!r}")
    _checks.check_bool(use_color, func, "use_color", VisualizationTypeError)
    _checks.check_bool(print_, func, "print_", VisualizationTypeError)
    if device_kind is not None:
        _checks.check_str(device_kind, func, "device_kind", VisualizationTypeError)
    if console is not None:
        _checks.check_instance(
            console, rich.console.Console, func, "console", VisualizationTypeError, "a rich.console.Console or None"
        )
    if shape is None:
        return None
    return _checks.check_int_sequence(shape, func, "shape", VisualizationError, minimum=0)


def _draw(
    parsed: ParsedHloSharding,
    replicated_devices: Sequence[int],
    spec: str,
    *,
    shape: Sequence[int] | None,
    device_kind: str,
    use_color: bool,
    scale: float,
    min_width: int,
    max_width: int,
    console: rich.console.Console | None,
    print_: bool,
    style: str = "spmdtorch",
) -> rich.table.Table:
    if console is None and print_:
        console = rich.console.Console(width=max_width)
    if console is not None:
        # No colours on a console that cannot show them (a file, a pipe): the
        # box lines are what separates the blocks there.
        use_color = use_color and console.color_system is not None
    grid = _grid(parsed, replicated_devices, spec)
    if style == "torch_xla":
        table = _render_torch_xla(
            grid,
            not (parsed.is_replicated or parsed.is_maximal or parsed.last_tile_dim_replicate),
            device_kind,
            use_color,
        )
    else:
        table = _render(grid, shape, parsed.tensor_rank, device_kind, use_color, scale, min_width, max_width, spec)
    if print_ and console is not None:  # printing: made above if not given
        console.print(table, end="\n\n" if style == "torch_xla" else "\n")
    return table


def _render_torch_xla(grid: np.ndarray, tiles: bool, device_kind: str, use_color: bool) -> rich.table.Table:
    """PyTorch/XLA's drawing: each block its label with one space and one line around it, no colours.

    A label is the device kind, then the one device of a tile (``CPU 4``), or
    the list of a replica group or of a replicated tensor's devices
    (``CPU [0, 1]``), as PyTorch/XLA prints them. Blocks are as wide as their
    labels; without colours the grid has box lines.
    """
    table = rich.table.Table(
        show_header=False,
        show_lines=not use_color,
        padding=0,
        highlight=not use_color,
        pad_edge=False,
        box=None if use_color else rich.box.SQUARE,
    )
    for row in grid:
        cells = []
        for devs in row:
            ids = str(devs[0]) if tiles else str(list(devs))
            label = f"{device_kind} {ids}" if device_kind else ids
            cells.append(
                rich.padding.Padding(
                    rich.align.Align(label, "center", vertical="middle"), (1, 1, 1, 1), style=rich.style.Style()
                )
            )
        table.add_row(*cells)
    return table


def visualize_sharding(
    sharding: str,
    use_color: bool = True,
    scale: float = 1.0,
    min_width: int = 9,
    max_width: int = 80,
    *,
    shape: Sequence[int] | None = None,
    device_kind: str | None = None,
    num_devices: int | None = None,
    console: rich.console.Console | None = None,
    print_: bool = True,
    style: str = "spmdtorch",
) -> rich.table.Table:
    """Draws an HLO sharding string as a grid of device blocks.

    Same positional parameters, printing and return value as PyTorch/XLA's
    ``visualize_sharding``: the table is printed to a console ``max_width``
    columns wide and returned.

    Args:
        sharding: An HLO sharding string (see
            :func:`~spmdtorch.sharding.parse_hlo_sharding_string`),
            e.g. ``'{devices=[2,1,2]0,1,2,3 last_tile_dim_replicate}'``. The
            empty string (PyTorch/XLA's "no sharding") draws as replicated.
        use_color: Colour blocks by device set (only if the console can).
        scale: Grows (>1) or shrinks (<1) blocks.
        min_width: Narrowest block, in characters.
        max_width: Width of the console created for printing, and the widest
            the table may get.
        shape: The tensor's shape; when given, blocks are sized by the part of
            each dimension their tile holds (uneven tiles draw uneven) and its
            rank must match the sharding's.
        device_kind: Label prefix, e.g. ``"TPU"``; ``""`` for bare ordinals.
            Defaults to :func:`spmdtorch.runtime.device_type` (``PJRT_DEVICE``
            or the JAX platform), as PyTorch/XLA uses ``PJRT_DEVICE``.
        num_devices: Device count a ``{replicated}`` block lists; defaults to
            ``jax.device_count()``.
        console: Print here instead of a new ``rich`` console.
        print_: Print the table (the default, like PyTorch/XLA); False only
            builds and returns it.
        style: ``"spmdtorch"`` (the module's drawing) or ``"torch_xla"``:
            PyTorch/XLA's exact blocks (``CPU 4`` for a tile, ``CPU [0, 1]``
            for a replica group, each block as wide as its label plus one
            space a side, no colours; ``scale``, ``min_width`` and ``shape``
            do not size them), as ``torch_xla...debugging`` under
            :mod:`spmdtorch.compat` draws them.

    Returns:
        The ``rich.table.Table``.

    Raises:
        TypeError: ``sharding`` is not a str.
        HloShardingError: ``sharding`` is not a valid sharding string (a
            ``ValueError``).
        VisualizationError: The sharding tiles a tensor of rank > 2, or
            ``shape`` does not match it (a ``ValueError``).
        ValueError: ``scale``/``min_width``/``max_width`` out of range.

    Example:
        >>> t = visualize_sharding("{devices=[1,2,2]0,2,1,3 last_tile_dim_replicate}",
        ...                        device_kind="TPU", use_color=False)
        ┌─────────┬─────────┐
        │         │         │
        │ TPU 0,2 │ TPU 1,3 │
        │         │         │
        └─────────┴─────────┘
    """
    if not isinstance(sharding, str):
        raise VisualizationTypeError(
            f"visualize_sharding: sharding must be an HLO sharding string, got {type(sharding).__name__}"
        )
    shape = _check_options(
        "visualize_sharding", shape, use_color, scale, min_width, max_width, device_kind, console, print_
    )
    try:
        parsed = parse_hlo_sharding_string(sharding if sharding.strip() else "{replicated}")
    except HloShardingError as e:
        raise HloShardingError(f"visualize_sharding: sharding is not an HLO sharding string: {e}") from None
    if num_devices is not None:
        _checks.check_int(num_devices, "visualize_sharding", "num_devices", VisualizationError, minimum=1)
    replicated: Sequence[int] = ()
    if parsed.is_replicated:
        replicated = range(jax.device_count() if num_devices is None else num_devices)
    if style not in ("spmdtorch", "torch_xla"):
        raise VisualizationError(f"visualize_sharding: style must be 'spmdtorch' or 'torch_xla', got {style!r}")
    if device_kind is None:
        device_kind = _default_device_kind()
    return _draw(
        parsed,
        replicated,
        sharding,
        style=style,
        shape=shape,
        device_kind=device_kind,
        use_color=use_color,
        scale=scale,
        min_width=min_width,
        max_width=max_width,
        console=console,
        print_=print_,
    )


def visualize_array_sharding(
    shape: Sequence[int],
    sharding: jax.sharding.Sharding,
    *,
    use_color: bool = True,
    scale: float = 1.0,
    min_width: int = 9,
    max_width: int = 80,
    device_kind: str | None = None,
    device_order: Sequence[Any] | None = None,
    console: rich.console.Console | None = None,
    print_: bool = True,
) -> rich.table.Table:
    """Draws how a JAX sharding splits an array of ``shape`` over devices.

    The sharding is first written as PyTorch/XLA's string
    (:func:`~spmdtorch.sharding.hlo_sharding_string`), so blocks
    are labelled with logical ordinals. Unlike the string, a replicated block
    lists exactly the sharding's devices (a sub-mesh shows only its own).

    Args:
        shape: The array's shape; blocks are sized by the rows/columns they hold.
        sharding: Any ``jax.sharding.Sharding``.
        use_color: As in :func:`visualize_sharding`.
        scale: As in :func:`visualize_sharding`.
        min_width: As in :func:`visualize_sharding`.
        max_width: As in :func:`visualize_sharding`.
        console: As in :func:`visualize_sharding`.
        print_: As in :func:`visualize_sharding`.
        device_kind: Label prefix; defaults to the sharding's platform
            (``"CPU"``, ``"CUDA"``, ``"TPU"``).
        device_order: Devices in ordinal order, as in ``hlo_sharding_string``.

    Returns:
        The ``rich.table.Table``.

    Raises:
        TypeError: ``sharding`` is not a JAX sharding.
        HloShardingError: The sharding does not fit ``shape``'s rank.
        VisualizationError: ``shape`` has rank > 2 and is tiled, or the
            sharding is manual/unreduced (no grid to draw).

    Example:
        >>> import jax, numpy as np
        >>> from jax.sharding import Mesh, NamedSharding, PartitionSpec as P
        >>> mesh = Mesh(np.array(jax.devices()[:2]), ("x",))
        >>> t = visualize_array_sharding((4, 6), NamedSharding(mesh, P(None, "x")),
        ...                              use_color=False)
        ┌─────────┬─────────┐
        │         │         │
        │  CPU 0  │  CPU 1  │
        │         │         │
        └─────────┴─────────┘
    """
    if shape is None:
        raise VisualizationTypeError("visualize_array_sharding: shape must be the array's shape, got None")
    shape = cast(
        tuple[int, ...],  # not None: checked above
        _check_options(
            "visualize_array_sharding", shape, use_color, scale, min_width, max_width, device_kind, console, print_
        ),
    )
    hlo, assignment = _hlo_and_assignment(sharding, len(shape))
    spec = hlo_sharding_string(sharding, len(shape), device_order)
    if hlo.is_manual() or hlo.is_unreduced() or hlo.is_unknown() or hlo.subgroup_types():
        raise VisualizationError(
            f"cannot draw sharding {spec!r}: manual, unreduced or unknown shardings have no tile grid"
        )
    ordinals = sorted(_ordinal_map(assignment, device_order))
    if device_kind is None:
        platform = assignment[0].platform
        device_kind = _JAX_PLATFORM_KIND.get(platform, platform.upper())
    parsed = parse_hlo_sharding_string(spec)
    if _is_single_device(hlo, assignment):
        parsed = ParsedHloSharding((), (ordinals[0],), False)
    return _draw(
        parsed,
        ordinals,
        spec,
        shape=shape,
        device_kind=device_kind,
        use_color=use_color,
        scale=scale,
        min_width=min_width,
        max_width=max_width,
        console=console,
        print_=print_,
    )
