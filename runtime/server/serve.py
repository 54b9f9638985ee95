"""`braid serve`: load a model and serve it over HTTP with uvicorn."""

from __future__ import annotations

import argparse
import dataclasses
import logging
import os
from pathlib import Path

from braid.runtime.cluster import start as cluster_serve
from braid.runtime.config import EngineConfig, RequestLimits
from braid.runtime.server.app import ADMIN_PATHS, CACHE_SCOPES, DEFAULT_MAX_REQUEST_BYTES
from braid.runtime.server.http import connections, guards, shutdown
from braid.runtime.server.http.connections import ConnectionLimits

log = logging.getLogger("braid.serve")

# EngineConfig field types (annotations are strings) -> argparse types.
_TYPES = {"int": int, "float": float, "str": str}
API_KEY_ENV = "BRAID_API_KEY"
ADMIN_KEY_ENV = "BRAID_ADMIN_API_KEY"


def add_parser(commands: argparse._SubParsersAction) -> None:
    serve = commands.add_parser(
        "serve",
        help="serve a model over HTTP (OpenAI and SGLang APIs)",
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    serve.add_argument("--host", default="127.0.0.1", help="address to bind (loopback)")
    serve.add_argument("--port", type=int, default=30000, help="port to listen on")
    key = serve.add_mutually_exclusive_group()
    key.add_argument(
        "--api-key",
        action="append",
        help="require `Authorization: Bearer KEY` on every route but /health and /metrics; "
        "repeat it for several keys, any of which will do (visible to local users in the "
        f"process list: prefer ${API_KEY_ENV} or --api-key-file)",
    )
    key.add_argument("--api-key-file", help="read the API keys from this file, one a line")
    serve.add_argument(
        "--admin-api-key",
        help="the key of the routes acting on the whole server "
        f"({', '.join(sorted(ADMIN_PATHS))}), which then take no other; without it they "
        "take the API keys, except under --cache-scope key, where they are refused "
        f"(default: ${ADMIN_KEY_ENV})",
    )
    serve.add_argument(
        "--cache-scope",
        choices=CACHE_SCOPES,
        default="shared",
        help="who shares cached prompt prefixes: every request without a cache_salt (shared), "
        "or only the requests of one API key (key: tenants never see each other's prompts "
        "in cached token counts or timing)",
    )
    serve.add_argument(
        "--served-model-name",
        nargs="+",
        metavar="NAME",
        help="the model's name in the APIs; further names are aliases that requests may give "
        "too (/v1/models lists them all, the first first)",
    )
    serve.add_argument(
        "--accept-any-model",
        action="store_true",
        help="answer OpenAI requests whatever model they name (for clients that hard-code "
        "one); without it a name other than the served one gets a 404 model_not_found",
    )
    serve.add_argument(
        "--enable-lora-updates",
        action="store_true",
        help="serve POST /load_lora_adapter and /unload_lora_adapter, which load LoRA "
        "adapters from any directory the server can read (trusted clients only)",
    )
    serve.add_argument(
        "--max-queued-requests",
        type=int,
        default=1024,
        help="sequences held beyond --max-running-requests before answering 503",
    )
    serve.add_argument(
        "--max-request-bytes",
        type=int,
        default=DEFAULT_MAX_REQUEST_BYTES,
        help="largest request body accepted; larger ones get a 413",
    )
    serve.add_argument("--log-level", default="info", help="debug, info, warning or error")
    serve.add_argument("--access-log", action="store_true", help="log every request")
    callers = serve.add_argument_group("connections and callers (docs/server.md)")
    _add_fields(callers, ConnectionLimits)
    callers.add_argument(
        "--allowed-hosts",
        metavar="NAMES",
        help="Host names the server answers, comma-separated (`*`: any); default: bound to "
        "loopback, localhost, 127.0.0.1 and ::1 only (against DNS rebinding), else any",
    )
    callers.add_argument(
        "--allowed-origins",
        metavar="ORIGINS",
        help="web origins (scheme://host:port, comma-separated; `*`: any) whose pages may "
        "call the server, with CORS; default: none, a request with an Origin header is refused",
    )
    _add_fields(serve.add_argument_group("engine (EngineConfig)"), EngineConfig)
    _add_fields(serve.add_argument_group("request limits (RequestLimits)"), RequestLimits)
    cluster_serve.add_arguments(serve)
    serve.set_defaults(run=run)


def _add_fields(group: argparse._ArgumentGroup, config: type) -> None:
    """A flag for each field of a config dataclass, with its meaning and default."""
    for field in dataclasses.fields(config):
        flag = "--" + field.name.replace("_", "-")
        meaning = field.metadata["help"]
        if field.type == "bool":
            group.add_argument(
                flag, action=argparse.BooleanOptionalAction, default=field.default, help=meaning
            )
        elif field.type == "tuple[str, ...]":  # the flag repeats, once per entry
            group.add_argument(flag, action="append", default=[], help=meaning)
        else:
            kind = _TYPES[field.type.removesuffix(" | None")]
            group.add_argument(flag, type=kind, default=field.default, help=meaning)


def api_keys(args: argparse.Namespace) -> list[str]:
    """The --api-key flags, else the lines of the file --api-key-file names, else
    $BRAID_API_KEY, else none."""
    if args.api_key:
        return args.api_key
    if args.api_key_file:
        keys = [line.strip() for line in Path(args.api_key_file).read_text().splitlines()]
        keys = [key for key in keys if key]
        if not keys:
            raise ValueError(f"--api-key-file {args.api_key_file} is empty")
        return keys
    key = os.environ.get(API_KEY_ENV)
    return [key] if key else []


def admin_key(args: argparse.Namespace) -> str | None:
    """--admin-api-key, else $BRAID_ADMIN_API_KEY, else none."""
    return args.admin_api_key or os.environ.get(ADMIN_KEY_ENV) or None


def run(args: argparse.Namespace) -> int:
    from braid.runtime.engine.engine import Engine
    from braid.runtime.server.app import create_app

    logging.getLogger().setLevel(args.log_level.upper())
    keys = api_keys(args)
    names = args.served_model_name or [Path(args.model).name if args.model else "default"]
    name = names[0]
    server_options = connections.prepare(connections.from_flags(args))  # before the model loads
    if cluster_serve.is_cluster(args):  # its replicas serve the primary name only
        if len(keys) > 1 or args.cache_scope != "shared" or admin_key(args):
            raise ValueError(
                "a cluster (--dp, --worker-url) takes one API key, no --admin-api-key and no "
                "--cache-scope"
            )
        key = keys[0] if keys else None
        return cluster_serve.run(args, key, name, (EngineConfig, RequestLimits), server_options)
    config = {f.name: getattr(args, f.name) for f in dataclasses.fields(EngineConfig)}
    engine = Engine(**config)
    app = create_app(
        engine,
        model_name=name,
        aliases=tuple(names[1:]),
        api_key=keys,
        cache_scope=args.cache_scope,
        allowed_hosts=guards.allowed_hosts(args.host, args.allowed_hosts),
        allowed_origins=guards.allowed_origins(args.allowed_origins),
        max_queued_requests=args.max_queued_requests,
        max_request_bytes=args.max_request_bytes,
        limits=RequestLimits(
            **{f.name: getattr(args, f.name) for f in dataclasses.fields(RequestLimits)}
        ),
        owns_engine=True,
        accept_any_model=args.accept_any_model,
        lora_updates=args.enable_lora_updates,
        admin_api_key=admin_key(args),
    )
    kv = engine.kv
    log.info(
        "serving %s (%s) on http://%s:%d: %s, context %d tokens, KV pool %d tokens "
        "(%.2f GB), API keys: %d, cache scope %s",
        name,
        app.state.service.model_path,
        args.host,
        args.port,
        engine.describe(),
        engine.context_length,
        kv.num_slots,
        kv.num_bytes / 1024**3,
        len(keys),
        args.cache_scope,
    )
    # On SIGTERM uvicorn stops accepting connections, lets in-flight responses finish
    # (streams included) within --shutdown-timeout-s, then runs the app's shutdown, which
    # stops the engine.
    shutdown.run(
        app,
        host=args.host,
        port=args.port,
        log_level=args.log_level,
        access_log=args.access_log,
        **server_options,
    )
    return 0
