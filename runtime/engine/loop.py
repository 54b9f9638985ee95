"""EngineLoop: the engine thread. It builds the EngineCore, then, until it is stopped, handles
the inbox's messages and runs steps: schedule -> run -> process -> postprocess -> publish.

Failures stay as small as they can: a bug met by one request fails that request alone (its
message, its share of a step, its output processing), a broken scheduler fails the live
requests, and ranks that died fail every request from then on.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from functools import singledispatchmethod

import torch

from braid.runtime.engine.core import EngineCore
from braid.runtime.engine.core_share import CoreShare
from braid.runtime.engine.heap import release_free_heap
from braid.runtime.engine.inbox import Abort, Add, Call, Embed, Flush, Message, Release
from braid.runtime.executor.model_runner import StepResult
from braid.runtime.output.processor import Update
from braid.runtime.scheduler.batch import Batch
from braid.runtime.scheduler.request import Request
from braid.runtime.tp import RankFailure

log = logging.getLogger("braid.runtime.engine")


class EngineLoop:
    def __init__(self, build: Callable[[], EngineCore], share_cores: bool) -> None:
        """Start the thread and wait until `build()` has run on it (raising what it raised).
        `share_cores`: size the CPU thread team to the cores other programs leave free
        (core_share.py)."""
        self._inbox: list[Message] = []
        self._wake = threading.Condition()
        self._stopping = False
        # Why the ranks failed, once they have: from then on every request fails with it.
        self._failure: str | None = None
        self._sharing_cores = share_cores
        self._threads = 0  # the thread team's size, once the thread has read it
        self._core_share: CoreShare | None = None
        built: list[EngineCore | BaseException] = []
        self._built, self._go = threading.Event(), threading.Event()
        self._thread = threading.Thread(
            target=self._run, args=(build, built), name="braid-engine", daemon=True
        )
        self._thread.start()
        self._built.wait()
        if isinstance(built[0], BaseException):
            raise built[0]
        self.core: EngineCore = built[0]
        self._scheduler, self._outputs = self.core.scheduler, self.core.outputs
        self._go.set()

    # ---- any thread -------------------------------------------------------------------

    def post(self, message: Message) -> None:
        with self._wake:
            if self._stopping:
                raise RuntimeError("the engine has been shut down")
            self._inbox.append(message)
            self._wake.notify()

    @property
    def num_queued(self) -> int:
        """Messages posted and not yet handled."""
        return len(self._inbox)

    def stop(self) -> bool:
        """Fail what is queued or running and end the thread; False if it was stopped."""
        with self._wake:
            if self._stopping:
                return False
            self._stopping = True
            self._wake.notify()
        self._thread.join()
        return True

    # ---- the engine thread ------------------------------------------------------------

    @torch.no_grad()  # no autograd bookkeeping: activations die as soon as they are used
    def _run(self, build: Callable[[], EngineCore], built: list) -> None:
        try:
            built.append(build())
        except BaseException as e:  # handed to the constructor, which raises it
            built.append(e)
            return
        finally:
            self._built.set()
        self._go.wait()
        self._threads = torch.get_num_threads()  # this thread's team
        if self._sharing_cores:
            self._core_share = CoreShare(self._threads)
        self._serve()

    def _serve(self) -> None:
        worked = False
        while True:
            with self._wake:
                idle = not (self._inbox or self._scheduler.has_work or self._stopping)
                if worked and idle:
                    release_free_heap()  # going idle: hand freed memory back to the OS
                    worked = False
                while not (self._inbox or self._scheduler.has_work or self._stopping):
                    self._wake.wait()
                inbox, self._inbox = self._inbox, []
                stopping = self._stopping
            for message in inbox:
                try:
                    self.handle(message)
                except Exception as e:  # a bug met by one request: it alone fails
                    log.exception("engine: %s failed", type(message).__name__)
                    if isinstance(message, Add):
                        self._fail(message.request, f"engine failed to admit it: {e!r}")
            if self._failure is not None:
                self._fail_live(self._failure)
            if stopping:
                self._fail_live("the engine was shut down")
                return
            if self._step():
                self.core.adapters.evict_unused()  # those over the bound that are done now
                worked = True

    def _step(self) -> bool:
        """One step; False when nothing could run."""
        batch = self._schedule()
        self._settle([self._outputs.end(r, "length") for r in batch.out_of_kv])
        if not batch.requests:
            return False
        batch, results = self._run_batch(batch)
        updates = self._outputs.process(batch, results)
        self._scheduler.postprocess(batch, [res.kept_nodes for res in results], updates)
        self._publish(updates)
        return True

    def _schedule(self) -> Batch:
        try:
            return self._scheduler.schedule()
        except Exception as e:  # the scheduler's own state is broken: no request to blame
            log.exception("engine: scheduling failed")
            self._fail_live(f"engine step failed: {e!r}")
            return Batch()

    def _run_batch(self, batch: Batch) -> tuple[Batch, list[StepResult]]:
        """The batch's results; after the step raised, each request's share run on its own,
        so that only a request whose own share raises fails and the others go on (re-running
        is safe: a forward rewrites the same KV slots with the same values, and sampling is
        seeded by request and step)."""
        self._share_cores()
        worker = self.core.worker
        try:
            return batch, worker.run(batch)
        except RankFailure as e:  # no forward can run again (logged by the ranks)
            self._failure = str(e)
            self._fail_live(self._failure)
            return Batch(), []
        except Exception:
            log.exception("engine step failed; running its requests one at a time")
        kept, results = [], []
        for i, r in enumerate(batch.requests):
            try:
                results += worker.run(batch.subset([i]))
                kept.append(i)
            except Exception as e:
                log.exception("request %d: its step failed alone too; failing it", r.rid)
                self._fail(r, f"engine step failed: {e!r}")
        return batch.subset(kept), results

    def _share_cores(self) -> None:
        if self._core_share is not None and (n := self._core_share.threads()) != self._threads:
            torch.set_num_threads(n)  # the C++ kernels read it too
            self._threads = n

    def _settle(self, updates: list[Update]) -> None:
        """Chunks made outside a step: the scheduler finishes those that end, then they go
        out."""
        self._scheduler.finish_ended(updates)
        self._publish(updates)

    def _publish(self, updates: list[Update]) -> None:
        """Hand each chunk to its request's consumer; a request whose chunk is its last has
        left the scheduler already, so a caller woken by it, or a `stats()` reader that sees
        it gone, sees the counters and the pool settled. A consumer that fails (say, its
        event loop closed) loses its request, and the engine goes on."""
        gone: set[int] = set()  # requests whose consumer failed
        for r, chunk in updates:
            if r.rid in gone:
                continue
            try:
                r.emit(chunk)
            except Exception:
                log.warning("request %d: its consumer raised; aborting it", r.rid, exc_info=True)
                gone.add(r.rid)
                if r.finish_reason is None:
                    self._scheduler.finish_ended([self._outputs.end(r, "abort")])

    def _fail(self, r: Request, error: str | None) -> None:
        """End a request the engine could not serve (unless it has ended already)."""
        if r.finish_reason is None:
            self._settle([self._outputs.end(r, "abort", error=error)])

    def _fail_live(self, error: str) -> None:
        for r in list(self._scheduler.live.values()):
            self._fail(r, error)

    # ---- the inbox's messages, by type ------------------------------------------------

    @singledispatchmethod
    def handle(self, message: Message) -> None:
        raise TypeError(f"the engine has no handler for {type(message).__name__}")

    @handle.register
    def _(self, message: Add) -> None:
        r = message.request
        self._scheduler.add(r)
        updates = self._outputs.admit(r)
        # Admitted first, so that a reload failing in any way fails the request (the loop's
        # handler fails only live ones); no step runs before the inbox is done.
        ended = any(chunk.finish_reason is not None for _, chunk in updates)
        if not ended and (error := self.core.adapters.ready(r.lora)):
            updates.append(self._outputs.end(r, "abort", error=error, request_error=True))
        self._settle(updates)

    @handle.register
    def _(self, message: Abort) -> None:
        if (r := self._scheduler.live.get(message.rid)) is not None:
            self._fail(r, None)

    @handle.register
    def _(self, message: Release) -> None:
        self._scheduler.release_lease(message.key)

    @handle.register
    def _(self, message: Flush) -> None:
        self.core.cache.reset()
        message.done.set()

    @handle.register
    def _(self, message: Call) -> None:
        try:
            message.done.set_result(message.job())
        except Exception as e:  # the caller's to raise
            message.done.set_exception(e)

    @handle.register
    def _(self, message: Embed) -> None:
        """One turn of an embedding job; until it is done it goes back to the inbox, so a
        generation step runs between its turns."""
        job = message.job
        if job.done.cancelled():  # its caller left
            return
        try:
            finished = job.turn(self.core.runner, self._scheduler)
        except RankFailure as e:  # no forward can run again (logged by the ranks)
            self._failure = str(e)
            job.settle(RuntimeError(self._failure))
            return
        except Exception as e:
            log.exception("engine: embedding failed")
            job.settle(RuntimeError(f"embedding failed: {e!r}"))
            return
        if finished:
            job.settle()
            return
        try:
            self.post(message)
        except RuntimeError as e:  # the engine is shutting down
            job.settle(e)
