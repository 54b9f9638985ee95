"""The braid runtime: model loading, our model forward, paged KV cache, engine, CLI."""

from runtime.config import EngineConfig
from runtime.engine import Engine
from runtime.outputs import GenerateOutput, StreamChunk
from runtime.request_tree import TreeNode
from runtime.sampling_params import SamplingParams

__all__ = [
    "Engine",
    "EngineConfig",
    "GenerateOutput",
    "SamplingParams",
    "StreamChunk",
    "TreeNode",
]
