"""spmdtorch._jax_private: every private JAX name spmdtorch uses, in one module, each checked.

The first test is the loud one: on a JAX that moved a name it fails listing
it. The rest check that no other module reaches ``jax._src`` directly, that a
missing name is reported by name, and that each accessor answers what the
private (or public) JAX object does.
"""

from __future__ import annotations

import ast
import pathlib

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from spmdtorch import _jax_private

PACKAGE = pathlib.Path(__file__).resolve().parents[1] / "spmdtorch"


def test_every_private_jax_name_spmdtorch_uses_is_there():
    gone = _jax_private.missing()
    assert gone == [], (
        f"jax {jax.__version__} lacks private names spmdtorch uses: {gone}; "
        "port spmdtorch/_jax_private.py (its PRIVATE_NAMES say which spmdtorch code needs each)"
    )
    for entry in _jax_private.PRIVATE_NAMES:  # resolve() reaches each too
        assert _jax_private.resolve(entry.module, entry.attr) is not None


def _private_imports(path: pathlib.Path) -> list[str]:
    tree = ast.parse(path.read_text(), str(path))
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("jax._src"):
            found.append(f"{path.relative_to(PACKAGE.parent)}:{node.lineno} from {node.module}")
        elif isinstance(node, ast.Import):
            found += [
                f"{path.relative_to(PACKAGE.parent)}:{node.lineno} import {a.name}"
                for a in node.names
                if a.name.startswith("jax._src")
            ]
    return found


def test_no_other_module_imports_jax_src():
    offenders = [
        hit
        for path in sorted(PACKAGE.rglob("*.py"))
        if path.name != "_jax_private.py"
        for hit in _private_imports(path)
    ]
    assert offenders == [], f"import jax._src only in spmdtorch/_jax_private.py: {offenders}"
    # The check itself sees an import when there is one.
    probe = PACKAGE.parent / "tests" / "_jax_private_probe.py"
    try:
        probe.write_text("from jax._src import xla_bridge\n")
        assert _private_imports(probe) == ["tests/_jax_private_probe.py:1 from jax._src"]
    finally:
        probe.unlink()


def test_a_moved_name_is_reported_by_name(monkeypatch):
    from jax._src import xla_bridge

    monkeypatch.delattr(xla_bridge, "backends_are_initialized")
    assert _jax_private.missing() == ["jax._src.xla_bridge.backends_are_initialized"]
    with pytest.raises(_jax_private.JaxPrivateNameError) as info:
        _jax_private.resolve("jax._src.xla_bridge", "backends_are_initialized")
    message = str(info.value)
    assert f"jax {jax.__version__} has no jax._src.xla_bridge.backends_are_initialized" in message
    assert "runtime._platform._apply_pjrt_device_env" in message
    # The import-time caller degrades instead of failing the import.
    assert _jax_private.backends_initialized() is False


def test_a_name_not_listed_is_refused():
    with pytest.raises(KeyError, match="not in spmdtorch._jax_private.PRIVATE_NAMES"):
        _jax_private.resolve("jax._src.xla_bridge", "_backends")


def test_backends_initialized_follows_jax(devices8):
    from jax._src import xla_bridge

    assert _jax_private.backends_initialized() is True  # devices8 started the CPU backend
    assert xla_bridge.backends_are_initialized() is True


def test_distributed_accessors_single_process():
    assert _jax_private.distributed_is_initialized() is False
    assert _jax_private.distributed_client() is None
    assert _jax_private.distributed_coordinator_address() is None


def test_distributed_falls_back_to_the_client_without_the_public_query(monkeypatch):
    monkeypatch.delattr(jax.distributed, "is_initialized")
    assert _jax_private.distributed_is_initialized() is False
    from jax._src import distributed

    monkeypatch.setattr(distributed.global_state, "client", object())
    assert _jax_private.distributed_is_initialized() is True


def test_num_tpu_chips_on_a_cpu_host(monkeypatch):
    assert _jax_private.num_tpu_chips() == 0
    from jax._src import hardware_utils

    monkeypatch.setattr(hardware_utils, "num_available_tpu_chips_and_device_id", lambda: (4, [0, 1, 2, 3]))
    assert _jax_private.num_tpu_chips() == 4

    def unreadable():
        raise OSError("sysfs")

    monkeypatch.setattr(hardware_utils, "num_available_tpu_chips_and_device_id", unreadable)
    assert _jax_private.num_tpu_chips() == 0


def test_convert_element_type_makes_weak_scalars():
    # A weak-typed f32 scalar takes the other operand's dtype, as a Python float does; a strong one promotes.
    half = jnp.ones(3, jnp.bfloat16)
    weak = _jax_private.convert_element_type(np.float32(2.5), np.dtype(np.float32), weak_type=True)
    strong = _jax_private.convert_element_type(np.float32(2.5), np.dtype(np.float32), weak_type=False)
    assert (half * weak).dtype == (half * 2.5).dtype == jnp.bfloat16
    assert (half * strong).dtype == jnp.float32
    np.testing.assert_array_equal(np.asarray(half * weak, np.float32), np.full(3, 2.5, np.float32))
    from spmdtorch.lazy import executor

    assert executor._convert_element_type is _jax_private.convert_element_type


def test_pallas_interpret_mode_sets_and_restores_jax_state():
    state = _jax_private.resolve("jax._src.config", "pallas_tpu_interpret_mode_context_manager")
    before = state.value
    with _jax_private.pallas_interpret_mode():
        assert state.value is True
    assert state.value == before


def test_pallas_interpret_mode_private_fallback(monkeypatch):
    from jax.experimental.pallas import tpu as pltpu

    monkeypatch.delattr(pltpu, "force_tpu_interpret_mode")
    state = _jax_private.resolve("jax._src.config", "pallas_tpu_interpret_mode_context_manager")
    before = state.value
    with _jax_private.pallas_interpret_mode():
        assert state.value is True
    assert state.value == before


def test_manual_ops_check_their_private_name_here(monkeypatch):
    from spmdtorch.ops import manual

    manual.check_private_jax()
    # The base class (a C++ type) keeps its own; None stands in for a JAX without the method.
    monkeypatch.setattr(jax.sharding.NamedSharding, "_to_xla_hlo_sharding", None)
    assert _jax_private.missing() == ["jax.sharding.NamedSharding._to_xla_hlo_sharding"]
    with pytest.raises(_jax_private.JaxPrivateNameError, match=r"NamedSharding\._to_xla_hlo_sharding.*ops\.manual"):
        manual.check_private_jax()
