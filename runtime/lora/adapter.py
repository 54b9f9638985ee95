"""LoRA adapters (PEFT's format) served over one base model, any number at once.

A targeted linear's output gains, on the rows of each adapter's tokens, that adapter's
low-rank update scale * (x @ A.T) @ B.T, added after the base linear (float, quantized or
anything else) has run. Our q/k/v and gate/up linears are fused, so an adapter's parts of a
fused linear are joined into one pair: A stacks the parts' A matrices ([sum r, in]) and B
puts each part's B (the scale folded in) on its own output rows and rank columns, zeros
elsewhere ([out, sum r]): one pair of matmuls per fused linear and adapter. On the CPU, B
is stored column-major (each rank's column contiguous), as the C++ kernel reads it.
"""

from __future__ import annotations

import itertools
import json
from dataclasses import dataclass, field
from pathlib import Path

import torch
from safetensors import SafetensorError
from safetensors.torch import load_file

from braid import kernels
from braid.kernels import cpu
from braid.kernels.cpu import LORA_LINEARS
from braid.runtime.models.config.model_config import ModelConfig

# PEFT's module name -> (our fused linear, its part index within that linear).
TARGETS = {
    "q_proj": ("self_attn.qkv_proj", 0),
    "k_proj": ("self_attn.qkv_proj", 1),
    "v_proj": ("self_attn.qkv_proj", 2),
    "o_proj": ("self_attn.o_proj", 0),
    "gate_proj": ("mlp.gate_up_proj", 0),
    "up_proj": ("mlp.gate_up_proj", 1),
    "down_proj": ("mlp.down_proj", 0),
}

# adapter_config.json keys naming LoRA variants or options not implemented here: each must be
# absent or empty/false.
_UNSUPPORTED = (
    "use_dora",
    "modules_to_save",
    "layers_to_transform",
    "layers_pattern",
    "rank_pattern",
    "alpha_pattern",
    "fan_in_fan_out",
    "lora_bias",
    "target_parameters",
    "layer_replication",
    "trainable_token_indices",
    "alora_invocation_tokens",
    "use_qalora",
    "use_bdlora",
    "exclude_modules",
)

_serials = itertools.count()


@dataclass(eq=False)
class LoraAdapter:
    name: str
    path: str
    rank: int
    scale: float
    targets: tuple[str, ...]  # PEFT's module names
    # (layer, our linear's name, e.g. "self_attn.qkv_proj") -> (A [R, in], B [out, R] scaled);
    # None while evicted from memory (runtime/lora/memory.py), never while a request uses it.
    weights: dict[tuple[int, str], tuple[torch.Tensor, torch.Tensor]] | None
    # Unique per load: part of the radix cache's namespace, so prefixes cached under an
    # adapter unloaded and loaded again (new weights, same name) are never matched.
    serial: int = field(default_factory=lambda: next(_serials))
    # (the weights they were built from, cpu_pairs' table, the tensors it points into)
    _cpu_pairs: tuple[dict, torch.Tensor, list[torch.Tensor]] | None = field(
        default=None, init=False, repr=False
    )

    def cpu_pairs(self) -> torch.Tensor:
        """Its pairs as the CPU kernel reads them (kernels/cpu/bindings.py's lora_weights), int64
        [layers, len(LORA_LINEARS), 4], zeros where it leaves a linear alone. Built once per
        load of its weights (float32, on the CPU), so that a step only stacks adapters'."""
        if self._cpu_pairs is None or self._cpu_pairs[0] is not self.weights:
            layers = 1 + max(layer for layer, _ in self.weights)
            rows = [[(0, 0, 0, 0)] * len(LORA_LINEARS) for _ in range(layers)]
            kept = []
            for (layer, linear), (a, b) in self.weights.items():
                # No copies of load_adapter's; B column-major for pairs built elsewhere.
                a, b = a.contiguous(), b.T.contiguous().T
                spans = cpu.lora_spans(b)
                kept += [a, b, spans]
                rows[layer][LORA_LINEARS.index(linear)] = cpu.lora_weights(a, b, spans)
            self._cpu_pairs = (self.weights, torch.tensor(rows, dtype=torch.int64), kept)
        return self._cpu_pairs[1]


def load_adapter(
    name: str, path: str | Path, config: ModelConfig, dtype: torch.dtype, device: torch.device
) -> LoraAdapter:
    """A PEFT LoRA adapter directory (adapter_config.json + adapter_model.safetensors) for a
    model of `config`; ValueError for what is not implemented or does not fit the model."""
    path = Path(path).expanduser()
    where = f"LoRA adapter {name!r} ({path})"
    try:
        settings = json.loads((path / "adapter_config.json").read_text())
        tensors = load_file(path / "adapter_model.safetensors")
    except (OSError, ValueError, SafetensorError) as e:
        raise ValueError(f"{where}: cannot read its files: {e}") from None
    if settings.get("peft_type", "LORA") != "LORA":
        raise ValueError(f"{where}: peft_type {settings['peft_type']!r}; only LORA is served")
    for key in _UNSUPPORTED:
        if settings.get(key):
            raise ValueError(f"{where}: {key}={settings[key]!r} is not supported")
    if settings.get("bias", "none") != "none":
        raise ValueError(f"{where}: bias={settings['bias']!r} is not supported (only 'none')")
    targets = settings.get("target_modules")
    if not isinstance(targets, list) or not targets:
        raise ValueError(
            f"{where}: target_modules={targets!r}; a list of module names is needed "
            f"(among {', '.join(TARGETS)})"
        )
    unknown = sorted(set(targets) - set(TARGETS))
    if unknown:
        raise ValueError(
            f"{where}: target modules {unknown} are not supported (only {', '.join(TARGETS)})"
        )
    rank, alpha = int(settings["r"]), float(settings["lora_alpha"])
    if rank < 1:
        raise ValueError(f"{where}: r={rank} must be >= 1")
    scale = alpha / rank**0.5 if settings.get("use_rslora") else alpha / rank

    # PEFT's name of each (layer, module): ...layers.0.self_attn.q_proj (the block is ours too)
    stems = {
        (layer, module): f"base_model.model.model.layers.{layer}.{block}.{module}"
        for layer in range(config.num_layers)
        for module in targets
        for block in [TARGETS[module][0].split(".")[0]]
    }
    expected = {f"{stem}.lora_{ab}.weight" for stem in stems.values() for ab in "AB"}
    extra, missing = sorted(set(tensors) - expected), sorted(expected - set(tensors))
    if extra or missing:
        raise ValueError(
            f"{where}: does not match a {config.num_layers}-layer model targeting {targets}: "
            f"unexpected tensors {extra[:3]}, missing {missing[:3]}"
        )

    part_sizes = _part_sizes(config)
    # (layer, our linear) -> {part index: (A, B)}
    parts: dict[tuple[int, str], dict[int, tuple[torch.Tensor, torch.Tensor]]] = {}
    for (layer, module), stem in stems.items():
        linear, part = TARGETS[module]
        a, b = tensors[f"{stem}.lora_A.weight"], tensors[f"{stem}.lora_B.weight"]
        in_features, out_features = part_sizes[module]
        if a.shape != (rank, in_features) or b.shape != (out_features, rank):
            raise ValueError(
                f"{where}: {stem}: lora_A {tuple(a.shape)} and lora_B {tuple(b.shape)}; the "
                f"base model needs ({rank}, {in_features}) and ({out_features}, {rank})"
            )
        parts.setdefault((layer, linear), {})[part] = (a, b)

    weights = {}
    for (layer, linear), by_part in parts.items():
        sizes = [part_sizes[m][1] for m, (lin, _) in TARGETS.items() if lin == linear]
        row_starts = [0, *itertools.accumulate(sizes)]
        a = torch.cat([by_part[p][0] for p in sorted(by_part)]).float()  # (R, in)
        b = torch.zeros(row_starts[-1], a.shape[0])  # (out, R)
        column = 0
        for p in sorted(by_part):
            b[row_starts[p] : row_starts[p + 1], column : column + rank] = by_part[p][1] * scale
            column += rank
        a, b = a.to(device, dtype), b.to(device, dtype)
        if b.device.type == "cpu":
            b = b.T.contiguous().T
        weights[layer, linear] = (a, b)
    return LoraAdapter(name, str(path), rank, scale, tuple(targets), weights)


def _part_sizes(config: ModelConfig) -> dict[str, tuple[int, int]]:
    """PEFT module name -> (in_features, out_features) in the base model."""
    hidden, inter = config.hidden_size, config.intermediate_size
    q, kv = config.num_heads * config.head_dim, config.num_kv_heads * config.head_dim
    return {
        "q_proj": (hidden, q),
        "k_proj": (hidden, kv),
        "v_proj": (hidden, kv),
        "o_proj": (q, hidden),
        "gate_proj": (hidden, inter),
        "up_proj": (hidden, inter),
        "down_proj": (inter, hidden),
    }


class LoraBatch:
    """Which of a forward batch's token rows belong to which adapter, worked out once per step.

    On CUDA every adapter of a linear is one segmented-matmul launch pair (kernels/triton/lora.py)
    over `segments`: runs of consecutive rows under one adapter, (start, length, index into
    `adapters`). On the CPU in float32, one call of the C++ kernel a linear over every row
    (kernels/cpu/cpu_lora.cpp): each row's adapter in `row_adapters` and the adapters' pairs
    stacked in `cpu_pairs`, which kernels/cpu/cpu_decoder.cpp takes too. Otherwise (bfloat16, or
    no compiler) the update is a gather, two matmuls and a scatter per adapter in torch
    (`groups`: rows a slice when they are one run): per-run matmuls cost more there once a
    batch interleaves adapters (docs/benchmarks.md has the figures)."""

    def __init__(
        self,
        adapters: list[LoraAdapter],
        segments: list[tuple[int, int, int]],
        device: torch.device,
        segmented: bool | None = None,
        cpu_kernel: bool = True,
        num_rows: int | None = None,
    ) -> None:
        """`segmented`: the Triton kernel (default: on CUDA; tests run it in triton's
        interpreter on the CPU). `cpu_kernel`: the C++ kernel where it applies (on the CPU,
        float32 adapters, the CPU kernels built); False keeps torch's path. `num_rows`: the
        batch's rows (default: to the last segment's end; rows past it are the base's)."""
        self.adapters, self.segments = adapters, segments
        self.segmented = device.type == "cuda" if segmented is None else segmented
        self.groups: list[tuple[LoraAdapter, slice | torch.Tensor]] = []
        self._device = device
        # The CPU kernels when the C++ kernel serves this batch, else None.
        self.cpu_kernels: cpu.CpuKernels | None = None
        if cpu_kernel and device.type == "cpu" and not self.segmented and _float32(adapters):
            self.cpu_kernels = cpu.load()
        if self.cpu_kernels is not None:
            self._prepare_cpu_kernel(num_rows or max(start + n for start, n, _ in segments))
        elif not self.segmented:
            runs: dict[int, list[tuple[int, int]]] = {}
            for start, length, i in segments:
                runs.setdefault(i, []).append((start, length))
            for i, spans in runs.items():
                if len(spans) == 1:  # one run of rows: a view, no gather or scatter
                    rows: slice | torch.Tensor = slice(spans[0][0], sum(spans[0]))
                else:
                    indices = [t for start, n in spans for t in range(start, start + n)]
                    rows = torch.tensor(indices, device=device)
                self.groups.append((adapters[i], rows))
        self.max_len = max(length for _, length, _ in segments)
        # Built on first use in the step: (layer, linear) -> (A stack, B stack, segments),
        # None where no adapter of the batch targets the linear.
        self._stacked: dict[tuple[int, str], tuple[torch.Tensor, ...] | None] = {}
        self._segments: dict[tuple[int, ...], torch.Tensor] = {}

    @classmethod
    def of(
        cls, adapters: list[LoraAdapter | None], extend_lens: list[int], device: torch.device
    ) -> LoraBatch | None:
        """Sequence b's `extend_lens[b]` new tokens run under `adapters[b]` (None: the base
        model alone). None when no sequence has an adapter."""
        index: dict[LoraAdapter, int] = {}
        segments: list[tuple[int, int, int]] = []
        start = 0
        for adapter, n in zip(adapters, extend_lens, strict=True):
            if adapter is not None and n > 0:
                i = index.setdefault(adapter, len(index))
                if segments and segments[-1][2] == i and sum(segments[-1][:2]) == start:
                    segments[-1] = (segments[-1][0], segments[-1][1] + n, i)
                else:
                    segments.append((start, n, i))
            start += n
        if not segments:
            return None
        return cls(list(index), segments, device, num_rows=start)

    def _prepare_cpu_kernel(self, num_rows: int) -> None:
        """`row_adapters` int64 [T]: each row's index into `adapters`, -1 for the base's;
        `cpu_pairs` int64 [layers, len(LORA_LINEARS), N, 4]: adapter i's pair of each layer's
        linear, zeros where it has none."""
        rows = [-1] * num_rows
        for start, n, i in self.segments:
            rows[start : start + n] = [i] * n
        self.row_adapters = torch.tensor(rows, dtype=torch.int64)
        tables = [a.cpu_pairs() for a in self.adapters]
        layers = max(t.shape[0] for t in tables)
        self.cpu_pairs = torch.zeros(layers, len(LORA_LINEARS), len(tables), 4, dtype=torch.int64)
        for i, table in enumerate(tables):
            self.cpu_pairs[: table.shape[0], :, i] = table

    def add(self, y: torch.Tensor, x: torch.Tensor, layer: int, linear: str) -> None:
        """y [T, out] (the base linear's output for x [T, in]) += each adapter's update on its
        own rows, in place."""
        if self.cpu_kernels is not None:
            if layer < self.cpu_pairs.shape[0]:
                pairs = self.cpu_pairs[layer, LORA_LINEARS.index(linear)]
                self.cpu_kernels.lora_add(y, x, self.row_adapters, pairs)
            return
        if self.segmented:
            stacked = self._stack(layer, linear)
            if stacked is not None:
                kernels.lora_segmented(x, y, *stacked, max_len=self.max_len)
            return
        for adapter, rows in self.groups:
            pair = adapter.weights.get((layer, linear))
            if pair is None:  # the adapter leaves this linear alone
                continue
            a, b = pair
            if isinstance(rows, slice):
                y[rows].addmm_(x[rows] @ a.T, b.T)  # (L, R) @ (R, out)
            else:
                y.index_add_(0, rows, (x[rows] @ a.T) @ b.T)

    def _stack(self, layer: int, linear: str) -> tuple[torch.Tensor, ...] | None:
        """(A [N, R, in], B [N, out, R], segments [S, 3]) over the batch's adapters that
        target this linear, lower ranks zero-padded to the highest; the others' rows are in
        no segment."""
        key = (layer, linear)
        if key not in self._stacked:
            present = [i for i, a in enumerate(self.adapters) if key in a.weights]
            self._stacked[key] = None
            if present:
                pairs = [self.adapters[i].weights[key] for i in present]
                a_stack, b_stack = _padded_stack(pairs)
                self._stacked[key] = (a_stack, b_stack, self._segments_of(tuple(present)))
        return self._stacked[key]

    def _segments_of(self, present: tuple[int, ...]) -> torch.Tensor:
        """The segments of the adapters `present`, indexed by their place in it: one copy to
        the device per set of adapters (usually one per linear kind), not per layer."""
        if present not in self._segments:
            slot = {i: s for s, i in enumerate(present)}
            kept = [(start, n, slot[i]) for start, n, i in self.segments if i in slot]
            self._segments[present] = torch.tensor(kept, dtype=torch.int32).to(self._device)
        return self._segments[present]


def _float32(adapters: list[LoraAdapter]) -> bool:
    """Whether the adapters' weights are float32 (each adapter's are all of one dtype)."""
    return all(next(iter(a.weights.values()))[0].dtype == torch.float32 for a in adapters)


def _padded_stack(
    pairs: list[tuple[torch.Tensor, torch.Tensor]],
) -> tuple[torch.Tensor, torch.Tensor]:
    """[(A [r, in], B [out, r])] -> A [N, R, in], B [N, out, R], zeros past each rank."""
    if len(pairs) == 1:  # the usual batch: a view, no copy
        a, b = pairs[0]
        return a.unsqueeze(0), b.unsqueeze(0)
    a0, b0 = pairs[0]
    rank = max(a.shape[0] for a, _ in pairs)
    a_stack = a0.new_zeros(len(pairs), rank, a0.shape[1])
    b_stack = b0.new_zeros(len(pairs), b0.shape[0], rank)
    for n, (a, b) in enumerate(pairs):
        a_stack[n, : a.shape[0]] = a
        b_stack[n, :, : b.shape[1]] = b
    return a_stack, b_stack
