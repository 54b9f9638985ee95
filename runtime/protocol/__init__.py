"""The types the frontend, the engine and the server all speak, importing neither torch nor
transformers (nor anything of the engine's rooms): sampling parameters, outputs, and the
wire fields both sides of HTTP share.
"""

from typing import TYPE_CHECKING

from braid._lazy import lazy_exports

_EXPORTS = {
    "GenerateOutput": "braid.runtime.protocol.outputs",
    "StreamChunk": "braid.runtime.protocol.outputs",
    "SamplingParams": "braid.runtime.protocol.sampling_params",
    "check_stop_regex": "braid.runtime.protocol.stop_regex",
    "REPORTING_FIELDS": "braid.runtime.protocol.wire_fields",
    "SAMPLING_FIELDS": "braid.runtime.protocol.wire_fields",
    "wire_sampling": "braid.runtime.protocol.wire_fields",
}
__getattr__ = lazy_exports(__name__, _EXPORTS)
__all__ = sorted(_EXPORTS)

if TYPE_CHECKING:
    from braid.runtime.protocol.outputs import GenerateOutput, StreamChunk
    from braid.runtime.protocol.sampling_params import SamplingParams
    from braid.runtime.protocol.stop_regex import check_stop_regex
    from braid.runtime.protocol.wire_fields import REPORTING_FIELDS, SAMPLING_FIELDS, wire_sampling
