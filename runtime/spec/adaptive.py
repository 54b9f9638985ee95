"""How many draft tokens to verify: from each request's running acceptance rate and the
measured cost of one more token in a forward; zero (speculation off for a while) when no
length pays."""

from __future__ import annotations

# Longest adaptive draft. On the CPU a forward of 1 + 16 tokens costs ~1.7x one of 1 token
# (default model, batch 1), so long copies still pay at this length.
MAX_ADAPTIVE_LENGTH = 16
# Acceptance memory: each verification step's evidence decays by this factor per step.
DECAY = 0.9
# Prior: one accepted and one rejected draft token (rate 0.5) when a request starts or resumes.
PRIOR_ACCEPTED, PRIOR_TRIALS = 1.0, 2.0
# A speculating step pays a fixed overhead besides its tokens (the tree mask, a sampling call
# per verified node), as a share of a plain decode step.
STEP_OVERHEAD = 0.03
# Steps without speculation after it stopped paying; doubled each time it stops again.
FIRST_BACKOFF, MAX_BACKOFF = 8, 256


class Acceptance:
    """One request's draft acceptance: each drafted position is a trial that succeeds when
    the target kept the draft token there (a geometric model: position i of a chain is
    reached with probability rate ** i)."""

    def __init__(self) -> None:
        self.accepted, self.trials = PRIOR_ACCEPTED, PRIOR_TRIALS
        self.off_steps = 0  # steps left with speculation off
        self.backoff = FIRST_BACKOFF

    @property
    def rate(self) -> float:
        return self.accepted / self.trials

    def record(self, accepted: int, depth: int) -> None:
        """A step accepted `accepted` tokens of a draft `depth` deep: that many successes, and
        a failure unless the whole depth was accepted."""
        self.accepted = self.accepted * DECAY + accepted
        self.trials = self.trials * DECAY + accepted + (accepted < depth)

    def choose_length(self, token_cost: float, limit: int) -> int:
        """The draft length k in [0, limit] that maximises expected tokens per unit of step
        time, (1 + a + ... + a^k) / (1 + STEP_OVERHEAD + token_cost * k), against 1 for no
        draft. token_cost: one more verified token's cost relative to the step without drafts.
        Zero turns speculation off for `backoff` steps, after which it is tried afresh."""
        if self.off_steps > 0:
            self.off_steps -= 1
            if self.off_steps == 0:
                self.accepted, self.trials = PRIOR_ACCEPTED, PRIOR_TRIALS
            return 0
        a = min(self.rate, 0.999)
        best_k, best, expected = 0, 1.0, 1.0
        for k in range(1, limit + 1):
            expected += a**k
            value = expected / (1 + STEP_OVERHEAD + token_cost * k)
            if value > best:
                best_k, best = k, value
        if best_k == 0 and limit > 0:
            self.off_steps, self.backoff = self.backoff, min(2 * self.backoff, MAX_BACKOFF)
        elif best_k > 0 and self.rate > 0.5:
            self.backoff = FIRST_BACKOFF  # it pays again: forget the earlier failures
        return best_k


class StepCost:
    """Forward time modelled as a + b * tokens, fitted online by exponentially weighted least
    squares over the engine's steps (the machine's speed drifts, so old steps fade)."""

    # Weight of the prior (b = PRIOR_SLOPE * a, about what the CPU path measures) and of old
    # observations per new one.
    PRIOR_WEIGHT, PRIOR_SLOPE, DECAY = 4.0, 0.04, 0.98

    def __init__(self) -> None:
        self._sums: list[float] | None = None  # weight, x, y, xx, xy

    def observe(self, tokens: int, seconds: float) -> None:
        if self._sums is None:
            # Prior points through this first step: (tokens, s) and (tokens + 8, s(1 + 8b/a)).
            self._sums = [0.0] * 5
            a = seconds / (1 + self.PRIOR_SLOPE * tokens)
            for x in (tokens, tokens + 8):
                self._add(x, a * (1 + self.PRIOR_SLOPE * x), self.PRIOR_WEIGHT / 2)
        self._sums = [s * self.DECAY for s in self._sums]
        self._add(tokens, seconds, 1.0)

    def _add(self, x: float, y: float, w: float) -> None:
        s = self._sums
        s[0] += w
        s[1] += w * x
        s[2] += w * y
        s[3] += w * x * x
        s[4] += w * x * y

    def fit(self) -> tuple[float, float] | None:
        """(a, b) in seconds, or None before the first step."""
        if self._sums is None:
            return None
        w, x, y, xx, xy = self._sums
        var = xx * w - x * x
        b = max((xy * w - x * y) / var, 0.0) if var > 1e-9 else 0.0
        return (y - b * x) / w, b

    def token_cost(self, base_tokens: int, extra_seconds: float = 0.0) -> float:
        """One more token's time (plus `extra_seconds` per token, a draft model's step)
        relative to a step of `base_tokens` tokens."""
        fit = self.fit()
        if fit is None:
            return self.PRIOR_SLOPE
        a, b = fit
        step = a + b * base_tokens
        return min(max((b + extra_seconds) / step, 0.005), 2.0) if step > 0 else self.PRIOR_SLOPE
