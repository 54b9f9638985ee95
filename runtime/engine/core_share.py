"""How many threads the engine's CPU work should use while other programs share the cores.

OpenMP teams wait for each other at every parallel region's end. When another program keeps
one of our cores busy, the thread on it runs a fraction of the time and every region waits
for it: two busy loops beside a 2-thread decode left it at a fraction of its quiet speed
(docs/benchmarks.md). A team no larger than the cores others leave free runs at their speed.

So the engine thread samples, every SAMPLE_S of wall time, how much CPU time the cores this
process may run on spent on other programs (/proc/stat's busy time, less this process's own)
and sizes torch's thread pool (which the C++ kernels use too) to the cores left: at least
one, at most what it was configured with. A new size is taken once two samples in a row
agree, so a burst of other work does not resize the team back and forth.
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Callable

log = logging.getLogger(__name__)

SAMPLE_S = 0.25


def _cpu_busy_seconds(cpus: set[int]) -> float | None:
    """Busy time (user, nice, system, irq, softirq, steal) of `cpus` since boot, in seconds;
    None where /proc/stat cannot be read."""
    try:
        with open("/proc/stat") as f:
            lines = f.readlines()
    except OSError:
        return None
    ticks = os.sysconf("SC_CLK_TCK")
    busy = 0
    for line in lines:
        name, *fields = line.split()
        if name.startswith("cpu") and name[3:].isdigit() and int(name[3:]) in cpus:
            user, nice, system, _idle, _iowait, irq, softirq, steal = map(int, fields[:8])
            busy += user + nice + system + irq + softirq + steal
    return busy / ticks


class CoreShare:
    """Samples the cores' use; `threads()` is the team size to run the next step with."""

    def __init__(
        self,
        max_threads: int,
        cores: set[int] | None = None,
        busy_seconds: Callable[[], float | None] | None = None,
        own_seconds: Callable[[], float] = time.process_time,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        """`cores`: the CPUs this process may run on (default: its affinity); the callables
        (tests give their own) read their busy seconds, this process's CPU seconds and the
        time."""
        self.max_threads = max_threads
        cpus = os.sched_getaffinity(0) if cores is None else cores
        self._cores = len(cpus)
        self._busy = busy_seconds or (lambda: _cpu_busy_seconds(cpus))
        self._own, self._clock = own_seconds, clock
        self._last = self._sample()
        self._threads, self._proposed = max_threads, max_threads

    def _sample(self) -> tuple[float, float | None, float]:
        return self._clock(), self._busy(), self._own()

    def threads(self) -> int:
        now = self._clock()
        if self.max_threads <= 1 or now - self._last[0] < SAMPLE_S:
            return self._threads
        sample = self._sample()
        (t0, busy0, own0), (t1, busy1, own1) = self._last, sample
        self._last = sample
        if busy0 is None or busy1 is None:
            return self._threads
        others = max(0.0, (busy1 - busy0) - (own1 - own0)) / (t1 - t0)  # cores' worth
        free = max(1, min(self.max_threads, round(self._cores - others)))
        if free == self._proposed and free != self._threads:
            log.info("other programs use %.1f cores: %d threads", others, free)
            self._threads = free
        self._proposed = free
        return self._threads
