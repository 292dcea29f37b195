"""The split of the SPMD API: spmdtorch.sharding, spmdtorch.fsdp, spmdtorch.plan and the re-export.

``spmdtorch.partition`` keeps every name it exported before the split, as the
same objects the packages export; no module reaches into another
package's private modules (``spmdtorch.<package>._name``), for every package;
and only ``tensor`` and ``lazy`` touch a tensor's storage and view chain.
"""

import ast
import pathlib

import spmdtorch
import spmdtorch.fsdp
import spmdtorch.partition
import spmdtorch.plan
import spmdtorch.sharding

# spmdtorch.partition.__all__ before the split (issue 16), and names added since: user code imports these.
_PARTITION_NAMES = {
    "CPU_REMAT_XLA_FLAG", "CompiledMemory", "FSDPv2", "FSDPv2Error", "FSDPv2MeshError", "FSDPv2OutputError",
    "FSDPv2WrapError", "ManualRegionError", "MaterializeError", "MemoryBudgetError", "MemoryPlan",
    "MemoryPlanError", "MixedPrecision", "MixedPrecisionError", "PlanError", "ShardingError", "ShardingPlan",
    "ShardingSpec", "ShardingType", "SpmdFullyShardedDataParallel", "TensorMemory", "XLAShard", "all_gather",
    "all_reduce", "axis_index", "checkpoint_module", "clear_sharding", "compiled_memory", "cpu_keeps_barriers",
    "disable_manual_sharding", "enable_manual_sharding", "get_sharding_spec", "hlo_sharding_string",
    "lambda_auto_wrap_policy", "load_local_shards_", "load_plain_state_dict", "local_shards", "mark_sharding",
    "mark_sharding_with_gradients", "materialize", "memory_plan", "optimization_barrier",
    "parse_hlo_sharding_string", "plain_state_dict", "plan_sharding", "ppermute", "recursive_wrap",
    "reduce_scatter", "shard_map", "sharding_type", "size_based_auto_wrap_policy", "tensor_sharding",
    "transformer_auto_wrap_policy", "visualize_array_sharding", "visualize_sharding", "visualize_tensor_sharding",
    # added since: gradient accumulation with one reduction per step (issue 43, item 4)
    "AccumulateGradientsError", "accumulate_gradients",
}  # fmt: skip

_PACKAGES = (spmdtorch.sharding, spmdtorch.fsdp, spmdtorch.plan)


def test_partition_reexports_every_name_it_had():
    assert set(spmdtorch.partition.__all__) == _PARTITION_NAMES
    for name in _PARTITION_NAMES:
        homes = [pkg for pkg in _PACKAGES if name in pkg.__all__]
        assert len(homes) == 1, f"{name} is exported by {[p.__name__ for p in homes]}, expected exactly one package"
        assert getattr(spmdtorch.partition, name) is getattr(homes[0], name), name


def test_package_all_names_exist():
    for pkg in (*_PACKAGES, spmdtorch.partition):
        missing = [n for n in pkg.__all__ if not hasattr(pkg, n)]
        assert not missing, f"{pkg.__name__}.__all__ names missing attributes: {missing}"


def _private_imports(path: pathlib.Path):
    """(line, imported module) for each import of a ``spmdtorch.<pkg>._name`` module or name."""
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            targets = [node.module] + [f"{node.module}.{a.name}" for a in node.names]
        elif isinstance(node, ast.Import):
            targets = [a.name for a in node.names]
        else:
            continue
        for target in targets:
            parts = target.split(".")
            if len(parts) >= 3 and parts[0] == "spmdtorch" and parts[2].startswith("_") and parts[2] != "__init__":
                yield node.lineno, parts[1], target


def test_no_module_imports_another_packages_private_modules():
    root = pathlib.Path(spmdtorch.__file__).parent
    offences = []
    for path in root.rglob("*.py"):
        rel = path.relative_to(root).parts
        own = rel[0] if len(rel) > 1 else None  # the package this file belongs to
        for line, pkg, target in _private_imports(path):
            if pkg != own:  # every package: its private modules are its own
                offences.append(f"{path.relative_to(root)}:{line} imports {target}")
    assert not offences, "import the package's public/declared API instead:\n" + "\n".join(offences)


# The tensor's data model is the tensor and lazy packages' own: others use
# spmdtorch.tensor.storage_of / view_chain / set_view_chain.
_DATA_MODEL_ATTRS = {"_st", "_chain"}
_DATA_MODEL_OWNERS = {"tensor", "lazy"}


def test_no_package_reads_a_tensors_storage_or_view_chain_directly():
    root = pathlib.Path(spmdtorch.__file__).parent
    offences = []
    for path in sorted(root.rglob("*.py")):
        rel = path.relative_to(root).parts
        if len(rel) > 1 and rel[0] in _DATA_MODEL_OWNERS:
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Attribute) and node.attr in _DATA_MODEL_ATTRS:
                offences.append(f"{path.relative_to(root)}:{node.lineno} .{node.attr}")
    assert not offences, "use spmdtorch.tensor.storage_of / view_chain / set_view_chain:\n" + "\n".join(offences)
