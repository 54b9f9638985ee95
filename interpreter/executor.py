"""StreamExecutor: runs one program state's operations in order.

The program's thread only appends operations (`submit` returns at once), so a program keeps
going while its gens run, and independent states (forks, a batch of programs) have their
requests in the engine at the same time. The operations run as a task on the interpreter's
event loop; reading a variable waits for the operation that sets it. After an operation
fails, the rest are dropped and every read raises the failure.

What the runtime learns from a state, on backends that use it (LocalBackend,
RemoteBackend; the others ignore it): each state has a program id on its gens' requests, so
the engine keeps the state's prefix leased between them (runtime/kvcache/leases.py), until
the state is done (or failed, or its fork joined) and releases it; and a gen's constraint
starts compiling when the gen is submitted, not when the operations before it have run.
"""

from __future__ import annotations

import asyncio
import copy
import threading
import time
import uuid
from collections import deque
from collections.abc import AsyncIterator, Callable, Iterator
from concurrent.futures import Future
from dataclasses import dataclass
from functools import singledispatchmethod
from typing import Any

import msgspec

from braid.interpreter import openings
from braid.interpreter.backend import Backend
from braid.interpreter.captured import Captured
from braid.interpreter.choices import METHODS, needs_unconditional
from braid.interpreter.event_loop import interpreter_loop
from braid.interpreter.ir import (
    Gen,
    Parts,
    Role,
    RoleBegin,
    RoleEnd,
    Select,
    SetVar,
    VarScopeBegin,
    VarScopeEnd,
)

# How forks join their parent (SGLang's modes): their new variables gathered into lists, or
# their text since the fork appended.
JOIN_MODES = ("gather_variable", "concate_and_append")


class ProgramError(RuntimeError):
    """An operation of the program failed; `__cause__` holds why."""


@dataclass
class _ForkPoint:
    """Hands the parent's state, as it is when reached, to the children of a fork."""

    children: list[Future]
    states: list[StreamExecutor]


@dataclass
class _Inherit:
    parent: Future


@dataclass
class _Join:
    children: list[StreamExecutor]
    mode: str


@dataclass
class _Snapshot:
    text: str
    messages: list[dict[str, str]]
    open_role: str | None
    variables: dict[str, Any]
    metas: dict[str, dict]
    ends_in_markup: bool


class StreamExecutor:
    def __init__(
        self,
        backend: Backend,
        sampling: dict[str, Any],
        parent: Future | None = None,
        *,
        keep_undecodable_text: bool = False,
        thinks_by_default: bool = False,
        lora: str | None = None,
        trace: bool = False,
    ) -> None:
        self.backend = backend
        self.sampling = sampling  # the program's SamplingParams defaults for every gen
        self.lora = lora  # the program's LoRA adapter (None: the base model's); a gen's wins
        # A typed gen whose text does not decode keeps the text instead of failing the state
        # (SGLang's programs: their variables hold the text as generated).
        self.keep_undecodable_text = keep_undecodable_text
        # A gen that writes an assistant message's first text on a model that thinks (and
        # whose opening leaves it free to) is a reasoning gen unless it or the run says
        # otherwise: braid's programs, as the server's replies; SGLang's keep the raw text.
        self.thinks_by_default = thinks_by_default
        self.children: list[StreamExecutor] = []
        self._loop = interpreter_loop()
        self._cond = threading.Condition()
        self._ops: deque = deque()
        self._draining = False
        self._closed = False  # the program function returned: nothing more will come
        self._watchers: list[Callable[[], None]] = []  # asyncio readers' wake-ups
        self.done: Future[None] = Future()  # set when closed and every operation ran
        # The state; written on the loop thread under _cond.
        self.text = ""
        self.messages: list[dict[str, str]] = []
        self.open_role: str | None = None
        # The text ends in template markup (a role's opening or end), not in text the program
        # or a model wrote: a gen there is not token-healed (its boundary is the template's).
        self.ends_in_markup = False
        self.variables: dict[str, Any] = {}
        self.metas: dict[str, dict] = {}
        self.error: BaseException | None = None
        self.chunks: list[tuple[str | None, str]] = []  # (variable or None, text) as appended
        self.fork_start = 0  # a fork's text before this position is its parent's
        self._scopes: dict[str, int] = {}  # open var_scope name -> where its text starts
        # An open assistant message's opening, not written until its first text shows who
        # writes it: (as a history turn opens, as the generation prompt opens). See RoleBegin.
        self._pending_opening: tuple[str, str] | None = None
        # With tracing, what each gen, select, fork and join did, in order (lang/trace.py
        # reads them); None otherwise, and nothing is recorded.
        self.events: list[dict] | None = [] if trace else None
        # This state's name on its requests (a lease on its prefix, where the backend keeps
        # leases). `_leased`: a request may have left a lease to release.
        self.program_id = uuid.uuid4().hex
        self._leased = False
        if parent is not None:
            self.submit(_Inherit(parent))

    # ---- the program's thread ---------------------------------------------------------

    def submit(self, op: object) -> bool:
        """Queue an operation; False if it was dropped because the state has failed."""
        self._prepare_ahead(op)  # outside the lock: a first compile builds the vocabulary
        with self._cond:
            if self._closed:
                raise RuntimeError("this program has finished; its state takes no more text")
            if self.error is not None:
                return False
            self._ops.append(op)
            if self._draining:
                return True
            self._draining = True
        asyncio.run_coroutine_threadsafe(self._drain(), self._loop)
        return True

    def fork(self, n: int) -> list[StreamExecutor]:
        parents = [Future() for _ in range(n)]
        children = [
            StreamExecutor(
                self.backend,
                self.sampling,
                parent=f,
                keep_undecodable_text=self.keep_undecodable_text,
                thinks_by_default=self.thinks_by_default,
                lora=self.lora,
                trace=self.events is not None,
            )
            for f in parents
        ]
        self.children += children
        if not self.submit(_ForkPoint(parents, children)):
            for f in parents:
                f.set_exception(ProgramError("the parent state failed before the fork"))
        return children

    def set_var(self, name: str, value: Any) -> None:
        """Set variable `name` to `value`. While the program function runs, in order: after
        what it appended before (SGLang sets it at once, so a gen of the same name still
        running would overwrite it, and the program could not rely on the order). Once the
        function has returned nothing can follow it, so it is set as soon as what is still
        queued has run: SGLang's `state[name] = int(state[name])` on a finished state."""
        with self._cond:  # a reentrant lock: submit takes it too
            if not self._closed:
                self.submit(SetVar(name, value))
                return
            self._cond.wait_for(lambda: self.error is not None or self._idle())
            self.variables[name] = value
            # A gen's meta stays, as in SGLang: it still tells how the value was generated.
            self.metas.setdefault(name, {})
            self._settle()

    def join(self, children: list[StreamExecutor], mode: str) -> None:
        """Wait until the forks `children` have run what was appended to them, then, in this
        state's order, gather the variables they set into lists or append the text they
        added (JOIN_MODES)."""
        if mode not in JOIN_MODES:
            raise ValueError(f"join(mode={mode!r}): the mode is one of {list(JOIN_MODES)}")
        for child in children:
            child.sync()
        self.submit(_Join(children, mode))

    def close(self) -> None:
        """The program function has returned (or raised): no more operations."""
        with self._cond:
            self._closed = True
            self._settle()
        for child in self.children:
            child.close()

    def fail(self, error: BaseException) -> None:
        with self._cond:
            if self.error is None:
                self.error = error
            self._drop_pending()
            self._settle()

    def wait(self, timeout: float | None = None) -> None:
        """Until this state and every fork under it have run all their operations."""
        for f in self.all_done():
            f.result(timeout)

    def all_done(self) -> list[Future]:
        return [self.done] + [f for c in self.children for f in c.all_done()]

    def get(self, name: str) -> Any:
        with self._cond:
            self._cond.wait_for(
                lambda: name in self.variables or self.error is not None or self._idle()
            )
            if name in self.variables:
                return self.variables[name]
            if self.error is not None:
                raise ProgramError(f"cannot read {name!r}: the program failed") from self.error
            raise KeyError(f"no variable {name!r}: no gen or select so named has run")

    def get_meta(self, name: str) -> dict:
        self.get(name)
        return self.metas[name]

    def sync(self) -> None:
        """Until every operation submitted so far has run, or the state has failed."""
        with self._cond:
            self._cond.wait_for(lambda: self.error is not None or self._idle())

    def iter_text(self, name: str | None) -> Iterator[str]:
        """Text as it is appended (only variable `name`'s, if given), until it is complete."""
        seen = 0
        while True:
            with self._cond:
                while seen == len(self.chunks) and not self._complete(name):
                    self._cond.wait()
                new, seen = self.chunks[seen:], len(self.chunks)
                complete = self._complete(name)
            yield from (text for var, text in new if name is None or var == name)
            if complete and not new:
                break
        if self.error is not None and name not in self.variables:
            raise ProgramError("the program failed") from self.error

    async def aiter_text(self, name: str | None) -> AsyncIterator[str]:
        """`iter_text` for asyncio callers: waits without blocking their event loop."""
        loop = asyncio.get_running_loop()
        changed = asyncio.Event()

        def wake() -> None:
            loop.call_soon_threadsafe(changed.set)

        with self._cond:
            self._watchers.append(wake)
        try:
            seen = 0
            while True:
                changed.clear()
                with self._cond:
                    new, seen = self.chunks[seen:], len(self.chunks)
                    complete = self._complete(name)
                for var, text in new:
                    if name is None or var == name:
                        yield text
                if complete and not new:
                    break
                if not complete:
                    await changed.wait()
        finally:
            with self._cond:
                self._watchers.remove(wake)
        if self.error is not None and name not in self.variables:
            raise ProgramError("the program failed") from self.error

    def _prepare_ahead(self, op: object) -> None:
        """Start compiling the constraints of `op`'s gens now (the compile cache hands the
        result to the gen when it runs)."""
        for gen in _gens(op):
            try:
                params = gen.params(self.sampling)
                if params.constraint is not None:
                    self.backend.compile_ahead(params)
            except Exception:  # the gen raises it in its turn, as without compiling ahead
                pass

    def _release_lease(self) -> None:
        """Tell the backend this state will not continue (once: later calls do nothing)."""
        if self._leased:
            self._leased = False
            asyncio.run_coroutine_threadsafe(
                self.backend.release_program(self.program_id, self.lora), self._loop
            )

    # ---- bookkeeping (callers hold _cond) ---------------------------------------------

    def _idle(self) -> bool:
        return not self._ops and not self._draining

    def _complete(self, name: str | None) -> bool:
        if self.error is not None or (name is not None and name in self.variables):
            return True
        return self._closed and self._idle()

    def _settle(self) -> None:
        """Wake readers, and mark the state done once it is closed and idle."""
        self._cond.notify_all()
        for wake in self._watchers:
            wake()
        if (self._closed or self.error is not None) and self._idle() and not self.done.done():
            self._release_lease()
            self.done.set_result(None)

    def _drop_pending(self) -> None:
        for op in self._ops:
            if isinstance(op, _ForkPoint):
                for f in op.children:
                    f.set_exception(ProgramError("the parent state failed before the fork"))
        self._ops.clear()

    # ---- the interpreter loop ---------------------------------------------------------

    async def _drain(self) -> None:
        while True:
            with self._cond:
                if not self._ops or self.error is not None:
                    self._draining = False
                    self._settle()
                    return
                op = self._ops.popleft()
            try:
                await self._run(op)
            except BaseException as e:  # the state fails; the loop and other states go on
                self.fail(e)

    def _append(
        self, text: str, var: str | None = None, *, content: bool = True, markup: bool = False
    ) -> None:
        """Append `text` (written by variable `var`'s gen or select, if any); `content`: it
        belongs to the open message's content (a message's opening does not); `markup`: it
        is template markup (a role's opening or end)."""
        with self._cond:
            if text:
                self.ends_in_markup = markup
            self.text += text
            if self.open_role is not None and content:
                self.messages[-1]["content"] += text
            self.chunks.append((var, text))
            self._settle()

    def _set(self, name: str | None, value: Any, meta: dict) -> None:
        if name is None:
            return
        with self._cond:
            self.variables[name] = value
            self.metas[name] = meta
            self._settle()

    def _record(self, kind: str, name: str | None, start: int, submitted: float, **facts) -> None:
        """A trace event: what ran, over which text (start to the text's end now), when."""
        event = {"kind": kind, "name": name, "start": start, "end": len(self.text)}
        self.events.append({**event, "submitted": submitted, "returned": time.monotonic(), **facts})

    def _open(self, by_model: bool) -> None:
        """Write the open message's pending opening, now that its first text is coming: the
        generation prompt's if the model writes it, a history turn's if the program does."""
        if self._pending_opening is None:
            return
        as_history, as_generated = self._pending_opening
        self._pending_opening = None
        start = len(self.text)
        self._append(as_generated if by_model else as_history, content=False, markup=True)
        for name, at in self._scopes.items():  # a scope opened with the message: its content
            if at == start:
                self._scopes[name] = len(self.text)

    @singledispatchmethod
    async def _run(self, op: object) -> None:
        raise TypeError(f"cannot append {type(op).__name__} to a program state")

    @_run.register
    async def _(self, op: str) -> None:
        self._open(by_model=False)
        self._append(op)

    @_run.register
    async def _(self, op: RoleBegin) -> None:
        if self.open_role is not None:
            raise ValueError(f"a {op.role} message cannot start inside a {self.open_role} one")
        first = not self.messages
        as_history = self.backend.chat_template.begin(op.role, first=first)
        as_generated = openings.generation_opening(self.backend, op, as_history, first)
        if as_generated == as_history:
            self._append(as_history, markup=True)  # before the message opens: not its content
        else:  # written by the message's first text (runtime/text/generation_openings.py)
            self._pending_opening = (as_history, as_generated)
        with self._cond:
            self.messages.append({"role": op.role, "content": ""})
            self.open_role = op.role

    @_run.register
    async def _(self, op: RoleEnd) -> None:
        if self.open_role != op.role:
            raise ValueError(f"no {op.role} message is open to end (open: {self.open_role})")
        self._open(by_model=False)  # an empty message, as a history renders it
        with self._cond:
            self.open_role = None
        self._append(self.backend.chat_template.end(op.role), markup=True)

    @_run.register
    async def _(self, op: Role) -> None:
        for part in (RoleBegin(op.role, op.thinking), *op.parts, RoleEnd(op.role)):
            await self._run(part)

    @_run.register
    async def _(self, op: Gen) -> None:
        opens_reply = self._pending_opening is not None and self.open_role == "assistant"
        self._open(by_model=True)
        params = op.params(self.sampling)
        if opens_reply and self.thinks_by_default:
            params = openings.reply_params(self.backend, op, params, self.sampling, self.text)
        openings.check_reasoning(self.backend, op, params)
        # Not healed after markup, nor where prompt logprobs are asked for (as Engine.heal).
        unhealed = self.ends_in_markup or params.prompt_logprobs_from is not None
        if params.token_healing and (unhealed or not self.backend.heals_prompts):
            asked = "token_healing" in op.sampling or "token_healing" in self.sampling
            if asked and not unhealed:
                raise ValueError(
                    f"gen({op.name!r}): token_healing=True, but {type(self.backend).__name__} "
                    "cannot heal the prompt; give token_healing=False, or run the program on "
                    "a LocalBackend, RemoteBackend or RayBackend"
                )
            params = msgspec.structs.replace(params, token_healing=False)
        if self.events is not None:  # the trace shows each token's logprob and alternatives
            top = max(params.top_logprobs, 5)
            params = msgspec.structs.replace(params, trace=True, top_logprobs=top)
        prompt, submitted = self.text, time.monotonic()
        program = None
        if op.lora in (None, self.lora):  # leased under the state's own adapter
            program, self._leased = self.program_id, True
        content_from = len(self.messages[-1]["content"]) if self.open_role else None
        out = await self.backend.generate(
            prompt, params, lambda t: self._append(t, op.name), op.lora or self.lora, program
        )
        meta = {"text": out.text, "finish_reason": out.finish_reason, "token_ids": out.token_ids}
        meta.update(out.meta)
        # The answer, after the thought of a reasoning gen (the text keeps both).
        answer = meta.pop("content") if params.reasoning else out.text
        value, captured = answer, {}
        if op.decode is not None:
            try:
                value = op.decode(answer)
            except Exception as e:
                # The constrained literal was cut short (by max_tokens or a stop string).
                if not self.keep_undecodable_text:
                    raise ValueError(
                        f"gen({op.name!r}): cannot decode {answer!r} "
                        f"(finish reason {out.finish_reason}): {e}"
                    ) from None
        if isinstance(value, Captured):  # a composed grammar's captures come with the text
            value, captured = value.value, value.variables
        if self.events is not None:
            self._record("gen", op.name, len(prompt), submitted, meta=meta, params=params)
        if params.reasoning:
            self._keep_thought(op.name, meta["reasoning_content"], answer, content_from, meta)
        for name, captured_value in captured.items():  # set before the gen's own variable,
            self._set(name, captured_value, meta)  # which a reader may be waiting on
        self._set(op.name, value, meta)

    def _keep_thought(
        self, name: str | None, thought: str, answer: str, content_from: int | None, meta: dict
    ) -> None:
        """A reasoning gen's thought: SGLang's `<name>_reasoning_content` variable, and the
        open assistant message's `reasoning_content` (its content keeps the answer alone)."""
        with self._cond:
            if content_from is not None:
                message = self.messages[-1]
                message["content"] = message["content"][:content_from] + answer
                if message["role"] == "assistant" and thought:
                    earlier = message.get("reasoning_content")
                    message["reasoning_content"] = f"{earlier}\n\n{thought}" if earlier else thought
        if name is not None:
            self._set(f"{name}_reasoning_content", thought, meta)

    @_run.register
    async def _(self, op: Select) -> None:
        self._open(by_model=False)  # a scored choice is the program's text, not a generation
        choices = list(op.choices)
        start, submitted = len(self.text), time.monotonic()
        scoring = [self.backend.score(self.text, choices, self.lora)]
        if needs_unconditional(op.method):
            # The choice's prior: its logprobs after only the current message's opening.
            role = self.open_role
            context = "" if role is None else self.backend.chat_template.begin(role, first=False)
            scoring.append(self.backend.score(context, choices, self.lora))
        logprobs, *prior = await asyncio.gather(*scoring)  # one engine round trip
        unconditional = prior[0] if prior else None
        scores = METHODS[op.method](logprobs, unconditional)
        best = max(range(len(choices)), key=lambda i: (scores[i], -i))
        self._append(choices[best], op.name)
        meta = {"choices": choices, "scores": scores, "logprobs": logprobs}
        if unconditional is not None:
            meta["unconditional_logprobs"] = unconditional
        if self.events is not None:
            self._record("select", op.name, start, submitted, meta=meta, method=op.method)
        self._set(op.name, choices[best], meta)

    @_run.register
    async def _(self, op: Parts) -> None:
        for part in op.items:
            await self._run(part)

    @_run.register
    async def _(self, op: VarScopeBegin) -> None:
        self._scopes[op.name] = len(self.text)

    @_run.register
    async def _(self, op: VarScopeEnd) -> None:
        if op.name not in self._scopes:
            raise ValueError(f"var_scope({op.name!r}) ends where it did not begin")
        self._set(op.name, self.text[self._scopes.pop(op.name) :], {})

    @_run.register
    async def _(self, op: SetVar) -> None:
        self._set(op.name, op.value, {})

    @_run.register
    async def _(self, op: _Join) -> None:
        for i, child in enumerate(op.children):
            if child.error is not None:
                raise ProgramError(f"fork {i} failed, so it cannot be joined") from child.error
        for child in op.children:  # their text is read here: their prefixes are not needed
            with child._cond:
                child._release_lease()
        if op.mode == "concate_and_append":
            self._open(by_model=False)  # the forks' text is appended as the program's
        if self.events is not None:
            self._record("join", None, len(self.text), time.monotonic(), **vars(op))
        if op.mode == "concate_and_append":
            self._append("".join(c.text[c.fork_start :] for c in op.children))
            if self.events is not None:
                self.events[-1]["end"] = len(self.text)
            return
        with self._cond:
            parents = set(self.variables)  # the forks inherited these: only new ones gather
            for child in op.children:
                for name, value in child.variables.items():
                    if name not in parents:
                        self.variables.setdefault(name, []).append(value)
                        self.metas[name] = {}
            self._settle()

    @_run.register
    async def _(self, op: _ForkPoint) -> None:
        # The forks share the message's opening (most go on to generate), rather than each
        # writing its own into text a join may concatenate.
        self._open(by_model=True)
        if self.events is not None:
            self._record("fork", None, len(self.text), time.monotonic(), children=op.states)
        with self._cond:
            snapshot = _Snapshot(
                self.text,
                copy.deepcopy(self.messages),
                self.open_role,
                dict(self.variables),
                dict(self.metas),
                self.ends_in_markup,
            )
        for f in op.children:
            f.set_result(snapshot)

    @_run.register
    async def _(self, op: _Inherit) -> None:
        s: _Snapshot = await asyncio.wrap_future(op.parent)
        with self._cond:
            self.text, self.messages, self.open_role = (
                s.text,
                copy.deepcopy(s.messages),
                s.open_role,
            )
            self.fork_start = len(s.text)
            self.ends_in_markup = s.ends_in_markup
            self.variables.update(s.variables)
            self.metas.update(s.metas)


def _gens(op: object) -> list[Gen]:
    """The gens inside an operation (a Parts' or a Role's too)."""
    if isinstance(op, Gen):
        return [op]
    if isinstance(op, Parts):
        return [g for part in op.items for g in _gens(part)]
    if isinstance(op, Role):
        return [g for part in op.parts for g in _gens(part)]
    return []
