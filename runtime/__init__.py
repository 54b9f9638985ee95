"""The braid runtime: model loading, our model forward, paged KV cache, engine, server, CLI.

`Engine` loads on first use (it needs torch); the types shared with the frontend and the
remote backends (SamplingParams, outputs) import neither torch nor transformers.
"""

from typing import TYPE_CHECKING

from braid._lazy import lazy_exports

_EXPORTS = {
    "EngineConfig": "braid.runtime.config",
    "Engine": "braid.runtime.engine.engine",
    "GenerateOutput": "braid.runtime.protocol.outputs",
    "StreamChunk": "braid.runtime.protocol.outputs",
    "SamplingParams": "braid.runtime.protocol.sampling_params",
}
__getattr__ = lazy_exports(__name__, _EXPORTS)
__all__ = sorted(_EXPORTS)

if TYPE_CHECKING:
    from braid.runtime.config import EngineConfig
    from braid.runtime.engine.engine import Engine
    from braid.runtime.protocol.outputs import GenerateOutput, StreamChunk
    from braid.runtime.protocol.sampling_params import SamplingParams
