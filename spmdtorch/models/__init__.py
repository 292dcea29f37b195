"""Small reference models used by the examples, tests and benchmarks, and model helpers.

``generate`` / ``static_decode`` run a transformers causal LM's decoding with
one prefill and one decode program per shape bucket (``_generation``);
:func:`scan_decoder_layers` runs a decoder's layer loop (spmdtorch's Llama or a
Hugging Face model) as one ``jax.lax.scan`` without editing the model.
"""

from spmdtorch.models._generation import (
    GenerationError,
    GenerationStats,
    bucket_length,
    generate,
    last_generation_stats,
    static_decode,
)
from spmdtorch.models._scan_decoder import find_decoder_layers, scan_decoder_layers, unscan_decoder_layers
from spmdtorch.models.llama import LlamaConfig, LlamaForCausalLM

__all__ = [
    "GenerationError",
    "GenerationStats",
    "LlamaConfig",
    "LlamaForCausalLM",
    "bucket_length",
    "find_decoder_layers",
    "generate",
    "last_generation_stats",
    "scan_decoder_layers",
    "static_decode",
    "unscan_decoder_layers",
]
