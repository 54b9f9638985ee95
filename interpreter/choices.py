"""How `select` picks a choice from its tokens' logprobs.

Every choice is scored from the same token position (where the tokenizations of the choices
after the prefix first differ from the prefix's own), so no choice is credited or charged for
a token another choice does not have. Each method maps a list of per-token logprobs for each
choice to a score per choice; the highest wins, the earliest on ties.
"""

from __future__ import annotations

from collections.abc import Sequence


def token_length_normalized(logprobs: Sequence[Sequence[float]], _=None) -> list[float]:
    """Mean logprob per token: the default, fair to choices of different lengths."""
    return [sum(lp) / len(lp) for lp in logprobs]


def greedy(logprobs: Sequence[Sequence[float]], _=None) -> list[float]:
    """Greedy token selection: the choice a greedy decoder would follow furthest. At each
    position keep the choices whose token is the most likely there; a choice that has ended
    drops out while others go on. The winner scores 1, the rest 0."""
    alive = list(range(len(logprobs)))
    pos = 0
    while len(alive) > 1:
        going = [i for i in alive if pos < len(logprobs[i])]
        if not going:
            break
        best = max(logprobs[i][pos] for i in going)
        alive = [i for i in going if logprobs[i][pos] == best]
        pos += 1
    return [1.0 if i == alive[0] else 0.0 for i in range(len(logprobs))]


def unconditional_likelihood_normalized(
    logprobs: Sequence[Sequence[float]], unconditional: Sequence[Sequence[float]]
) -> list[float]:
    """Mean per-token gain of logprob the context brings over the choice's own prior
    (its logprobs after only the message opening): favours answers the question makes
    likely over answers that are likely anyway (surface-form competition)."""
    return [(sum(lp) - sum(u)) / len(lp) for lp, u in zip(logprobs, unconditional, strict=True)]


METHODS = {
    "token_length_normalized": token_length_normalized,
    "greedy": greedy,
    "unconditional_likelihood_normalized": unconditional_likelihood_normalized,
}


def needs_unconditional(method: str) -> bool:
    return method == "unconditional_likelihood_normalized"
