"""``parallelize_llama``: torchtitan's Llama recipe (TP + sequence parallel + loss parallel, AC, FSDP2) on GSPMD.

The structure follows torchtitan's ``parallelize_llama``: tensor parallelism
over the mesh's ``tp`` dim first (the embedding row-wise with a
sequence-sharded output, the final norm ``SequenceParallel``, the output head
column-wise, with its vocabulary-sharded logits kept as a DTensor for
``loss_parallel``; per decoder layer the norms ``SequenceParallel``, the
attention and feed-forward inputs gathered from the sequence shards, the
q/k/v and gate/up projections column-wise, the output and down projections
row-wise back to sequence shards), then activation checkpointing of every
decoder layer, then FSDP2's ``fully_shard`` per layer and on the root over
the ``dp`` dim. Here every style is an annotation and XLA places the
collectives (docs/dtensor.md).

Two model families are known, by their module names (:data:`FAMILIES`):
spmdtorch's own ``spmdtorch.models.LlamaForCausalLM`` and transformers'
``LlamaForCausalLM`` (also Mistral/Qwen2-style models with the same names).
"""

from __future__ import annotations

import dataclasses
from typing import Any, cast

from torch import nn
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.tensor.parallel import (
    ColwiseParallel,
    ParallelStyle,
    PrepareModuleInput,
    RowwiseParallel,
    SequenceParallel,
)
from torch.distributed.tensor.placement_types import Replicate, Shard

from spmdtorch import _checks, fsdp
from spmdtorch.dtensor._fsdp import fully_shard
from spmdtorch.dtensor._mesh import as_xla_mesh
from spmdtorch.dtensor._module import parallelize_module
from spmdtorch.dtensor.errors import DTensorError

__all__ = ["FAMILIES", "LlamaFamily", "UnknownModelFamilyError", "detect_llama_family", "parallelize_llama"]


class UnknownModelFamilyError(DTensorError):
    """``parallelize_llama`` got a model whose module names match none of the known Llama families."""


@dataclasses.dataclass(frozen=True)
class LlamaFamily:
    """Where a Llama-style model keeps the modules torchtitan's plan names (paths relative to the model/layer).

    Attributes:
        name: the family's name, as errors list it.
        embed, layers, norm, output: the token embedding, the decoder layer
            list, the final norm and the output head, relative to the model.
        attention_norm, attention, ffn_norm, feed_forward: per decoder layer.
        wq, wk, wv, wo: the attention projections, relative to ``attention``.
        w1, w3, w2: gate, up and down projections, relative to ``feed_forward``.
        attention_input: the keyword the layer passes the attention's hidden
            states by, or None when it is the first positional argument.
        attention_args: how many positional arguments the attention takes
            (the hidden states first), when ``attention_input`` is None.
    """

    name: str
    embed: str
    layers: str
    norm: str
    output: str
    attention_norm: str
    attention: str
    ffn_norm: str
    feed_forward: str
    wq: str
    wk: str
    wv: str
    wo: str
    w1: str
    w3: str
    w2: str
    attention_input: str | None = None
    attention_args: int = 1

    def required(self) -> tuple[tuple[str, ...], tuple[str, ...]]:
        """(model paths, layer paths) that must exist for a model to be of this family."""
        layer = (
            self.attention_norm,
            self.ffn_norm,
            *(f"{self.attention}.{n}" for n in (self.wq, self.wk, self.wv, self.wo)),
            *(f"{self.feed_forward}.{n}" for n in (self.w1, self.w3, self.w2)),
        )
        return (self.embed, self.layers, self.norm, self.output), layer


#: The known families, tried in order.
FAMILIES: tuple[LlamaFamily, ...] = (
    LlamaFamily(
        name="spmdtorch (spmdtorch.models.LlamaForCausalLM)",
        embed="tok_embeddings",
        layers="layers",
        norm="norm",
        output="output",
        attention_norm="attention_norm",
        attention="attention",
        ffn_norm="ffn_norm",
        feed_forward="feed_forward",
        wq="wq",
        wk="wk",
        wv="wv",
        wo="wo",
        w1="w1",
        w3="w3",
        w2="w2",
        # DecoderLayer calls attention(x, cos, sin).
        attention_args=3,
    ),
    LlamaFamily(
        name="transformers (LlamaForCausalLM and models with its module names)",
        embed="model.embed_tokens",
        layers="model.layers",
        norm="model.norm",
        output="lm_head",
        attention_norm="input_layernorm",
        attention="self_attn",
        ffn_norm="post_attention_layernorm",
        feed_forward="mlp",
        wq="q_proj",
        wk="k_proj",
        wv="v_proj",
        wo="o_proj",
        w1="gate_proj",
        w3="up_proj",
        w2="down_proj",
        # LlamaDecoderLayer calls self_attn(hidden_states=..., position_embeddings=..., ...).
        attention_input="hidden_states",
    ),
)


def _has(module: nn.Module, path: str) -> bool:
    try:
        module.get_submodule(path)
    except AttributeError:
        return False
    return True


def detect_llama_family(model: nn.Module) -> LlamaFamily:
    """The entry of :data:`FAMILIES` whose module names ``model`` has.

    Args:
        model: a Llama-style causal LM.

    Returns:
        its :class:`LlamaFamily`.

    Raises:
        UnknownModelFamilyError: no family matches; the message lists them and
            the names each expects.
    """
    for fam in FAMILIES:
        top, per_layer = fam.required()
        if not all(_has(model, p) for p in top):
            continue
        layers = model.get_submodule(fam.layers)
        if isinstance(layers, nn.ModuleList) and len(layers) and all(_has(layers[0], p) for p in per_layer):
            return fam
    known = "; ".join(f"{f.name}: {', '.join(f.required()[0])}, layer {', '.join(f.required()[1])}" for f in FAMILIES)
    raise UnknownModelFamilyError(
        f"parallelize_llama: model ({type(model).__name__}) has the module names of no known Llama family. "
        f"Known families and the names they need: {known}. Write the plan with parallelize_module and "
        "fully_shard for other models"
    )


def _layers(model: nn.Module, fam: LlamaFamily) -> nn.ModuleList:
    layers = model.get_submodule(fam.layers)
    # detect_llama_family checked the type; the cast is for mypy (get_submodule returns a Module).
    return cast(nn.ModuleList, layers)


def _check_mesh(mesh: Any, dp: str, tp: str) -> DeviceMesh:
    m = as_xla_mesh(mesh, "parallelize_llama(mesh)")
    names = tuple(m.mesh_dim_names or ())
    if m.ndim != 2 or set(names) != {dp, tp}:
        raise DTensorError(
            f"parallelize_llama: mesh must be 2-D with dims named dp_dim={dp!r} and tp_dim={tp!r}, got {m.ndim} "
            f"dims {names}; build it with init_device_mesh('xla', (dp, tp), mesh_dim_names=({dp!r}, {tp!r})) "
            "(a size may be 1), or pass its dim names as dp_dim / tp_dim"
        )
    return m


def _tensor_parallel(model: nn.Module, fam: LlamaFamily, tp_mesh: DeviceMesh, loss_parallel: bool) -> None:
    # The root: the embedding's output enters the first layer sequence-sharded; the head's input comes from the
    # sequence-parallel norm; its logits stay vocabulary-sharded DTensors when the loss is computed in parallel.
    root: dict[str, ParallelStyle] = {
        fam.embed: RowwiseParallel(input_layouts=Replicate(), output_layouts=Shard(1)),
        fam.norm: SequenceParallel(),
        fam.output: ColwiseParallel(
            input_layouts=Shard(1),
            output_layouts=Shard(-1) if loss_parallel else Replicate(),
            use_local_output=not loss_parallel,
        ),
    }
    parallelize_module(model, tp_mesh, root)
    if fam.attention_input is None:
        attention_in: ParallelStyle = PrepareModuleInput(
            input_layouts=(Shard(1),) + (None,) * (fam.attention_args - 1),
            desired_input_layouts=(Replicate(),) + (None,) * (fam.attention_args - 1),
        )
    else:
        attention_in = PrepareModuleInput(
            input_kwarg_layouts={fam.attention_input: Shard(1)},
            desired_input_kwarg_layouts={fam.attention_input: Replicate()},
        )
    for layer in _layers(model, fam):
        a, f = fam.attention, fam.feed_forward
        plan: dict[str, ParallelStyle] = {
            fam.attention_norm: SequenceParallel(),
            a: attention_in,
            f"{a}.{fam.wq}": ColwiseParallel(),
            f"{a}.{fam.wk}": ColwiseParallel(),
            f"{a}.{fam.wv}": ColwiseParallel(),
            f"{a}.{fam.wo}": RowwiseParallel(output_layouts=Shard(1)),
            fam.ffn_norm: SequenceParallel(),
            f: PrepareModuleInput(input_layouts=(Shard(1),), desired_input_layouts=(Replicate(),)),
            f"{f}.{fam.w1}": ColwiseParallel(),
            f"{f}.{fam.w3}": ColwiseParallel(),
            f"{f}.{fam.w2}": RowwiseParallel(output_layouts=Shard(1)),
        }
        parallelize_module(layer, tp_mesh, plan)


def parallelize_llama(
    model: nn.Module,
    mesh: DeviceMesh,
    *,
    loss_parallel: bool = True,
    activation_checkpoint: bool = True,
    dp_dim: str = "dp",
    tp_dim: str = "tp",
) -> nn.Module:
    """torchtitan's FSDP + TP recipe for a Llama-style causal LM on a 2-D (dp, tp) xla mesh.

    In torchtitan's order: tensor and sequence parallelism over ``mesh[tp_dim]``
    (skipped when it has size 1), then activation checkpointing of each
    decoder layer (:func:`spmdtorch.fsdp.checkpoint_module`, which recomputes
    the layer, FSDP's parameter gathers included, in backward), then
    :func:`fully_shard` per decoder layer and on the root over
    ``mesh[dp_dim]``. Feed the model the global batch, sharded over
    ``dp_dim`` (``mark_sharding`` / ``distribute_tensor``) or not.

    With ``loss_parallel`` the model returns its logits as an ``XlaDTensor``
    sharded on the vocabulary (``Shard(-1)`` over ``tp``): compute the
    cross-entropy inside ``torch.distributed.tensor.parallel.loss_parallel()``,
    as torchtitan does; without it the logits are a plain (replicated) tensor.

    Args:
        model: spmdtorch's ``LlamaForCausalLM`` or transformers' (see
            :data:`FAMILIES`), on the CPU or on "xla"; changed in place.
        mesh: a 2-D xla ``DeviceMesh`` with dims ``dp_dim`` and ``tp_dim``
            (:func:`spmdtorch.dtensor.init_device_mesh`).
        loss_parallel: keep the logits vocabulary-sharded for ``loss_parallel()``.
        activation_checkpoint: recompute each decoder layer in backward.
        dp_dim: the data-parallel (FSDP) dim's name.
        tp_dim: the tensor-parallel dim's name.

    Returns:
        ``model`` (an :class:`~spmdtorch.dtensor.XlaFSDPModule`).

    Raises:
        UnknownModelFamilyError: ``model`` matches no known family.
        DTensorError: ``mesh`` is not 2-D with those names, the model ties its
            output head to its embedding (the two have different TP plans), or
            another argument has the wrong type.

    Example:
        >>> import torch
        >>> from spmdtorch.dtensor import init_device_mesh, parallelize_llama
        >>> from spmdtorch.models import LlamaConfig, LlamaForCausalLM
        >>> mesh = init_device_mesh("xla", (2, 4), mesh_dim_names=("dp", "tp"))
        >>> model = parallelize_llama(LlamaForCausalLM(LlamaConfig()), mesh)
        >>> model.layers[0].attention.wq.weight.placements
        (Shard(dim=0), Shard(dim=0))
    """
    func = "parallelize_llama"
    _checks.check_bool(loss_parallel, func, "loss_parallel", DTensorError)
    _checks.check_bool(activation_checkpoint, func, "activation_checkpoint", DTensorError)
    _checks.check_str(dp_dim, func, "dp_dim", DTensorError, nonempty=True)
    _checks.check_str(tp_dim, func, "tp_dim", DTensorError, nonempty=True)
    if not isinstance(model, nn.Module):
        _checks.fail(DTensorError, func, "model", "an nn.Module (a Llama-style causal LM)", model)
    m = _check_mesh(mesh, dp_dim, tp_dim)
    fam = detect_llama_family(model)
    embed, output = model.get_submodule(fam.embed), model.get_submodule(fam.output)
    if getattr(embed, "weight", None) is not None and getattr(output, "weight", None) is embed.weight:
        raise DTensorError(
            f"parallelize_llama: the model's {fam.output}.weight is its {fam.embed}.weight (tied embeddings); "
            "torchtitan's plan shards the two differently: untie them (tie_word_embeddings=False) first"
        )
    if m[tp_dim].size() > 1:
        _tensor_parallel(model, fam, m[tp_dim], loss_parallel)
    layers = _layers(model, fam)
    for layer in layers:
        fully_shard(layer, mesh=m[dp_dim])
    # After fully_shard, so the recomputation runs the layer's FSDP forward again (its gathers too), as
    # torchtitan's checkpoint wrapper under fully_shard does.
    if activation_checkpoint:
        for layer in layers:
            fsdp.checkpoint_module(layer)
    return fully_shard(model, mesh=m[dp_dim])
