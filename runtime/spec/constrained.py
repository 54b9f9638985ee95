"""Draft paths through a request's constraint: a draft token the grammar refuses ends the
path; text the grammar forces after a token joins the path as free draft tokens
(verification follows them like any other)."""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from braid.runtime.scheduler.request import Request


def draft_step(r: Request, token: int) -> list[int] | None:
    """The tokens a draft path of r takes for draft `token`: [token] plus any the grammar
    forces after it, or None where the path must end (r.constraint.reset_draft() undoes the
    walk)."""
    if r.constraint is None or token in r.stop_ids:
        return [token]
    return r.constraint.push_draft(token)
