"""ProgramState: what a program writes to (`s += ...`) and what a run returns."""

from __future__ import annotations

import copy
from collections.abc import AsyncIterator, Iterator
from contextlib import contextmanager
from typing import Any

from braid.interpreter.executor import StreamExecutor
from braid.interpreter.ir import Op, RoleBegin, RoleEnd


class ProgramState:
    """The text of a program so far, its messages and variables.

    `s += x` appends text, gen, select or a role message and returns at once; `s[name]`
    waits for the gen or select that sets `name`.
    """

    def __init__(self, executor: StreamExecutor) -> None:
        self._executor = executor

    def __iadd__(self, other: Any) -> ProgramState:
        if not isinstance(other, Op):
            raise TypeError(
                f"cannot append {type(other).__name__} to a program state; append text, "
                "gen(...), select(...) or a role message"
            )
        self._executor.submit(other)
        return self

    def __getitem__(self, name: str) -> Any:
        return self._executor.get(name)

    def meta(self, name: str) -> dict:
        """What the gen or select `name` reports: token counts, cached tokens, finish reason,
        logprobs when asked for; a select's choices with their scores and token logprobs."""
        return self._executor.get_meta(name)

    def text(self) -> str:
        """The whole text so far (waits for what was appended before)."""
        self._executor.sync()
        return self._executor.text

    def messages(self) -> list[dict[str, str]]:
        """The chat messages so far, as {"role", "content"} dicts."""
        self._executor.sync()
        return copy.deepcopy(self._executor.messages)

    def variables(self) -> dict[str, Any]:
        self._executor.sync()
        return dict(self._executor.variables)

    @property
    def error(self) -> BaseException | None:
        """Why the program failed, or None."""
        return self._executor.error

    def fork(self, n: int) -> ForkList:
        """n child states that start from this state's text at this point; what is appended
        to each runs concurrently, and the shared prefix is computed once."""
        if not isinstance(n, int) or n < 1:
            raise ValueError(f"fork(n): n must be an int >= 1, got {n!r}")
        return ForkList(ProgramState(e) for e in self._executor.fork(n))

    def text_iter(self, name: str | None = None) -> Iterator[str]:
        """The program's text as it is generated (only variable `name`'s, if given)."""
        return self._executor.iter_text(name)

    def text_async_iter(self, name: str | None = None) -> AsyncIterator[str]:
        """`text_iter` for `async for`."""
        return self._executor.aiter_text(name)

    @contextmanager
    def system(self) -> Iterator[ProgramState]:
        """`with s.system(): s += ...` appends a system message."""
        yield from self._role("system")

    @contextmanager
    def user(self) -> Iterator[ProgramState]:
        yield from self._role("user")

    @contextmanager
    def assistant(self) -> Iterator[ProgramState]:
        yield from self._role("assistant")

    def _role(self, role: str) -> Iterator[ProgramState]:
        self += RoleBegin(role)
        yield self
        self += RoleEnd(role)

    def __repr__(self) -> str:
        return f"<ProgramState {len(self._executor.text)} chars, error={self.error!r}>"


class ForkList(list):
    """The states of a fork. `forks += x` appends x to each of them."""

    def __iadd__(self, other: Any) -> ForkList:
        for state in self:
            state += other
        return self

    def join(self) -> None:
        """Wait until every fork has run what was appended to it."""
        for state in self:
            state.text()
