"""ProgramState: what a program writes to (`s += ...`) and what a run returns."""

from __future__ import annotations

import copy
from collections.abc import AsyncIterator, Iterable, Iterator
from contextlib import AbstractContextManager, contextmanager
from typing import Any

from braid.api import role_message
from braid.interpreter.executor import StreamExecutor
from braid.interpreter.ir import Op, RoleBegin, RoleEnd, VarScopeBegin, VarScopeEnd
from braid.meta_info import sglang_last_piece_info, sglang_meta_info, sglang_piece_info
from braid.trace import Trace, build_trace


class ProgramState:
    """The text of a program so far, its messages and variables.

    `s += x` appends text, gen, select or a role message and returns at once; `s[name]`
    waits for the gen or select that sets `name`. SGLang's names work too: get_var,
    set_var, get_meta_info, var_scope, sync, copy, ret_value.
    """

    def __init__(self, executor: StreamExecutor, program: str = "program") -> None:
        self._executor = executor
        self._program = program  # the name its trace shows
        self.ret_value: Any = None  # what the program function returned (SGLang's name)

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

    def __setitem__(self, name: str, value: Any) -> None:
        self.set_var(name, value)

    def __contains__(self, name: str) -> bool:
        """Whether variable `name` is set once what was appended before has run."""
        self._executor.sync()
        return name in self._executor.variables

    def get_var(self, name: str) -> Any:
        """`s[name]`, SGLang's name."""
        return self[name]

    def set_var(self, name: str, value: Any) -> None:
        """Set variable `name` to `value` at this point of the program (after what was
        appended before it); on a finished state, once what is still running has run."""
        self._executor.set_var(name, value)

    def meta(self, name: str) -> dict:
        """What the gen or select `name` reports: token counts, cached tokens, finish reason,
        token ids; logprobs when asked for; a select's choices with their scores and token
        logprobs."""
        return self._executor.get_meta(name)

    def get_meta_info(self, name: str) -> dict | None:
        """`meta(name)` in SGLang's shape: prompt_tokens, completion_tokens, cached_tokens,
        finish_reason, and [logprob, token id, text] listings when logprobs were asked for
        (output_token_logprobs, output_top_logprobs, input_token_logprobs); a select's
        normalized_prompt_logprobs and input_token_logprobs."""
        return sglang_meta_info(self.meta(name), self._executor.backend.token_texts)

    def text(self) -> str:
        """The whole text so far (waits for what was appended before)."""
        self._executor.sync()
        return self._executor.text

    def messages(self) -> list[dict[str, str]]:
        """The chat messages so far, as {"role", "content"} dicts; an assistant message that
        a reasoning gen wrote in has its thought in "reasoning_content" and its answer alone
        in "content"."""
        self._executor.sync()
        return copy.deepcopy(self._executor.messages)

    def variables(self) -> dict[str, Any]:
        self._executor.sync()
        return dict(self._executor.variables)

    def sync(self) -> None:
        """Wait until what was appended so far has run (or the state has failed)."""
        self._executor.sync()

    def trace(self) -> Trace:
        """The record of this run, once it and its forks have finished: `trace.to_html(path)`
        writes the page. Only a traced run keeps one (run(..., trace=True) or BRAID_TRACE=1)."""
        self._executor.wait()
        return build_trace(self._executor, self._program)

    @property
    def error(self) -> BaseException | None:
        """Why the program failed, or None."""
        return self._executor.error

    def fork(self, n: int = 1) -> ForkList:
        """n child states that start from this state's text at this point; what is appended
        to each runs concurrently, and the shared prefix is computed once."""
        if not isinstance(n, int) or n < 1:
            raise ValueError(f"fork(n): n must be an int >= 1, got {n!r}")
        states = (ProgramState(e, self._program) for e in self._executor.fork(n))
        return ForkList(states, self._executor)

    @contextmanager
    def copy(self) -> Iterator[ProgramState]:
        """SGLang's `with s.copy() as c: c += ...`: a fork of one, joined when the block
        ends (the variables it set come to this state as one-item lists)."""
        forks = self.fork(1)
        yield forks[0]
        forks.join()

    def text_iter(self, name: str | None = None, *, var_name: str | None = None) -> Iterator[str]:
        """The program's text as it is generated (only variable `name`'s, if given;
        `var_name` is SGLang's keyword for it), in pieces that are never empty."""
        return (str(piece) for piece in self._executor.iter_text(name or var_name) if piece)

    def text_async_iter(
        self,
        name: str | None = None,
        return_meta_data: bool = False,
        *,
        var_name: str | None = None,
    ) -> AsyncIterator[Any]:
        """`text_iter` for `async for`. With `return_meta_data` (SGLang's), it yields
        (text, meta_info) for variable `name`, as SGLang's streamed gens do: each piece's
        meta_info has completion_tokens (the gen's tokens so far) and, when the gen asked for
        logprobs, the listings of the piece's own tokens (output_token_logprobs,
        output_top_logprobs) with output_token_logprobs_length (so far); the last piece's is
        the gen's get_meta_info with the listings cut the same way. No piece is empty: a gen
        that writes no text yields nothing."""
        name = name or var_name
        if not return_meta_data:
            return self._aiter_pieces(name)
        if name is None:
            raise ValueError("text_async_iter(return_meta_data=True) needs a variable name")
        return self._aiter_with_meta(name)

    async def _aiter_pieces(self, name: str | None) -> AsyncIterator[str]:
        async for piece in self._executor.aiter_text(name):
            if piece:
                yield str(piece)

    async def _aiter_with_meta(self, name: str) -> AsyncIterator[tuple[str, dict | None]]:
        token_texts = self._executor.backend.token_texts
        held, done = None, 0  # each piece waits for the next, so the last can carry the meta
        async for piece in self._executor.aiter_text(name):
            if not piece:
                continue
            if held is not None:
                done += len(getattr(held, "token_ids", ()))
                yield str(held), sglang_piece_info(held, done, token_texts)
            held = piece
        if held is not None:  # its tokens run to the gen's last (an EOS writes no text)
            yield str(held), sglang_last_piece_info(self.get_meta_info(name), done)

    @contextmanager
    def var_scope(self, name: str) -> Iterator[ProgramState]:
        """`with s.var_scope(name): s += ...`: the text appended inside becomes variable
        `name`."""
        self += VarScopeBegin(name)
        yield self
        self += VarScopeEnd(name)

    def system(self, *parts: Any) -> AbstractContextManager[ProgramState] | None:
        """`with s.system(): s += ...` appends a system message; `s.system(parts...)`
        appends one made of `parts` at once."""
        return self._role("system", parts)

    def user(self, *parts: Any) -> AbstractContextManager[ProgramState] | None:
        return self._role("user", parts)

    def assistant(
        self, *parts: Any, thinking: bool | None = None
    ) -> AbstractContextManager[ProgramState] | None:
        """As `system`; the message opens as braid.assistant's does (`thinking` too). Inside
        `with s.assistant():` the opening is written with the first text appended."""
        return self._role("assistant", parts, thinking)

    def _role(
        self, role: str, parts: tuple[Any, ...], thinking: bool | None = None
    ) -> AbstractContextManager[ProgramState] | None:
        if parts:
            self += role_message(role, parts, thinking)
            return None
        return self._role_block(role, thinking)

    @contextmanager
    def _role_block(self, role: str, thinking: bool | None) -> Iterator[ProgramState]:
        self += RoleBegin(role, thinking)
        yield self
        self += RoleEnd(role)

    def __str__(self) -> str:
        """SGLang's: "ProgramState(<the whole text so far>)" (waits for what was appended
        before); its programs cut the text out of it (cot_decoding does)."""
        return f"ProgramState({self.text()})"

    def __repr__(self) -> str:
        return f"<ProgramState {len(self._executor.text)} chars, error={self.error!r}>"


class ForkList(list):
    """The states of a fork. `forks += x` appends x to each of them; `forks += f` appends
    f(i) to the i-th, and `forks += [x0, x1, ...]` xi to the i-th (SGLang's forms)."""

    def __init__(self, states: Iterable[ProgramState], parent: StreamExecutor) -> None:
        super().__init__(states)
        self._parent = parent

    def __iadd__(self, other: Any) -> ForkList:
        for i, state in enumerate(self):
            state += self._part(other, i)
        return self

    def _part(self, other: Any, i: int) -> Any:
        if isinstance(other, list | tuple):
            if len(other) != len(self):
                raise ValueError(f"forks += list: give one item per fork ({len(self)})")
            return other[i]
        if callable(other):
            return other(i)
        return other

    def join(self, mode: str = "gather_variable") -> None:
        """Wait until every fork has run what was appended to it; then the parent state
        gets, as SGLang's join does, each variable the forks set and it lacks as the list of
        their values ("gather_variable", the default) or the text the forks added, one after
        the other ("concate_and_append")."""
        self._parent.join([state._executor for state in self], mode)
