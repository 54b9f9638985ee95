"""`braid serve`: load a model and serve it over HTTP with uvicorn."""

from __future__ import annotations

import argparse
import dataclasses
import logging
from pathlib import Path

from runtime.config import EngineConfig

# EngineConfig field types (annotations are strings) -> argparse types.
_TYPES = {"int": int, "float": float, "str": str}


def add_parser(commands: argparse._SubParsersAction) -> None:
    serve = commands.add_parser("serve", help="serve a model over HTTP (OpenAI and SGLang APIs)")
    serve.add_argument("--host", default="127.0.0.1", help="address to bind (default: loopback)")
    serve.add_argument("--port", type=int, default=30000)
    serve.add_argument("--api-key", help="require `Authorization: Bearer KEY` on every route")
    serve.add_argument("--served-model-name", help="the model's name in the APIs")
    serve.add_argument(
        "--max-queued-requests",
        type=int,
        default=1024,
        help="sequences held beyond --max-running-requests before answering 503",
    )
    serve.add_argument("--log-level", default="warning")
    engine = serve.add_argument_group("engine (EngineConfig)")
    for field in dataclasses.fields(EngineConfig):
        flag = "--" + field.name.replace("_", "-")
        if field.type == "bool":
            engine.add_argument(flag, action=argparse.BooleanOptionalAction, default=field.default)
        else:
            kind = _TYPES[field.type.removesuffix(" | None")]
            engine.add_argument(flag, type=kind, default=field.default)
    serve.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    import uvicorn

    from runtime.engine import Engine
    from runtime.server.app import create_app

    logging.getLogger().setLevel(args.log_level.upper())
    config = {f.name: getattr(args, f.name) for f in dataclasses.fields(EngineConfig)}
    engine = Engine(**config)
    name = args.served_model_name or (Path(args.model).name if args.model else "default")
    app = create_app(
        engine,
        model_name=name,
        api_key=args.api_key,
        max_queued_requests=args.max_queued_requests,
        owns_engine=True,
    )
    # On SIGTERM uvicorn stops accepting connections, lets in-flight responses finish
    # (streams included), then runs the app's shutdown, which stops the engine.
    uvicorn.run(app, host=args.host, port=args.port, log_level=args.log_level)
    return 0
