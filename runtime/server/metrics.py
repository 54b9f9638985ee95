"""/metrics in Prometheus text format: engine gauges and counters read at scrape time, and
the server's own latency histograms."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Histogram, ProcessCollector, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

from braid.runtime.engine.engine import Engine
from braid.runtime.stats import EngineStats

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"

# Seconds; a CPU decode step is tens of ms, a GPU one a few, a long queue wait many seconds.
_LATENCY_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120)


class Metrics:
    def __init__(self, engine: Engine) -> None:
        # A registry per server, so several servers (tests) can live in one process.
        self.registry = CollectorRegistry()
        self.registry.register(_EngineCollector(engine))
        # process_resident_memory_bytes and friends, what a soak watches for growth.
        ProcessCollector(registry=self.registry)

        def histogram(name: str, doc: str) -> Histogram:
            return Histogram(name, doc, buckets=_LATENCY_BUCKETS, registry=self.registry)

        self.ttft = histogram("braid_time_to_first_token_seconds", "arrival -> first token")
        self.tpot = histogram(
            "braid_time_per_output_token_seconds", "mean time per output token after the first"
        )
        self.e2e = histogram("braid_e2e_request_latency_seconds", "arrival -> last token")

    def render(self) -> bytes:
        return generate_latest(self.registry)


class _EngineCollector:
    """Reads engine.stats() when scraped, so the numbers are never stale copies."""

    def __init__(self, engine: Engine) -> None:
        self.engine = engine

    def collect(self):
        s = self.engine.stats()
        gauges = {
            "num_requests_running": (s["running_requests"], "requests the engine is running"),
            "num_requests_waiting": (s["waiting_requests"], "requests queued in the engine"),
            "kv_slots_total": (s["kv_slots_total"], "KV pool size in tokens"),
            "kv_slots_free": (s["kv_slots_free"], "KV slots nobody holds"),
            "kv_slots_cached": (s["kv_slots_cached"], "KV slots held by the prefix cache"),
            "kv_usage_ratio": (
                1 - (s["kv_slots_free"] + s["kv_slots_cached"]) / s["kv_slots_total"],
                "share of the KV pool held by requests (the cache can give its share back)",
            ),
            "prefix_cache_hit_ratio": (
                s["cached_tokens"] / s["prompt_tokens"] if s["prompt_tokens"] else 0.0,
                "prompt tokens found in the prefix cache / prompt tokens of finished requests",
            ),
            "grammar_memory_bytes": (
                s["grammar_memory_bytes"],
                "cached grammars and the vocabulary structures they share (estimated; "
                "bounded by grammar_memory_mb)",
            ),
            "grammar_cache_entries": (s["grammar_cache_entries"], "compiled grammars cached"),
            "grammar_workers_resident_bytes": (
                s["grammar_workers_resident_bytes"],
                "resident memory of the grammar compile worker processes",
            ),
        }
        for name, (value, doc) in gauges.items():
            yield GaugeMetricFamily(f"braid_{name}", doc, value=value)
        for name in EngineStats.COUNTERS:
            yield CounterMetricFamily(f"braid_{name}", f"engine counter {name}", value=s[name])
        yield CounterMetricFamily(
            "braid_grammar_cache_evictions",
            "grammars evicted from the cache to keep within grammar_memory_mb",
            value=s["grammar_cache_evictions"],
        )
