"""EngineConfig: every engine setting in one validated dataclass."""

from __future__ import annotations

import os
from dataclasses import dataclass, field, fields

import torch

from braid.grammars.constraints import MAX_SCHEMA_DEPTH

SPEC_METHODS = ("auto", "none", "ngram", "suffix", "draft", "medusa", "eagle3")
# The methods that run a trained head over the target's hidden states (runtime/spec/heads),
# and all that run EngineConfig.draft_model: those and a draft model.
HEAD_METHODS = ("medusa", "eagle3")
DRAFT_METHODS = ("draft", *HEAD_METHODS)
DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


def _setting(default, help: str):
    """A config field and its meaning (`braid serve --help` prints it)."""
    return field(default=default, metadata={"help": help})


@dataclass
class EngineConfig:
    model: str | None = _setting(
        None, "an HF model directory; None: the embedded default model (SmolLM2-135M-Instruct)"
    )
    device: str = _setting("auto", "auto (cuda when available, else cpu), cpu, cuda or cuda:N")
    dtype: str = _setting(
        "auto",
        "auto, float32, bfloat16 or float16; auto: bfloat16 on cuda; on a CPU whichever of "
        "float32 and bfloat16 runs the model's linears faster there (timed once, cached); "
        "float32 with quantized weights",
    )
    context_length: int | None = _setting(
        None,
        "the longest sequence, prompt and output, in tokens; None: the model's own; lower "
        "only (vLLM's max_model_len); for longrope models (Phi-3) a context within the "
        "original chooses the short factors",
    )
    max_kv_tokens: int | None = _setting(
        None, "KV pool size in tokens; overrides kv_cache_gb and kv_memory_fraction"
    )
    kv_cache_gb: float | None = _setting(
        None, "KV pool size in GB; None: kv_memory_fraction of the memory available"
    )
    kv_memory_fraction: float = _setting(
        0.2, "share of available host memory (cpu) or free device memory (cuda) for the KV pool"
    )
    prefix_cache: bool = _setting(True, "share the KV of common prefixes through the radix cache")
    max_running_requests: int = _setting(256, "sequences decoded together at most")
    max_batch_tokens: int = _setting(
        2048, "new tokens (prefill chunks + decode tokens) per forward step"
    )
    chunk_size: int = _setting(512, "longest prefill piece of one request in one step")
    prefill_mode: str = _setting(
        "hybrid",
        "hybrid: decode tokens and prefill chunks share each forward (split-fuse); "
        "chunked: prefill-only and decode-only steps alternate",
    )
    schedule_policy: str = _setting(
        "lpm", "lpm: longest cached prefix first; fcfs: arrival order (both after priority)"
    )
    program_leases: bool = _setting(
        True,
        "a program state's prefix stays leased in the radix cache between its requests "
        "(evicted after unleased prefixes)",
    )
    lease_ttl_s: float = _setting(
        60.0, "a lease its program has not renewed for this long is evicted first"
    )
    max_leased_fraction: float = _setting(
        0.75, "the share of the KV pool that leased prefixes may hold at most"
    )
    # Constraints and stop regexes compile in worker processes bounded by these limits (a
    # schema that would hang or exhaust memory fails its request instead).
    grammar_compile_timeout_s: float = _setting(
        30.0, "a constraint or stop regex compiling longer fails its request"
    )
    grammar_compile_memory_mb: int = _setting(2048, "memory limit of each compile worker process")
    grammar_compile_workers: int = _setting(
        2, "compile worker processes: a slow compile holds up one of them, not all"
    )
    grammar_compile_queue: int = _setting(
        256,
        "distinct constraints waiting to compile at most; past it a request is refused (503 "
        "on the server); a compile every request asking for it left is dropped",
    )
    grammar_state_memory_mb: int = _setting(
        128,
        "states a lazy automaton (a regex too large for an index) may make; past it, it "
        "starts over empty, and an output that alone needs more fails",
    )
    # Each grammar has its own budget above, but a server meets many distinct constraints:
    # without a total, N hostile ones held N budgets, and resident memory grew for good
    # (docs/reliability.md).
    grammar_memory_mb: int = _setting(
        1024,
        "all cached grammars, stop-regex automata and the vocabulary structures they share, "
        "together (estimated from their own counts); past it the least recently used are "
        "evicted",
    )
    cpu_kernels: bool = _setting(
        True,
        "CPU: run norms, the activation, RoPE and decode attention in the C++ kernels "
        "(built once with the system compiler; torch ops when none is found)",
    )
    cuda_graph_max_batch: int = _setting(
        128, "CUDA: decode steps of up to this many requests replay captured graphs; 0: eager"
    )
    quantization: str = _setting(
        "auto",
        "CPU weights kept quantized in memory: auto (a GGUF model, the default one included, "
        "on its own blocks on the CPU where the kernels run; anything else as none); none "
        "(the weights as stored, a GGUF's dequantized); int8 or int4 (group-wise, packed at "
        "load); gguf (a GGUF model's own blocks: Q4_0, Q4_1, Q4_K, Q5_0, Q5_1, Q5_K, Q6_K, "
        "Q8_0, IQ4_NL, IQ4_XS)",
    )
    deterministic: bool = _setting(
        False,
        "float linears batch-invariant too (fixed tiles of rows; slower): outputs independent "
        "of what else is in the batch on every CPU path, for evals that must reproduce (the "
        "quantized paths, GGUF blocks and int8/int4, are batch-invariant without it)",
    )
    reasoning_format: str = _setting(
        "auto",
        "how the model marks its thoughts: auto (think tags or harmony where the tokenizer and "
        "chat template show them), none, think (<think>...</think>) or harmony (GPT-OSS)",
    )
    jump_forward: bool = _setting(
        True, "append the text a grammar forces (a JSON key, say) without a forward per token"
    )
    spec_method: str = _setting(
        "auto",
        "speculative decoding: auto (n-gram and suffix drafts, each request's draft length "
        "from its acceptance and the measured cost of verifying, on wherever verification "
        "rows are bit-identical to decode rows: the CPU kernels' paths); none; ngram "
        "(drafts from the request's own prompt and output); suffix (drafts from the outputs "
        "of requests in the same cache namespace, its own included); draft (runs draft_model); "
        "medusa or eagle3 (trained heads over the target's hidden states, from draft_model)",
    )
    draft_model: str | None = _setting(
        None,
        "with spec_method draft: a smaller model sharing the tokenizer (an HF directory), or "
        "self / self:K for the target's first K layers and its head (K: a quarter); with "
        "medusa or eagle3: the head's directory (the layouts SGLang and vLLM load)",
    )
    spec_draft_length: int = _setting(
        0,
        "draft tokens per step (the longest path of the tree); 0: adaptive per request from "
        "its acceptance rate and the measured cost of a verification token",
    )
    spec_tree_width: int = _setting(
        4, "most candidate continuations (draft tree leaves) the n-gram proposer verifies a step"
    )
    tp: int = _setting(
        1,
        "tensor-parallel ranks, one process each (the engine starts them): each holds a share "
        "of the attention heads, MLP features and KV pool; gloo on the CPU, NCCL on GPUs",
    )
    lora: tuple[str, ...] = _setting(
        (),
        "LoRA adapters to load at start, each name=path (a PEFT adapter directory); a "
        "request names the one it runs under (`lora=`)",
    )
    max_loaded_loras: int = _setting(
        16,
        "LoRA adapters holding their tensors in memory at most, besides those queued or "
        "running requests use; the least recently used others are dropped and loaded again "
        "from their directory when a request names them",
    )

    def __post_init__(self) -> None:
        self.lora = tuple(self.lora)  # a list from the command line's flags
        names = []
        for entry in self.lora:
            name, sep, path = entry.partition("=")
            if not (sep and name and path):
                raise ValueError(f"EngineConfig.lora: expected name=path, got {entry!r}")
            names.append(name)
        if len(set(names)) != len(names):
            raise ValueError(f"EngineConfig.lora: adapter names repeat: {names}")
        if self.lora and (self.tp > 1 or self.deterministic):
            raise ValueError(
                "EngineConfig.lora: LoRA adapters run neither with tp > 1 nor with "
                "deterministic=True (their updates are neither sharded nor batch-invariant)"
            )
        if self.device not in ("auto", "cpu", "cuda") and not self.device.startswith("cuda:"):
            raise ValueError(
                f"EngineConfig.device: expected auto, cpu or cuda[:N], got {self.device!r}"
            )
        if self.dtype != "auto" and self.dtype not in DTYPES:
            raise ValueError(
                f"EngineConfig.dtype: expected auto or one of {list(DTYPES)}, got {self.dtype!r}"
            )
        if self.context_length is not None and self.context_length < 1:
            raise ValueError(f"EngineConfig.context_length must be >= 1, got {self.context_length}")
        if self.max_kv_tokens is not None and self.max_kv_tokens < 1:
            raise ValueError(f"EngineConfig.max_kv_tokens must be >= 1, got {self.max_kv_tokens}")
        if self.kv_cache_gb is not None and self.kv_cache_gb <= 0:
            raise ValueError(f"EngineConfig.kv_cache_gb must be > 0, got {self.kv_cache_gb}")
        if self.cuda_graph_max_batch < 0:
            raise ValueError(
                f"EngineConfig.cuda_graph_max_batch must be >= 0, got {self.cuda_graph_max_batch}"
            )
        for name in ("max_running_requests", "max_batch_tokens", "chunk_size", "max_loaded_loras"):
            if getattr(self, name) < 1:
                raise ValueError(f"EngineConfig.{name} must be >= 1, got {getattr(self, name)}")
        if self.prefill_mode not in ("hybrid", "chunked"):
            raise ValueError(
                f"EngineConfig.prefill_mode: expected hybrid or chunked, got {self.prefill_mode!r}"
            )
        if self.lease_ttl_s <= 0:
            raise ValueError(f"EngineConfig.lease_ttl_s must be > 0, got {self.lease_ttl_s}")
        if not 0 <= self.max_leased_fraction <= 1:
            raise ValueError(
                "EngineConfig.max_leased_fraction must be in [0, 1], got "
                f"{self.max_leased_fraction}"
            )
        if self.schedule_policy not in ("lpm", "fcfs"):
            raise ValueError(
                f"EngineConfig.schedule_policy: expected lpm or fcfs, got {self.schedule_policy!r}"
            )
        if (
            self.grammar_compile_timeout_s <= 0
            or self.grammar_compile_memory_mb < 64
            or self.grammar_compile_workers < 1
            or self.grammar_compile_queue < 1
            or self.grammar_state_memory_mb < 1
            or self.grammar_memory_mb < 1
        ):
            raise ValueError(
                "EngineConfig: grammar_compile_timeout_s must be > 0, "
                "grammar_compile_memory_mb >= 64, grammar_compile_workers >= 1, "
                "grammar_compile_queue >= 1, "
                "grammar_state_memory_mb >= 1 and grammar_memory_mb >= 1"
            )
        if self.spec_method not in SPEC_METHODS:
            raise ValueError(
                f"EngineConfig.spec_method: expected one of {', '.join(SPEC_METHODS)}, got "
                f"{self.spec_method!r}"
            )
        if self.quantization not in ("auto", "none", "int8", "int4", "gguf"):
            raise ValueError(
                "EngineConfig.quantization: expected auto, none, int8, int4 or gguf, got "
                f"{self.quantization!r}"
            )
        if (self.spec_method in DRAFT_METHODS) != (self.draft_model is not None):
            raise ValueError(
                "EngineConfig.draft_model: give one exactly when spec_method is one of "
                f"{', '.join(DRAFT_METHODS)} (spec_method={self.spec_method!r}, "
                f"draft_model={self.draft_model!r})"
            )
        if self.spec_method in HEAD_METHODS and self.tp > 1:
            raise ValueError(
                f"EngineConfig.tp: spec_method={self.spec_method!r} runs its head on one "
                "process; use tp=1"
            )
        if not 0 <= self.spec_draft_length <= 64:
            raise ValueError(
                f"EngineConfig.spec_draft_length must be in [0, 64], got {self.spec_draft_length}"
            )
        if not 1 <= self.spec_tree_width <= 16:
            raise ValueError(
                f"EngineConfig.spec_tree_width must be in [1, 16], got {self.spec_tree_width}"
            )
        if self.tp < 1:
            raise ValueError(f"EngineConfig.tp must be >= 1, got {self.tp}")
        if self.tp > 1 and self.quantization == "gguf":
            raise ValueError(
                "EngineConfig.tp: a GGUF file's quantized blocks are not split over ranks; "
                "use quantization='none', 'int8' or 'int4' with tp > 1"
            )
        if self.tp > 1 and (self.draft_model or "").split(":")[0] == "self":
            raise ValueError(
                "EngineConfig.tp: a self-draft (draft_model='self') would need a KV pool of its "
                "own on every rank; use spec_method='ngram' or a separate draft model with tp > 1"
            )
        if not 0 < self.kv_memory_fraction < 1:
            raise ValueError(
                f"EngineConfig.kv_memory_fraction must be in (0, 1), got {self.kv_memory_fraction}"
            )

    @property
    def torch_device(self) -> torch.device:
        if self.device == "auto":
            return torch.device("cuda" if torch.cuda.is_available() else "cpu")
        return torch.device(self.device)

    def kv_pool_tokens(self, bytes_per_token: int) -> int:
        """The KV pool size in tokens: explicit, from a GB budget, or from free memory."""
        if self.max_kv_tokens is not None:
            return self.max_kv_tokens
        if self.kv_cache_gb is not None:
            budget = self.kv_cache_gb * 1024**3
        elif self.torch_device.type == "cuda":
            free, _ = torch.cuda.mem_get_info(self.torch_device)
            budget = free * self.kv_memory_fraction
        else:
            budget = _available_host_memory() * self.kv_memory_fraction
        return max(int(budget // bytes_per_token), 1)


@dataclass
class RequestLimits:
    """What one HTTP request may ask for (`braid serve` flags); past a bound the server
    answers 400 naming the field, the bound and its flag. A request's body size and the
    sequences the server holds have their own flags (--max-request-bytes,
    --max-queued-requests); max_tokens is bounded by the model's context."""

    max_prompt_tokens: int | None = _setting(
        None, "longest prompt in tokens; None: the model's context less one"
    )
    max_n: int = _setting(128, "samples of one prompt a request may ask for (n, best_of)")
    # Each stop string is looked for at every output character, on the engine's thread.
    max_stop_strings: int = _setting(16, "entries of each of stop, stop_regex and stop_token_ids")
    max_stop_length: int = _setting(512, "characters of one stop string or stop regex")
    max_choices: int = _setting(
        1024, "options of a choices constraint; continuations of one select (/braid/score)"
    )
    # Each continuation is tokenized with the prefix (their tokens may merge at the boundary),
    # so a select's tokenizing grows as prefix x continuations (the default's cost: docs/
    # reliability.md).
    max_score_chars: int = _setting(
        1 << 22, "characters one select (/braid/score) tokenizes: the prefix with each continuation"
    )
    # Applied to each request's logits at every step; OpenAI's own bound.
    max_logit_bias: int = _setting(300, "entries of logit_bias")
    max_constraint_bytes: int = _setting(
        1 << 20,
        "a constraint's text in UTF-8: a regex, a lark grammar, a JSON schema as compact JSON "
        "(each tool's parameters too), or the choices together",
    )
    max_schema_depth: int = _setting(
        MAX_SCHEMA_DEPTH,
        f"levels of objects and arrays a JSON schema may nest (the compiler takes at most "
        f"{MAX_SCHEMA_DEPTH})",
    )
    allow_special_tokens_in_content: bool = _setting(
        False,
        "let chat messages (their content, tools and template variables) spell special "
        "tokens such as <|im_start|>: for trusted clients only; otherwise that text is "
        "tokenized as text, so a user cannot open a turn of another role",
    )

    def __post_init__(self) -> None:
        for f in fields(self):
            value = getattr(self, f.name)
            if value is not None and not isinstance(value, bool) and value < 1:
                raise ValueError(f"RequestLimits.{f.name} must be >= 1, got {value}")
        if self.max_schema_depth > MAX_SCHEMA_DEPTH:
            raise ValueError(
                f"RequestLimits.max_schema_depth must be <= {MAX_SCHEMA_DEPTH} (what the "
                f"JSON-schema compiler takes), got {self.max_schema_depth}"
            )


def _available_host_memory() -> int:
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    # Not Linux: total physical memory is the best portable figure.
    return os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
