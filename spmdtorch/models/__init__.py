"""Small reference models used by the examples, tests and benchmarks, and fixed-shape generation.

``generate`` / ``static_decode`` run a transformers causal LM's decoding with
one prefill and one decode program per shape bucket (``_generation``).
"""

from spmdtorch.models._generation import (
    GenerationError,
    GenerationStats,
    bucket_length,
    generate,
    last_generation_stats,
    static_decode,
)
from spmdtorch.models.llama import LlamaConfig, LlamaForCausalLM

__all__ = [
    "GenerationError",
    "GenerationStats",
    "LlamaConfig",
    "LlamaForCausalLM",
    "bucket_length",
    "generate",
    "last_generation_stats",
    "static_decode",
]
