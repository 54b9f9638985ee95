"""The engine replicas behind the front: `braid serve` children on loopback ports, and
workers on other machines that joined by URL. Their health is polled; a child that dies is
started again (workers elsewhere are only routed around until they answer again)."""

from __future__ import annotations

import asyncio
import logging
import subprocess
import time
from dataclasses import dataclass, field

import httpx

from braid.runtime.cluster.processes import spawn, stop

log = logging.getLogger("braid.cluster")

# A child that keeps dying soon after its start is started again after 1 s, then 2, 4, ...
# up to this; one that ran a minute first gets the 1 s again.
_MAX_RESTART_DELAY_S = 60.0
_STABLE_S = 60.0


@dataclass
class Replica:
    index: int
    url: str
    argv: list[str] | None = None  # how to start it; None: a worker on another machine
    env: dict[str, str] = field(default_factory=dict)
    process: subprocess.Popen | None = None
    healthy: bool = False
    restarts: int = 0
    started_at: float = 0.0
    died_at: float | None = None  # when a child was found dead, until it is started again
    quick_deaths: int = 0  # deaths in a row within _STABLE_S of a start

    @property
    def local(self) -> bool:
        return self.argv is not None

    def start(self) -> None:
        self.process = spawn(self.argv, self.env)
        self.started_at = time.monotonic()
        self.healthy = False
        self.died_at = None


class ReplicaSet:
    def __init__(self, replicas: list[Replica]) -> None:
        self.replicas = replicas

    @property
    def urls(self) -> list[str]:
        return [r.url for r in self.replicas]

    def healthy(self) -> list[bool]:
        return [r.healthy for r in self.replicas]

    def start(self, timeout_s: float) -> None:
        """Start the children and wait until each answers /health (they load their models
        side by side); a child that exits meanwhile fails the start."""
        for r in self.replicas:
            if r.local:
                r.start()
        deadline = time.monotonic() + timeout_s
        waiting = [r for r in self.replicas if r.local]
        while waiting:
            for r in waiting:
                if r.process.poll() is not None:
                    raise RuntimeError(
                        f"replica {r.index} ({r.url}) exited with code {r.process.returncode} "
                        "while starting; its log is above"
                    )
                r.healthy = _answers(r.url)
            waiting = [r for r in waiting if not r.healthy]
            if waiting and time.monotonic() > deadline:
                raise RuntimeError(f"replicas {[r.index for r in waiting]} did not start in time")
            time.sleep(0.2)
        for r in self.replicas:
            if not r.local:
                r.healthy = _answers(r.url)
                if not r.healthy:
                    log.warning("worker %s does not answer yet; routed around until it does", r.url)

    async def check(self, client: httpx.AsyncClient) -> None:
        """One round: mark each replica healthy or not, and start dead children again."""

        async def probe(r: Replica) -> None:
            try:
                r.healthy = (await client.get(r.url + "/health", timeout=5)).status_code == 200
            except httpx.HTTPError:
                r.healthy = False

        for r in self.replicas:
            if r.local and r.process.poll() is not None:
                self._restart_later(r)
        await asyncio.gather(*(probe(r) for r in self.replicas if not r.died_at))

    def _restart_later(self, r: Replica) -> None:
        now = time.monotonic()
        if r.died_at is None:
            r.healthy = False
            r.died_at = now
            r.quick_deaths = r.quick_deaths + 1 if now - r.started_at < _STABLE_S else 1
            log.error(
                "replica %d (%s) exited with code %s; starting it again",
                r.index,
                r.url,
                r.process.returncode,
            )
        delay = min(_MAX_RESTART_DELAY_S, 2.0 ** (r.quick_deaths - 1))
        if now - r.died_at >= delay:
            r.restarts += 1
            r.start()

    def stop(self) -> None:
        for r in self.replicas:
            if r.process is not None:
                r.process.terminate()  # all at once, then wait for each
        for r in self.replicas:
            if r.process is not None:
                stop(r.process)


def _answers(url: str) -> bool:
    try:
        return httpx.get(url + "/health", timeout=2).status_code == 200
    except httpx.TransportError:
        return False
