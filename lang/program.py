"""@program: a Python function that writes to a ProgramState, run on a backend."""

from __future__ import annotations

import asyncio
import functools
import inspect
import threading
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from tqdm import tqdm

from braid.api import SAMPLING_KEYWORDS, check_sampling, sampling_fields
from braid.interpreter.backend import Backend, default_backend
from braid.interpreter.executor import StreamExecutor
from braid.state import ProgramState
from braid.trace import tracing_default

# Program bodies of `arun` calls run here: a body blocks its thread while it reads a
# variable, and the event loop that awaits it must not be that thread.
_ARUN_THREADS = ThreadPoolExecutor(max_workers=256, thread_name_prefix="braid-program")


def program(fn: Callable[..., Any]) -> Program:
    """Make `fn(s, ...)` a program: `fn.run(...)`, `fn.run_batch(...)`, `await fn.arun(...)`."""
    return Program(fn)


class Program:
    # braid's own programs fail a typed gen (dtype, json_schema=Type) whose text is not a whole
    # literal; SGLang's (braid.sglang.Function) keep the text.
    keep_undecodable_text = False
    thinks_by_default = True  # see StreamExecutor.thinks_by_default

    def __init__(self, fn: Callable[..., Any], bound: dict[str, Any] | None = None) -> None:
        self.fn = fn
        self.bound = bound or {}
        self.name = getattr(fn, "__name__", "program")
        self.signature = inspect.signature(fn)
        if not self.signature.parameters:
            raise TypeError(f"@program {self.name}: its first parameter must be the state")
        functools.update_wrapper(self, fn)

    def bind(self, **kwargs: Any) -> Program:
        """The same program with some arguments fixed."""
        self._check_args((), {**self.bound, **kwargs}, partial=True)
        return type(self)(self.fn, {**self.bound, **kwargs})

    def __call__(self, s: ProgramState | None = None, *args: Any, **kwargs: Any) -> Any:
        """Inside another program, `inner(s, ...)` appends this program to that state."""
        # SGLang's f(...) runs it (so do @sgl.function's, braid.sglang.Function); braid's own
        # ask for f.run, since inside a program such a call is most often a forgotten `s`.
        if not isinstance(s, ProgramState):
            raise TypeError(
                f"{self.name}() needs a program state first: use {self.name}.run(...) to run "
                f"it, or {self.name}(s, ...) inside another program"
            )
        return self.fn(s, *args, **{**self.bound, **kwargs})

    def run(
        self,
        *args: Any,
        stream: bool = False,
        backend: Backend | None = None,
        sampling: dict[str, Any] | None = None,
        lora: str | None = None,
        use_thread: bool = True,
        trace: bool | None = None,
        **kwargs: Any,
    ) -> ProgramState:
        """Run the program and return its finished state; raises what the program raised.

        `sampling`: SamplingParams fields every gen of the program starts from. `lora`: the
        LoRA adapter (by name, one the backend serves) its gens and selects run under. A keyword
        that is not one of the program's parameters but a sampling field, in braid's or
        SGLang's name (`temperature=0`, `max_new_tokens=16`), is one of those defaults too,
        as in SGLang. With `stream=True` it returns at once: iterate `state.text_iter()` for
        the text. `use_thread` is SGLang's and has no effect: braid runs the operations on
        its event loop either way. `trace=True` (default: BRAID_TRACE=1) records the run for
        `state.trace()`; its gens then also report logprobs with 5 alternatives.
        """
        kwargs, sampling = self._split_sampling(kwargs, sampling, "run")
        state = self._new_state(backend, sampling, lora, trace)
        if stream:
            threading.Thread(
                target=self._execute, args=(state, args, kwargs), name="braid-program", daemon=True
            ).start()
            return state
        self._execute(state, args, kwargs)
        state._executor.wait()
        if state.error is not None:
            raise state.error
        return state

    def run_batch(
        self,
        batch: list[dict[str, Any] | tuple | list],
        *,
        concurrency: int = 32,
        progress: bool = False,
        backend: Backend | None = None,
        sampling: dict[str, Any] | None = None,
        lora: str | None = None,
        num_threads: int | str | None = None,
        progress_bar: bool = False,
        generator_style: bool = False,
        trace: bool | None = None,
        **sampling_kwargs: Any,
    ) -> list[ProgramState] | Iterator[ProgramState]:
        """Run the program once per kwargs dict (or tuple of positional arguments), up to
        `concurrency` at a time, so their requests reach the engine together (a shared
        few-shot prefix is computed once). A program that fails does not stop the others:
        its state's `error` says why. The states come in the batch's order.

        SGLang's names work too: `num_threads` (an int, or "auto" for braid's default) is
        `concurrency`, `progress_bar` is `progress`, sampling keywords (`temperature=0`,
        `max_new_tokens=16`) are defaults for every gen, like `sampling`, and
        `generator_style=True` returns an iterator that yields each state, in order, once it
        has finished (the runs start when it is first advanced). `trace`: as in `run`.
        """
        if num_threads is not None and num_threads != "auto":
            concurrency = num_threads
        if concurrency < 1:
            raise ValueError("run_batch: concurrency must be >= 1")
        progress = progress or progress_bar
        sampling = {**(sampling or {}), **sampling_fields(sampling_kwargs, "run_batch")}
        backend = backend or default_backend()

        def run_one(arguments: dict[str, Any] | tuple | list) -> ProgramState:
            state = self._new_state(backend, sampling, lora, trace)
            if isinstance(arguments, dict):
                self._execute(state, (), arguments)
            else:
                self._execute(state, tuple(arguments), {})
            state._executor.wait()
            return state

        states = self._run_all(batch, run_one, concurrency, progress)
        return states if generator_style else list(states)

    def _run_all(
        self,
        batch: list[Any],
        run_one: Callable[[Any], ProgramState],
        concurrency: int,
        progress: bool,
    ) -> Iterator[ProgramState]:
        """run_one of each item, up to `concurrency` at a time; the states in the batch's
        order as each finishes."""
        # The bar is closed after the pool, which waits for every run: a run that finishes
        # after the caller stopped iterating still updates an open bar.
        with (
            tqdm(total=len(batch), disable=not progress, desc=self.name) as bar,
            ThreadPoolExecutor(min(concurrency, max(len(batch), 1))) as pool,
        ):
            futures = [pool.submit(run_one, arguments) for arguments in batch]
            for f in futures:
                f.add_done_callback(lambda _: bar.update(1))
            for f in futures:
                yield f.result()

    async def arun(
        self,
        *args: Any,
        backend: Backend | None = None,
        sampling: dict[str, Any] | None = None,
        lora: str | None = None,
        trace: bool | None = None,
        **kwargs: Any,
    ) -> ProgramState:
        """`run` for asyncio: awaits the program without blocking the event loop."""
        kwargs, sampling = self._split_sampling(kwargs, sampling, "arun")
        state = self._new_state(backend, sampling, lora, trace)
        loop = asyncio.get_running_loop()
        await loop.run_in_executor(_ARUN_THREADS, self._execute, state, args, kwargs)
        await asyncio.gather(*(asyncio.wrap_future(f) for f in state._executor.all_done()))
        if state.error is not None:
            raise state.error
        return state

    def _split_sampling(
        self, kwargs: dict[str, Any], sampling: dict[str, Any] | None, where: str
    ) -> tuple[dict[str, Any], dict[str, Any] | None]:
        """(the program's arguments, the gens' defaults): a keyword that names none of the
        program's parameters but a sampling field is a default for every gen."""
        params = self.signature.parameters
        direct = {k: v for k, v in kwargs.items() if k in SAMPLING_KEYWORDS and k not in params}
        if not direct:
            return kwargs, sampling
        arguments = {k: v for k, v in kwargs.items() if k not in direct}
        return arguments, {**(sampling or {}), **sampling_fields(direct, f"{self.name}.{where}")}

    def _new_state(
        self,
        backend: Backend | None,
        sampling: dict[str, Any] | None,
        lora: str | None,
        trace: bool | None = None,
    ) -> ProgramState:
        sampling = dict(sampling or {})
        where = f"{self.name}.run(sampling=...)"
        check_sampling(sampling, where)
        if sampling.get("n", 1) != 1:  # SGLang's run takes n; each gen stores one text
            raise ValueError(f"{where}: n must be 1; fork the state for several samples")
        executor = StreamExecutor(
            backend or default_backend(),
            sampling,
            keep_undecodable_text=self.keep_undecodable_text,
            thinks_by_default=self.thinks_by_default,
            lora=lora,
            trace=tracing_default() if trace is None else trace,
        )
        return ProgramState(executor, self.name)

    def _execute(self, state: ProgramState, args: tuple, kwargs: dict[str, Any]) -> None:
        """Call the function on the state (it returns once it has appended everything),
        recording what it raises on the state."""
        try:
            kwargs = {**self.bound, **kwargs}
            self._check_args(args, kwargs)
            state.ret_value = self.fn(state, *args, **kwargs)
        except BaseException as e:
            state._executor.fail(e)
        finally:
            state._executor.close()

    def _check_args(self, args: tuple, kwargs: dict[str, Any], partial: bool = False) -> None:
        params = self.signature.parameters
        takes_any = any(p.kind is p.VAR_KEYWORD for p in params.values())
        unknown = [k for k in kwargs if k not in params and not takes_any]
        if unknown:  # named before any missing argument: it is usually a typo of one
            raise TypeError(f"{self.name}(): got an unexpected keyword argument {unknown[0]!r}")
        bind = self.signature.bind_partial if partial else self.signature.bind
        try:
            bind(None, *args, **kwargs)
        except TypeError as e:
            raise TypeError(f"{self.name}(): {e}") from None
