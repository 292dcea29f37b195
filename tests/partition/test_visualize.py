"""visualize_sharding / visualize_array_sharding render the right device blocks."""

import io
import itertools
import re

import numpy as np
import pytest
import rich.table
from jax.sharding import AxisType, Mesh, NamedSharding
from jax.sharding import PartitionSpec as P
from rich.console import Console

from spmdtorch.sharding import (
    HloShardingError,
    VisualizationError,
    visualize_array_sharding,
    visualize_sharding,
)


def recording_console(width=80, color=False):
    if color:
        return Console(
            record=True, width=width, file=io.StringIO(), force_terminal=True,
            color_system="truecolor",
        )  # fmt: skip
    return Console(record=True, width=width, file=io.StringIO(), color_system=None)


def grid_of(text):
    """Rows of labelled cells from a boxed table: [['CPU 0', 'CPU 1'], ...]."""
    rows = []
    for line in text.splitlines():
        if "│" not in line:
            continue
        cells = [c.strip() for c in line.strip().strip("│").split("│")]
        if any(cells):
            rows.append(cells)
    return rows


def draw(spec, width=80, **kwargs):
    console = recording_console(width)
    kwargs.setdefault("device_kind", "CPU")
    table = visualize_sharding(spec, console=console, **kwargs)
    assert isinstance(table, rich.table.Table)
    text = console.export_text()
    assert all(len(line) <= width for line in text.splitlines())
    return text


def test_2d_tiled_grid():
    text = draw("{devices=[2,4]0,1,2,3,4,5,6,7}")
    assert grid_of(text) == [
        ["CPU 0", "CPU 1", "CPU 2", "CPU 3"],
        ["CPU 4", "CPU 5", "CPU 6", "CPU 7"],
    ]


def test_permuted_2d_grid():
    text = draw("{devices=[4,2]0,4,1,5,2,6,3,7}")
    assert grid_of(text) == [
        ["CPU 0", "CPU 4"], ["CPU 1", "CPU 5"], ["CPU 2", "CPU 6"], ["CPU 3", "CPU 7"]
    ]  # fmt: skip


def test_row_and_column_sharding():
    assert grid_of(draw("{devices=[4,1]0,1,2,3}")) == [["CPU 0"], ["CPU 1"], ["CPU 2"], ["CPU 3"]]
    assert grid_of(draw("{devices=[1,4]0,1,2,3}")) == [["CPU 0", "CPU 1", "CPU 2", "CPU 3"]]


def test_1d_tensor_is_one_row():
    text = draw("{devices=[8]0,1,2,3,4,5,6,7}")
    assert grid_of(text) == [[f"CPU {i}" for i in range(8)]]


def test_partial_replication_groups():
    # Rows over x of a (2,4) mesh, replicas over y.
    text = draw("{devices=[2,1,4]0,1,2,3,4,5,6,7 last_tile_dim_replicate}")
    assert grid_of(text) == [["CPU 0,1,2,3"], ["CPU 4,5,6,7"]]
    # Columns over model of a (4,2) mesh, replicas over data; labels sorted.
    text = draw("{devices=[1,2,4]0,2,6,4,1,3,5,7 last_tile_dim_replicate}")
    assert grid_of(text) == [["CPU 0,2,4,6", "CPU 1,3,5,7"]]


def test_replicated_lists_all_devices():
    assert grid_of(draw("{replicated}", num_devices=8)) == [["CPU 0,1,2,3,4,5,6,7"]]
    assert grid_of(draw("{replicated}")) == [["CPU 0,1,2,3,4,5,6,7"]]  # jax.device_count()
    # PyTorch/XLA returns '' for an unsharded tensor; it draws as replicated.
    assert grid_of(draw("", num_devices=2)) == [["CPU 0,1"]]


def test_maximal():
    assert grid_of(draw("{maximal device=5}")) == [["CPU 5"]]


def test_sixteen_devices_two_digit_ids():
    spec = "{devices=[4,4]" + ",".join(str(i) for i in range(16)) + "}"
    text = draw(spec)
    assert grid_of(text) == [[f"CPU {4 * r + c}" for c in range(4)] for r in range(4)]
    assert re.search(r"│\s+CPU 10\s+│\s+CPU 11\s+│", text)


def test_wide_partial_with_two_digit_ids():
    spec = "{devices=[2,8]" + ",".join(str(i) for i in range(16)) + " last_tile_dim_replicate}"
    text = draw(spec, width=60)
    # Rank-1 tensor: one row of two blocks, each a group of 8 replicas.
    assert grid_of(text) == [["CPU 0,1,2,3,4,5,6,7", "CPU 8,9,10,11,12,13,14,15"]]


def test_bare_ordinals_without_device_kind():
    assert grid_of(draw("{devices=[1,2]1,0}", device_kind="")) == [["1", "0"]]


def test_default_device_kind_follows_pjrt_device(monkeypatch):
    monkeypatch.setenv("PJRT_DEVICE", "CPU")
    console = recording_console()
    visualize_sharding("{devices=[2]0,1}", console=console)
    assert grid_of(console.export_text()) == [["CPU 0", "CPU 1"]]


def test_many_columns_fit_max_width():
    # 8 columns of min_width 9 plus borders is 81 > 80: columns shrink, labels stay whole.
    text = draw("{devices=[1,8]0,1,2,3,4,5,6,7}", width=80)
    assert grid_of(text) == [[f"CPU {i}" for i in range(8)]]


def test_shape_sizes_uneven_tiles():
    # 10 rows over 4 tiles: XLA pads to 3,3,3,1 rows, so the last block is shortest.
    text = draw("{devices=[4,1]0,1,2,3}", shape=(10, 3))
    lines = text.splitlines()
    separators = [i for i, line in enumerate(lines) if line.startswith(("┌", "├", "└"))]
    heights = [b - a - 1 for a, b in itertools.pairwise(separators)]
    assert heights[0] == heights[1] == heights[2] > heights[3] >= 1
    with pytest.raises(VisualizationError, match="rank 3"):
        draw("{devices=[4,1]0,1,2,3}", shape=(10, 3, 2))


def test_returns_table_without_printing():
    console = recording_console()
    table = visualize_sharding("{devices=[2]0,1}", device_kind="CPU", console=console, print_=False)
    assert console.export_text() == ""
    console.print(table)
    assert grid_of(console.export_text()) == [["CPU 0", "CPU 1"]]


def test_prints_by_default_like_pytorch_xla(capsys):
    visualize_sharding("{devices=[2]0,1}", device_kind="TPU", use_color=False)
    assert "TPU 0" in capsys.readouterr().out


def test_color_blocks_by_device_set():
    console = recording_console(color=True)
    visualize_sharding(
        "{devices=[2,2,2]0,1,2,3,4,5,6,7 last_tile_dim_replicate}",
        device_kind="CPU",
        console=console,
    )
    text = console.export_text(clear=False)
    for label in ("CPU 0,1", "CPU 2,3", "CPU 4,5", "CPU 6,7"):
        assert label in text
    assert "│" not in text  # coloured blocks, no box lines
    styled = console.export_text(styles=True)
    assert styled.count("48;2;") > 4  # truecolor backgrounds


def test_rank_3_tiling_is_refused():
    with pytest.raises(VisualizationError, match="rank-3 tensor.*1-D and 2-D"):
        draw("{devices=[2,2,2]0,1,2,3,4,5,6,7}")
    with pytest.raises(ValueError):  # VisualizationError is a ValueError
        draw("{devices=[2,1,1,4]0,1,2,3,4,5,6,7 last_tile_dim_replicate}")


def test_bad_string_raises_value_error():
    with pytest.raises(HloShardingError, match="expected"):
        draw("{devices=[2,2]0,1,2}x")
    with pytest.raises(TypeError):
        visualize_sharding(None)
    with pytest.raises(ValueError, match="num_devices"):
        draw("{replicated}", num_devices=0)
    with pytest.raises(ValueError, match="scale"):
        draw("{replicated}", scale=0)


# ------------------------------------------------------- from JAX shardings


def array_grid(shape, sharding, **kwargs):
    console = recording_console()
    visualize_array_sharding(shape, sharding, console=console, **kwargs)
    return grid_of(console.export_text())


def test_array_sharding_2x4(devices8):
    mesh = Mesh(np.array(devices8).reshape(2, 4), ("x", "y"))
    assert array_grid((8, 8), NamedSharding(mesh, P("x", "y"))) == [
        ["CPU 0", "CPU 1", "CPU 2", "CPU 3"],
        ["CPU 4", "CPU 5", "CPU 6", "CPU 7"],
    ]
    assert array_grid((8, 8), NamedSharding(mesh, P(None, "y"))) == [["CPU 0,4", "CPU 1,5", "CPU 2,6", "CPU 3,7"]]
    assert array_grid((8,), NamedSharding(mesh, P("x"))) == [["CPU 0,1,2,3", "CPU 4,5,6,7"]]
    assert array_grid((8, 8), NamedSharding(mesh, P())) == [["CPU 0,1,2,3,4,5,6,7"]]


def test_array_sharding_4x2_and_permuted(devices8):
    mesh = Mesh(np.array(devices8).reshape(4, 2), ("data", "model"))
    assert array_grid((4, 4), NamedSharding(mesh, P("data", None))) == [
        ["CPU 0,1"], ["CPU 2,3"], ["CPU 4,5"], ["CPU 6,7"]
    ]  # fmt: skip
    rev = Mesh(np.array(devices8[::-1]).reshape(4, 2), ("data", "model"))
    assert array_grid((4, 4), NamedSharding(rev, P("data", "model"))) == [
        ["CPU 7", "CPU 6"], ["CPU 5", "CPU 4"], ["CPU 3", "CPU 2"], ["CPU 1", "CPU 0"]
    ]  # fmt: skip


def test_array_sharding_sub_mesh_and_single_device(devices8):
    sub = Mesh(np.array(devices8[4:]).reshape(2, 2), ("x", "y"))
    # Replicated over a sub-mesh shows only its own devices.
    assert array_grid((4, 4), NamedSharding(sub, P())) == [["CPU 4,5,6,7"]]
    one = Mesh(np.array(devices8[2:3]), ("x",))
    assert array_grid((4, 4), NamedSharding(one, P("x"))) == [["CPU 2"]]


def test_array_sharding_rank_3(devices8):
    mesh = Mesh(np.array(devices8).reshape(2, 4), ("x", "y"))
    with pytest.raises(VisualizationError, match="rank-3"):
        array_grid((2, 4, 8), NamedSharding(mesh, P("x", "y")))
    # Replicated needs no grid, whatever the rank.
    assert array_grid((2, 4, 8), NamedSharding(mesh, P())) == [["CPU 0,1,2,3,4,5,6,7"]]


def test_array_sharding_manual_refused(devices8):
    mesh = Mesh(np.array(devices8).reshape(2, 4), ("x", "y"), axis_types=(AxisType.Manual,) * 2)
    with pytest.raises(VisualizationError, match="manual"):
        array_grid((4, 4), NamedSharding(mesh, P()))
