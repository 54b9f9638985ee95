"""Engine counters and latency percentiles, read by `engine.stats()` and the server."""

from __future__ import annotations

import threading
from collections import deque

from braid.runtime.config import SPEC_METHODS as CONFIG_SPEC_METHODS

# Latency samples kept per metric: enough for stable p99s, bounded so memory stays flat.
_WINDOW = 10_000
# The methods counted apart: every spec_method that speculates.
SPEC_METHODS = tuple(m for m in CONFIG_SPEC_METHODS if m != "none")


class EngineStats:
    COUNTERS = (
        "requests_finished",
        "requests_aborted",
        "prompt_tokens",
        "cached_tokens",
        "prefill_tokens_computed",
        "decode_tokens",
        "jump_forward_tokens",  # forced by a grammar, appended without sampling
        "preemptions",
        "evicted_tokens",
        "forward_steps",
        # Speculative decoding: verification steps, draft tokens proposed and accepted, in
        # all and per method (n-gram and draft model; a grammar's forced text inside a draft
        # counts as proposed).
        "spec_steps",
        "spec_proposed_tokens",
        "spec_accepted_tokens",
        *(
            f"spec_{m}_{c}"
            for m in SPEC_METHODS
            for c in ("steps", "proposed_tokens", "accepted_tokens")
        ),
    )

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.counters = dict.fromkeys(self.COUNTERS, 0)
        self.latencies: dict[str, deque[float]] = {
            "ttft_s": deque(maxlen=_WINDOW),  # arrival -> first token
            "tpot_s": deque(maxlen=_WINDOW),  # mean time per output token after the first
            "e2e_s": deque(maxlen=_WINDOW),  # arrival -> finish
        }

    def add(self, **counts: int) -> None:
        with self._lock:
            for name, n in counts.items():
                self.counters[name] += n

    def observe(self, name: str, seconds: float) -> None:
        with self._lock:
            self.latencies[name].append(seconds)

    def snapshot(self) -> dict:
        with self._lock:
            out: dict = dict(self.counters)
            # Mean draft tokens accepted per verification step (the step's own token aside).
            for prefix in ("spec", *(f"spec_{m}" for m in SPEC_METHODS)):
                steps = out[f"{prefix}_steps"]
                accepted = out[f"{prefix}_accepted_tokens"]
                out[f"{prefix}_mean_accepted_length"] = accepted / steps if steps else None
            for name, values in self.latencies.items():
                ordered = sorted(values)
                for q in (50, 90, 99):
                    key = f"{name.removesuffix('_s')}_p{q}_s"
                    out[key] = percentile(ordered, q)
            return out


def percentile(ordered: list[float], q: int) -> float | None:
    """The q-th percentile of sorted values (nearest rank), None if there are none."""
    if not ordered:
        return None
    return ordered[min(len(ordered) - 1, round(q / 100 * (len(ordered) - 1)))]
