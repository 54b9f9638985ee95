"""What callers hand the engine thread: one message type per kind of work, handled between
steps in the order they arrive (EngineLoop.handle dispatches on the type)."""

from __future__ import annotations

import threading
from collections.abc import Callable, Hashable
from concurrent.futures import Future
from dataclasses import dataclass
from typing import Any

from braid.runtime.engine.embedding import EmbedJob
from braid.runtime.scheduler.request import Request


@dataclass(frozen=True)
class Add:
    """A new request for the scheduler."""

    request: Request


@dataclass(frozen=True)
class Abort:
    """End request `rid` (finish_reason "abort"), if it is still live."""

    rid: int


@dataclass(frozen=True)
class Release:
    """Program state `key` will not continue: its leased prefix becomes ordinary cache."""

    key: Hashable


@dataclass(frozen=True)
class Flush:
    """Drop every cached prefix no running request uses, then set `done`."""

    done: threading.Event


@dataclass(frozen=True)
class Call:
    """Run `job` on the engine thread; its result (or exception) goes to `done`."""

    job: Callable[[], Any]
    done: Future


@dataclass(frozen=True)
class Embed:
    """One turn of an embedding job (it is posted again until the job is done)."""

    job: EmbedJob


Message = Add | Abort | Release | Flush | Call | Embed
