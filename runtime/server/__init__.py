"""The HTTP server: OpenAI-compatible and SGLang-compatible APIs over one Engine.

`create_app` loads on first use: the wire types (`braid.runtime.server.wire`) serve the
remote backends, which need neither starlette nor the engine.
"""

from braid._lazy import lazy_exports

__getattr__ = lazy_exports(__name__, {"create_app": "braid.runtime.server.app"})
__all__ = ["create_app"]
