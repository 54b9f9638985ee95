"""Model implementations and the registry from HF architecture names to them."""

from torch import nn

from braid.runtime.models.config.families import GEMMA_ARCHITECTURES
from braid.runtime.models.config.model_config import SUPPORTED_ARCHITECTURES, ModelConfig
from braid.runtime.models.gemma import GemmaForCausalLM
from braid.runtime.models.gpt_oss import GptOssForCausalLM
from braid.runtime.models.llama import LlamaForCausalLM
from braid.runtime.models.moe import MoeForCausalLM

__all__ = [
    "SUPPORTED_ARCHITECTURES",
    "GemmaForCausalLM",
    "GptOssForCausalLM",
    "LlamaForCausalLM",
    "ModelConfig",
    "MoeForCausalLM",
    "build_model",
]


def build_model(config: ModelConfig, linear: type[nn.Linear] = nn.Linear) -> LlamaForCausalLM:
    """The model class for `config.architecture`, built (on the current default device)."""
    cls = GemmaForCausalLM if config.architecture in GEMMA_ARCHITECTURES else LlamaForCausalLM
    if config.moe is not None:
        cls = GptOssForCausalLM if config.architecture == "GptOssForCausalLM" else MoeForCausalLM
    return cls(config, linear)
