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
            if self.off_steps == 0:  # try afresh, but with half the prior's weight
                self.accepted, self.trials = PRIOR_ACCEPTED / 2, PRIOR_TRIALS / 2
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
    """Decode-step time modelled as a + b * tokens, fitted online by exponentially weighted
    least squares over the engine's decode and verification steps (prefill chunks run at
    another marginal cost, and the machine's speed drifts, so old steps fade). The slope is
    pulled towards a prior (ridge), which is all it has while every step is the same size."""

    # Prior slope as a share of a one-token step: about what the CPU path measures at
    # batch 1 (default model: a verification token costs 5-10% of a decode step). Its
    # weight equals PRIOR_WEIGHT steps spread +-8 tokens around the mean.
    PRIOR_SLOPE, PRIOR_WEIGHT, DECAY = 0.06, 4.0, 0.98

    def __init__(self) -> None:
        self._sums = [0.0] * 5  # weight, x, y, xx, xy

    def observe(self, tokens: int, seconds: float) -> None:
        s = self._sums = [v * self.DECAY for v in self._sums]
        s[0] += 1
        s[1] += tokens
        s[2] += seconds
        s[3] += tokens * tokens
        s[4] += tokens * seconds

    def fit(self) -> tuple[float, float] | None:
        """(a, b) in seconds, or None before the first step."""
        w, x, y, xx, xy = self._sums
        if w == 0:
            return None
        mean_x, mean_y = x / w, y / w
        prior_b = self.PRIOR_SLOPE * mean_y / (1 + self.PRIOR_SLOPE * mean_x)
        ridge = self.PRIOR_WEIGHT * 8**2
        sxx, sxy = xx - w * mean_x**2, xy - w * mean_x * mean_y
        b = max((sxy + ridge * prior_b) / (sxx + ridge), 0.0)
        return mean_y - b * mean_x, b

    def token_cost(self, num_requests: int, extra_seconds: float = 0.0) -> float:
        """What one more draft token of one request costs, relative to that request's share
        of a decode step of `num_requests` requests: the token lengthens the step for all
        of them, so at batch B it weighs B * b / step (plus `extra_seconds`, a draft model's
        step, which the batch shares)."""
        fit = self.fit()
        if fit is None:
            return self.PRIOR_SLOPE
        a, b = fit
        step = a + b * num_requests
        cost = (num_requests * b + extra_seconds) / step if step > 0 else self.PRIOR_SLOPE
        return min(max(cost, 0.005), 4.0)
