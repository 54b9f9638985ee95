"""`braid serve --dp N`: N engine replicas (processes; on a GPU box one per device) behind
SGLang's router, with braid's front on the served address; `--worker-url` adds braid
servers on other machines."""

from __future__ import annotations

import argparse
import dataclasses
import logging
import os
import sys

from braid.runtime.cluster.processes import free_port
from braid.runtime.cluster.replicas import Replica, ReplicaSet

log = logging.getLogger("braid.cluster")

# The router's policies that fit replicas of one model (its PD and manual modes do not).
ROUTER_POLICIES = ("cache_aware", "round_robin", "random", "power_of_two")
# Loading a large model on each replica can take minutes.
_START_TIMEOUT_S = 1800.0


def add_arguments(serve: argparse.ArgumentParser) -> None:
    group = serve.add_argument_group("scale-out (needs braid[cluster]; docs/scale-out.md)")
    group.add_argument(
        "--dp",
        type=int,
        default=1,
        help="engine replicas to run here, each a process (on a GPU box one per device), "
        "behind SGLang's cache-aware router; 0 with --worker-url: a router for other machines",
    )
    group.add_argument(
        "--worker-url",
        action="append",
        default=[],
        metavar="URL",
        help="a braid server on another machine to route to as well (repeatable)",
    )
    group.add_argument(
        "--router-policy",
        choices=ROUTER_POLICIES,
        default="cache_aware",
        help="how SGLang's router picks a replica: cache_aware sends a prompt to the replica "
        "that saw its longest prefix, unless the load is too uneven",
    )


def is_cluster(args: argparse.Namespace) -> bool:
    return args.dp != 1 or bool(args.worker_url)


def run(
    args: argparse.Namespace,
    api_key: str | None,
    model_name: str,
    configs: tuple[type, ...],
    server_options: dict,
) -> int:
    """Serve the cluster until SIGTERM. `configs`: the dataclasses whose fields are `braid
    serve` flags (EngineConfig, ...), given to each local replica as they were given here;
    `server_options`: uvicorn's settings for the front (its connection limits)."""
    from braid.runtime.cluster.affinity import PrefixAffinity
    from braid.runtime.cluster.front import Cluster, create_front
    from braid.runtime.cluster.router import RouterSettings, SGLangRouter
    from braid.runtime.server.http import guards, shutdown

    if args.dp < 0 or (args.dp == 0 and not args.worker_url):
        raise ValueError("--dp must be >= 1, or 0 with at least one --worker-url")
    replicas = ReplicaSet(
        [_local(i, args, api_key, model_name, configs) for i in range(args.dp)]
        + [Replica(args.dp + j, url.rstrip("/")) for j, url in enumerate(args.worker_url)]
    )
    router = SGLangRouter(
        RouterSettings(worker_urls=replicas.urls, policy=args.router_policy, api_key=api_key)
    )
    try:
        replicas.start(_START_TIMEOUT_S)
        router.start()
        router.wait_ready()
    except BaseException:
        router.stop()
        replicas.stop()
        raise
    affinity = PrefixAffinity(len(replicas.urls))
    cluster = Cluster(
        replicas,
        router,
        affinity,
        model_name,
        api_key,
        args.max_request_bytes,
        allowed_hosts=guards.allowed_hosts(args.host, args.allowed_hosts),
        allowed_origins=guards.allowed_origins(args.allowed_origins),
    )
    log.info(
        "serving %s on http://%s:%d: %d replicas (%s) behind SGLang's router (%s), API key %s",
        model_name,
        args.host,
        args.port,
        len(replicas.urls),
        ", ".join(replicas.urls),
        args.router_policy,
        "required" if api_key else "off",
    )
    # On SIGTERM uvicorn drains the front's requests; its shutdown then stops the router and
    # the replicas (each drains its own).
    shutdown.run(
        create_front(cluster),
        host=args.host,
        port=args.port,
        log_level=args.log_level,
        access_log=args.access_log,
        **server_options,
    )
    return 0


def _local(
    i: int, args: argparse.Namespace, api_key: str | None, model_name: str, configs: tuple
) -> Replica:
    """Replica i: `braid serve` on a loopback port with this command's settings."""
    port = free_port()
    argv = [sys.executable, "-m", "braid.runtime.cli", "serve", "--host", "127.0.0.1"]
    argv += ["--port", str(port), "--served-model-name", model_name]
    argv += ["--max-queued-requests", str(args.max_queued_requests)]
    argv += ["--max-request-bytes", str(args.max_request_bytes), "--log-level", args.log_level]
    if args.accept_any_model:
        argv.append("--accept-any-model")
    if args.enable_lora_updates:
        argv.append("--enable-lora-updates")
    for field in (f for config in configs for f in dataclasses.fields(config)):
        value = getattr(args, field.name)
        if value == field.default:
            continue
        flag = "--" + field.name.replace("_", "-")
        if isinstance(value, bool):
            argv.append(flag if value else "--no-" + flag[2:])
        elif isinstance(value, list):  # a repeated flag
            for entry in value:
                argv += [flag, entry]
        else:
            argv += [flag, str(value)]
    env = dict(os.environ)
    if api_key:  # by the environment: a flag would show in the process list
        env["BRAID_API_KEY"] = api_key
    devices = _devices(i, args)
    if devices is not None:
        env["CUDA_VISIBLE_DEVICES"] = devices
    elif "OMP_NUM_THREADS" not in os.environ:
        # Replicas on the CPU split its cores: each torch would take them all otherwise, and
        # they would fight over them.
        env["OMP_NUM_THREADS"] = str(max(1, (os.cpu_count() or 1) // max(1, args.dp)))
    return Replica(i, f"http://127.0.0.1:{port}", argv, env)


def _devices(i: int, args: argparse.Namespace) -> str | None:
    """Replica i's GPUs: its own one (or `tp` of them), when the box has enough."""
    if args.device == "cpu":
        return None
    import torch

    count = torch.cuda.device_count()
    per = getattr(args, "tp", 1) or 1
    if count == 0:
        return None
    if count < args.dp * per:
        if i == 0:
            log.warning("%d replicas x %d GPUs each share %d GPUs", args.dp, per, count)
        return None
    return ",".join(str(d) for d in range(i * per, (i + 1) * per))
