"""Small reference models used by the examples, tests and benchmarks."""

from spmdtorch.models.llama import LlamaConfig, LlamaForCausalLM

__all__ = ["LlamaConfig", "LlamaForCausalLM"]
