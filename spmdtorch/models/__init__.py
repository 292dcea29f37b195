"""Small reference models used by the examples, tests and benchmarks, and model helpers.

:func:`scan_decoder_layers` runs a decoder's layer loop (spmdtorch's Llama or a
Hugging Face model) as one ``jax.lax.scan`` without editing the model.
"""

from spmdtorch.models._scan_decoder import find_decoder_layers, scan_decoder_layers, unscan_decoder_layers
from spmdtorch.models.llama import LlamaConfig, LlamaForCausalLM

__all__ = ["LlamaConfig", "LlamaForCausalLM", "find_decoder_layers", "scan_decoder_layers", "unscan_decoder_layers"]
