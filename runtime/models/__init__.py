"""Model implementations and the registry from HF architecture names to them."""

from braid.runtime.models.config import SUPPORTED_ARCHITECTURES, ModelConfig
from braid.runtime.models.llama import LlamaForCausalLM

__all__ = ["SUPPORTED_ARCHITECTURES", "LlamaForCausalLM", "ModelConfig"]
