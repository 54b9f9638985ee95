"""SGLang's router (the `sglang-router` package: Rust) as a child process of the front.

It spreads /generate and the OpenAI routes over the replicas with its cache-aware policy
(an approximate radix tree of the text each worker was sent: a request goes to the worker
holding the longest match, unless the load is too uneven), checks the workers' health,
routes around those that fail and retries requests that failed before their response
started. Run as `python -m braid.runtime.cluster.router`, it reads its settings from the
environment, so an API key never shows in the process list.
"""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
import time
from dataclasses import asdict, dataclass, field

import httpx

from braid.runtime.cluster.processes import free_port, spawn, stop

_SETTINGS_ENV = "BRAID_ROUTER_SETTINGS"


@dataclass
class RouterSettings:
    """What braid passes to sglang-router's RouterArgs (its names)."""

    worker_urls: list[str]
    policy: str = "cache_aware"
    host: str = "127.0.0.1"  # only the front talks to it
    port: int = field(default_factory=free_port)
    prometheus_host: str = "127.0.0.1"
    prometheus_port: int = field(default_factory=free_port)
    # Its default is 60 s: a replica that died would take a minute to be routed around.
    health_check_interval_secs: int = 1
    health_failure_threshold: int = 2
    health_success_threshold: int = 1
    # A request that fails before its response starts (its replica died) is tried 7 times
    # over 5.1 s (backoffs 0.1, 0.2, 0.4, 0.8, 1.6, 2 s): the cache-aware policy keeps
    # choosing the dead replica until two health checks (~2 s) have failed, and the retries
    # must outlast that.
    retry_max_retries: int = 7
    retry_initial_backoff_ms: int = 100
    retry_backoff_multiplier: float = 2.0
    retry_max_backoff_ms: int = 2000
    # Every replica is healthy before the router starts; a worker joining by URL may not be.
    worker_startup_timeout_secs: int = 600
    api_key: str | None = None  # sent to the workers
    log_level: str = "warn"

    def __post_init__(self) -> None:
        if not self.worker_urls:
            raise ValueError("the router needs at least one worker URL")


class SGLangRouter:
    def __init__(self, settings: RouterSettings) -> None:
        if importlib.util.find_spec("sglang_router") is None:
            raise ValueError("braid serve --dp needs SGLang's router: pip install 'braid[cluster]'")
        self.settings = settings
        self.url = f"http://{settings.host}:{settings.port}"
        self.metrics_url = f"http://{settings.prometheus_host}:{settings.prometheus_port}/metrics"
        self.process: subprocess.Popen | None = None
        self.restarts = 0

    def start(self) -> None:
        env = {**os.environ, _SETTINGS_ENV: json.dumps(asdict(self.settings))}
        self.process = spawn([sys.executable, "-m", "braid.runtime.cluster.router"], env)

    def wait_ready(self, timeout_s: float = 120.0) -> None:
        """Until it lists a healthy worker (it registers them in the background). Its
        /readiness would say so too, but logs an error each time it says no."""
        key = self.settings.api_key  # it guards its own routes with the workers' key too
        headers = {"authorization": f"Bearer {key}"} if key else {}
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise RuntimeError(f"the SGLang router exited with code {self.process.returncode}")
            try:
                reply = httpx.get(self.url + "/workers", headers=headers, timeout=2)
                workers = reply.json()["workers"]
                if any(w["is_healthy"] for w in workers):
                    return
            except (httpx.TransportError, ValueError, KeyError):
                pass
            time.sleep(0.1)
        raise RuntimeError(f"the SGLang router was not ready after {timeout_s:g} s")

    def restart_if_dead(self) -> bool:
        """Start it again if it exited; True if it did."""
        if self.process is None or self.process.poll() is None:
            return False
        self.restarts += 1
        self.start()
        return True

    def stop(self) -> None:
        if self.process is not None:
            stop(self.process)


def main() -> None:
    from sglang_router.launch_router import launch_router
    from sglang_router.router_args import RouterArgs

    launch_router(RouterArgs(**json.loads(os.environ.pop(_SETTINGS_ENV))))


if __name__ == "__main__":
    main()
