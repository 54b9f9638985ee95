"""The front of `braid serve --dp`: the address clients use.

Generation routes go through SGLang's router (router.py), unless it would lose a field of the
request (router_wire.py): then the front sends the request to a healthy replica itself, by
prefix affinity; so does braid's own /braid/score, which the router does not know. Other
routes (/v1/models, /get_model_info, ...) go to a healthy replica, which answers them as a
single server would (the router would only pass them on, and not all of them). The front
answers the cluster's own routes: /server_info lists each replica with its counters,
/metrics gives each replica's metrics labelled `replica` (and the router's own), /flush_cache
flushes every replica, /health is OK while one replica is. A response that breaks off
because its replica died ends with an error (an error event in a stream), never silently.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
from dataclasses import dataclass

import httpx
import msgspec
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.parser import text_string_to_metric_families
from starlette.applications import Starlette
from starlette.middleware import Middleware
from starlette.requests import Request
from starlette.responses import JSONResponse, PlainTextResponse, Response
from starlette.routing import Route

from braid.runtime.cluster.affinity import PrefixAffinity
from braid.runtime.cluster.proxy import UpstreamDown, forward
from braid.runtime.cluster.replicas import ReplicaSet
from braid.runtime.cluster.router import SGLangRouter
from braid.runtime.cluster.router_wire import for_router, routing_text
from braid.runtime.server.app import ApiKey
from braid.runtime.server.http import guards
from braid.runtime.server.wire import BadRequest, decode_object, error_body
from braid.runtime.stats import EngineStats

log = logging.getLogger("braid.cluster")

_METRICS_CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"


@dataclass
class Cluster:
    replicas: ReplicaSet
    router: SGLangRouter
    affinity: PrefixAffinity
    model_name: str
    api_key: str | None
    max_request_bytes: int
    health_interval_s: float = 1.0
    allowed_hosts: frozenset[str] | None = None  # None: any (server/guards.py)
    allowed_origins: frozenset[str] = frozenset()


def create_front(cluster: Cluster) -> Starlette:
    """The front app; its lifetime supervises the replicas and the router, and stops them
    when the front stops (after uvicorn has drained the requests in flight)."""

    @contextlib.asynccontextmanager
    async def lifespan(app: Starlette):
        # No read timeout: a generation takes as long as it takes (the router bounds it).
        app.state.client = httpx.AsyncClient(
            timeout=httpx.Timeout(None, connect=10.0),
            limits=httpx.Limits(max_connections=None, max_keepalive_connections=256),
        )
        supervisor = asyncio.create_task(_supervise(cluster, app.state.client))
        try:
            yield
        finally:
            supervisor.cancel()
            await app.state.client.aclose()
            cluster.router.stop()
            cluster.replicas.stop()

    routes = [
        Route("/health", _health, methods=["GET"]),
        Route("/server_info", _server_info, methods=["GET"]),
        Route("/get_server_info", _server_info, methods=["GET"]),
        Route("/metrics", _metrics, methods=["GET"]),
        Route("/flush_cache", _flush_cache, methods=["GET", "POST"]),
        Route("/braid/score", _to_replica_route, methods=["POST"]),
        *(Route(p, _generation, methods=["POST"]) for p in _GENERATION_ROUTES),
        Route("/{path:path}", _to_any_replica, methods=["GET", "POST", "PUT", "DELETE"]),
    ]
    middleware = guards.middleware(cluster.allowed_hosts, cluster.allowed_origins)
    if cluster.api_key:
        middleware.append(Middleware(ApiKey, keys=[cluster.api_key]))
    app = Starlette(routes=routes, middleware=middleware, lifespan=lifespan)
    app.state.cluster = cluster
    return app


_GENERATION_ROUTES = ("/generate", "/v1/completions", "/v1/chat/completions")


async def _supervise(cluster: Cluster, client: httpx.AsyncClient) -> None:
    while True:
        try:
            await cluster.replicas.check(client)
            if cluster.router.restart_if_dead():
                log.error("the SGLang router exited; started it again")
        except Exception:  # keep supervising whatever one round hit
            log.exception("checking the replicas failed")
        await asyncio.sleep(cluster.health_interval_s)


# ---- routes the front answers -----------------------------------------------------------


async def _health(request: Request) -> Response:
    """200 while a replica answers; how many of them do, either way."""
    healthy = request.app.state.cluster.replicas.healthy()
    counts = {"replicas": len(healthy), "replicas_healthy": sum(healthy)}
    return JSONResponse(counts, 200 if any(healthy) else 503)


async def _server_info(request: Request) -> Response:
    cluster: Cluster = request.app.state.cluster
    client = request.app.state.client
    replicas = cluster.replicas.replicas
    auth = _auth(cluster)
    infos = await asyncio.gather(
        *(_get_json(client, r.url + "/server_info", auth) for r in replicas)
    )
    listed, totals = [], dict.fromkeys(EngineStats.COUNTERS, 0)
    for r, info in zip(replicas, infos, strict=True):
        entry = {
            "index": r.index,
            "url": r.url,
            "local": r.local,
            "healthy": r.healthy,
            "restarts": r.restarts,
        }
        if r.local:
            entry["pid"] = r.process.pid
        if info is not None:
            stats = info["stats"]
            for name in totals:
                totals[name] += stats[name]
            entry.update(_summary(stats), server_info=info)
        listed.append(entry)
    first = next((info for info in infos if info is not None), {})
    return JSONResponse(
        {
            "served_model_name": first.get("served_model_name"),
            "context_length": first.get("context_length"),
            "router": {
                "kind": "sglang-router",
                "policy": cluster.router.settings.policy,
                "restarts": cluster.router.restarts,
            },
            "replicas": listed,
            "stats": {**totals, "requests_total": _requests_total(totals)},
        }
    )


def _summary(stats: dict) -> dict:
    """The numbers that show how a replica's share of the work went."""
    total = stats["kv_slots_total"]
    return {
        "requests_total": _requests_total(stats),
        "prompt_tokens": stats["prompt_tokens"],
        "cached_tokens": stats["cached_tokens"],
        "prefill_tokens_computed": stats["prefill_tokens_computed"],
        "decode_tokens": stats["decode_tokens"],
        "running_requests": stats["running_requests"],
        "waiting_requests": stats["waiting_requests"],
        # Held by requests; the prefix cache's share can be given back (as in /metrics).
        "kv_usage": 1 - (stats["kv_slots_free"] + stats["kv_slots_cached"]) / total,
        "kv_cached_ratio": stats["kv_slots_cached"] / total,
    }


def _requests_total(stats: dict) -> int:
    return stats["requests_finished"] + stats["requests_aborted"]


async def _metrics(request: Request) -> Response:
    cluster: Cluster = request.app.state.cluster
    client = request.app.state.client
    replicas = cluster.replicas.replicas
    texts = await asyncio.gather(
        *(_get_text(client, r.url + "/metrics") for r in replicas),
        _get_text(client, cluster.router.metrics_url),
    )
    registry = CollectorRegistry(auto_describe=False)
    registry.register(_ClusterMetrics(cluster, texts[:-1], texts[-1]))
    body = await asyncio.to_thread(generate_latest, registry)
    return Response(body, media_type=_METRICS_CONTENT_TYPE)


class _ClusterMetrics:
    """Each replica's metrics with a `replica` label (sum them for the cluster), whether each
    replica is up and how often it was restarted, and the router's own metrics as it
    reports them."""

    def __init__(self, cluster: Cluster, replica_texts: list, router_text: str | None) -> None:
        self.cluster, self.replica_texts, self.router_text = cluster, replica_texts, router_text

    def collect(self):
        up = GaugeMetricFamily(
            "braid_replica_up", "1 while the replica answers", labels=["replica", "url"]
        )
        restarts = CounterMetricFamily(
            "braid_replica_restarts", "times the replica was started again", labels=["replica"]
        )
        for r in self.cluster.replicas.replicas:
            up.add_metric([str(r.index), r.url], float(r.healthy))
            restarts.add_metric([str(r.index)], r.restarts)
        yield up
        yield restarts
        families: dict[str, object] = {}
        for r, text in zip(self.cluster.replicas.replicas, self.replica_texts, strict=True):
            for family in text_string_to_metric_families(text or ""):
                merged = families.setdefault(family.name, family)
                labelled = [
                    s._replace(labels={**s.labels, "replica": str(r.index)}) for s in family.samples
                ]
                if merged is family:
                    family.samples = labelled
                else:
                    merged.samples += labelled
        yield from families.values()
        yield from text_string_to_metric_families(self.router_text or "")


async def _flush_cache(request: Request) -> Response:
    cluster: Cluster = request.app.state.cluster
    client = request.app.state.client
    headers = _auth(cluster)

    async def flush(url: str) -> str | None:
        try:
            reply = await client.post(url + "/flush_cache", headers=headers, timeout=60)
        except httpx.HTTPError as e:
            return f"{url}: {e}"
        return None if reply.status_code == 200 else f"{url}: {reply.status_code} {reply.text}"

    failed = [f for f in await asyncio.gather(*map(flush, cluster.replicas.urls)) if f]
    if failed:
        message = "flushing failed on " + "; ".join(failed)
        return JSONResponse(error_body(502, "server_error", message), 502)
    return PlainTextResponse("Cache flushed.\n")


# ---- routes the front forwards ----------------------------------------------------------


async def _generation(request: Request) -> Response:
    cluster: Cluster = request.app.state.cluster
    got = await _json_body(request, cluster)
    if isinstance(got, Response):
        return got
    body, obj = got
    text = routing_text(request.url.path, obj)
    routed = for_router(request.url.path, obj, cluster.model_name)
    healthy = cluster.replicas.healthy()
    # While a replica fails its health checks the router may still choose it (a stopped one
    # holds what it is sent): the front routes among those that answer.
    if routed is None or not all(healthy):
        return await _to_replica(request, cluster, body, text)

    def one_went_down() -> bool:  # the router's choice is not known: any of them
        now = cluster.replicas.healthy()
        return any(was and not now[i] for i, was in enumerate(healthy))

    try:
        return await forward(
            request,
            request.app.state.client,
            _auth(cluster),
            cluster.router.url,
            body if routed is obj else msgspec.json.encode(routed),
            "the SGLang router",
            down=one_went_down,
        )
    except UpstreamDown:  # nothing answered yet: a replica the front knows is healthy will
        return await _to_replica(request, cluster, body, text)


async def _to_replica_route(request: Request) -> Response:
    cluster: Cluster = request.app.state.cluster
    got = await _json_body(request, cluster)
    if isinstance(got, Response):
        return got
    body, obj = got
    return await _to_replica(request, cluster, body, routing_text(request.url.path, obj))


async def _to_any_replica(request: Request) -> Response:
    cluster: Cluster = request.app.state.cluster
    body = await _body(request, cluster)
    if isinstance(body, Response):
        return body
    return await _to_replica(request, cluster, body, "")


async def _to_replica(
    request: Request, cluster: Cluster, body: bytes, text: str, tried: frozenset[int] = frozenset()
) -> Response:
    """Send the request to a healthy replica by prefix affinity; one found down before it
    answers (a stopped process holds its requests until it runs again) gives it to the
    next, and one found down in the middle of a stream ends the stream with an error."""
    healthy = [ok and i not in tried for i, ok in enumerate(cluster.replicas.healthy())]
    try:
        i = cluster.affinity.acquire(text, healthy)
    except RuntimeError:
        message = "no replica is healthy now; retry later"
        return JSONResponse(error_body(503, "overloaded", message), 503)
    replica = cluster.replicas.replicas[i]
    release = functools.partial(cluster.affinity.release, i)
    client = request.app.state.client
    try:
        return await forward(
            request,
            client,
            _auth(cluster),
            replica.url,
            body,
            f"replica {i}",
            release,
            down=lambda: not replica.healthy,
            down_ends_stream=True,
        )
    except UpstreamDown:
        log.warning("replica %d (%s) stopped answering; its request goes elsewhere", i, replica.url)
        return await _to_replica(request, cluster, body, text, tried | {i})


async def _body(request: Request, cluster: Cluster) -> bytes | Response:
    limit = cluster.max_request_bytes
    body = await _read(request, limit)
    if body is None:
        message = f"the request body is over the server's limit of {limit} bytes"
        # The rest of the body is left unread: the connection cannot carry another request.
        return JSONResponse(
            error_body(413, "request_too_large", message), 413, headers={"connection": "close"}
        )
    return body


async def _read(request: Request, limit: int) -> bytes | None:
    """The body, or None as soon as its Content-Length or the bytes read pass `limit` (read
    whole before the check, a few oversized bodies held their whole size in memory each:
    docs/reliability.md)."""
    declared = request.headers.get("content-length", "")
    if declared.isdigit() and int(declared) > limit:
        return None
    body = bytearray()
    async for chunk in request.stream():
        body += chunk
        if len(body) > limit:
            return None
    return bytes(body)


async def _json_body(request: Request, cluster: Cluster) -> tuple[bytes, dict] | Response:
    """The body and the JSON object it holds, or the 413 or 400 answer to it."""
    body = await _body(request, cluster)
    if isinstance(body, Response):
        return body
    try:
        return body, decode_object(body)
    except BadRequest as e:
        return JSONResponse(error_body(400, "invalid_request_error", str(e)), 400)


# ---- helpers ---------------------------------------------------------------------------


def _auth(cluster: Cluster) -> dict[str, str]:
    """The replicas require the cluster's own API key."""
    return {"authorization": f"Bearer {cluster.api_key}"} if cluster.api_key else {}


async def _get_json(client: httpx.AsyncClient, url: str, headers: dict) -> dict | None:
    """The replica's answer, None if it gives none (it is down)."""
    try:
        reply = await client.get(url, headers=headers, timeout=10)
        return reply.json() if reply.status_code == 200 else None
    except (httpx.HTTPError, ValueError):
        return None


async def _get_text(client: httpx.AsyncClient, url: str) -> str | None:
    try:
        reply = await client.get(url, timeout=10)
        return reply.text if reply.status_code == 200 else None
    except httpx.HTTPError:
        return None
