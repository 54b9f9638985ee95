"""The HTTP server: OpenAI-compatible and SGLang-compatible APIs over one Engine."""

from runtime.server.app import create_app

__all__ = ["create_app"]
