"""RayBackend: programs run on engines in Ray actors, one engine per actor, for batches that
outgrow one engine (eval harnesses over a Ray cluster).

The program functions run in this process, as with any backend; each gen and select goes to
an actor chosen by prefix affinity (braid.runtime.cluster.affinity), so the programs that
share a few-shot prefix land on the same actor, whose radix cache computes the prefix once,
and a prefix that keeps one actor busier than the others spreads to the next. Each actor
runs a LocalBackend, so results and errors are the local engine's.

Needs `pip install 'braid[cluster]'`; ray is imported only when a RayBackend is made, and the
driver needs no torch (the actors load it).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from braid.interpreter.backend import TextOnlyBackend
from braid.runtime.cluster.affinity import AffinityConfig, PrefixAffinity
from braid.runtime.protocol import GenerateOutput, SamplingParams
from braid.runtime.text.chat_template import ChatTemplate

if TYPE_CHECKING:
    from braid.runtime.text.generation_openings import GenerationOpenings
    from braid.runtime.text.reasoning import ReasoningFormat


class RayBackend(TextOnlyBackend):
    """`num_actors` engines on the Ray cluster (`ray.init()` first to join one; otherwise
    Ray starts a local one), each `Engine(model=model, **engine_config)`.
    `actor_options` go to Ray's `.options()` for each actor: {"num_cpus": 1} by default;
    {"num_gpus": 1} puts one engine on each GPU."""

    heals_prompts = True  # each actor's LocalBackend heals

    def __init__(
        self,
        num_actors: int = 1,
        model: str | None = None,
        *,
        actor_options: dict[str, Any] | None = None,
        affinity: AffinityConfig | None = None,
        **engine_config: Any,
    ) -> None:
        if num_actors < 1:
            raise ValueError("RayBackend: num_actors must be >= 1")
        ray = _import_ray()
        self._ray = ray
        actor = ray.remote(EngineActor).options(**{"num_cpus": 1, **(actor_options or {})})
        self.actors = [actor.remote(model, engine_config) for _ in range(num_actors)]
        self.affinity = PrefixAffinity(num_actors, affinity)
        try:  # wait for the engines, so a model that cannot load fails here, by its cause
            templates = ray.get([a.chat_template.remote() for a in self.actors])
        except ray.exceptions.RayActorError as e:
            self.shutdown()
            raise RuntimeError(f"RayBackend: an engine actor failed to start: {e}") from None
        self._chat_template = templates[0]
        # Every actor runs the same model: the first one's answers are all of theirs.
        first = self.actors[0]
        self._generation_openings, self._reasoning_format = ray.get(
            [first.generation_openings.remote(), first.reasoning_format.remote()]
        )

    @property
    def chat_template(self) -> ChatTemplate:
        if isinstance(self._chat_template, str):  # the model has none: say why on first use
            raise ValueError(self._chat_template)
        return self._chat_template

    @property
    def generation_openings(self) -> GenerationOpenings | None:
        """The engines' (LocalBackend's)."""
        return self._generation_openings

    @property
    def reasoning_format(self) -> ReasoningFormat | None:
        """The engines'; each actor splits its reasoning outputs as a LocalBackend does."""
        return self._reasoning_format

    async def generate(
        self,
        prompt: str,
        params: SamplingParams,
        on_text: Callable[[str], None],
        lora: str | None = None,
        program: str | None = None,
    ) -> GenerateOutput:
        """`program` is ignored: a state's requests may go to different actors, so no actor
        keeps a lease for it."""
        # The output comes back whole: a streamed program sees each gen's text at once.
        out = await self._call("generate", prompt, prompt, params, lora)
        if out.text:
            on_text(out.text)
        return out

    async def score(
        self, prefix: str, continuations: list[str], lora: str | None = None
    ) -> list[list[float]]:
        return await self._call("score", prefix, prefix, continuations, lora)

    async def _call(self, method: str, routing_text: str, *args: Any) -> Any:
        exceptions = self._ray.exceptions
        i = self.affinity.acquire(routing_text)
        try:
            return await getattr(self.actors[i], method).remote(*args)
        except exceptions.RayTaskError as e:  # the engine's own error, as a local one raises
            cause = e.cause if isinstance(e.cause, Exception) else RuntimeError(str(e))
            raise cause from None
        except exceptions.RayActorError as e:
            raise RuntimeError(f"RayBackend: engine actor {i} died: {e}") from None
        finally:
            self.affinity.release(i)

    def stats(self) -> list[dict]:
        """Each actor's `engine.stats()`."""
        return self._ray.get([a.stats.remote() for a in self.actors])

    def flush_cache(self) -> None:
        """Drop every engine's cached prefixes."""
        self._ray.get([a.flush_cache.remote() for a in self.actors])

    def get_server_info(self) -> dict:
        raise NotImplementedError(
            "RayBackend cannot get_server_info: it runs several engines; stats() gives each "
            "actor's counters"
        )

    def shutdown(self) -> None:
        """Stop the actors (their engines go with them)."""
        for actor in self.actors:
            self._ray.kill(actor)


class EngineActor:
    """One engine inside a Ray actor (RayBackend makes them)."""

    def __init__(self, model: str | None, engine_config: dict[str, Any]) -> None:
        from braid.interpreter.local_backend import LocalBackend

        self.local = LocalBackend.start(model, **engine_config)

    def chat_template(self) -> ChatTemplate | str:
        """The model's chat template, or why it has none."""
        try:
            return self.local.chat_template
        except ValueError as e:
            return str(e)

    def generation_openings(self) -> GenerationOpenings | None:
        return self.local.generation_openings

    def reasoning_format(self) -> ReasoningFormat | None:
        return self.local.reasoning_format

    async def generate(
        self, prompt: str, params: SamplingParams, lora: str | None = None
    ) -> GenerateOutput:
        return await self.local.generate(prompt, params, lambda text: None, lora)

    async def score(
        self, prefix: str, continuations: list[str], lora: str | None = None
    ) -> list[list[float]]:
        return await self.local.score(prefix, continuations, lora)

    def stats(self) -> dict:
        return self.local.engine.stats()

    def flush_cache(self) -> None:
        self.local.flush_cache()


def _import_ray():
    try:
        import ray
    except ImportError:
        raise ImportError(
            "RayBackend needs ray: pip install 'braid[cluster]' (or pip install ray)"
        ) from None
    return ray
