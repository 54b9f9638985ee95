"""What every `braid bench grammar` scoring shares: the schema files (our corpus and
MaskBench), each instance serialized as the grammar expects it, fed token by token to a
matcher, and the timings summarized."""

from __future__ import annotations

import json
import statistics
from dataclasses import dataclass
from pathlib import Path
from typing import Any

CORPUS_DIR = Path(__file__).resolve().parents[3] / "tests" / "data" / "schemas"


@dataclass(frozen=True)
class SchemaCase:
    """One corpus or MaskBench file."""

    name: str
    description: str
    schema: Any
    tests: tuple[tuple[bool, Any], ...]  # (valid, data)
    expect: str | None = None  # corpus only: "compiled" or "rejected"
    reject_reason: str | None = None


def load_case(path: Path) -> SchemaCase:
    doc = json.loads(path.read_text())
    return SchemaCase(
        name=path.stem,
        description=doc.get("description", ""),
        schema=doc["schema"],
        tests=tuple((t["valid"], t["data"]) for t in doc.get("tests", [])),
        expect=doc.get("expect"),
        reject_reason=doc.get("reject_reason"),
    )


def load_corpus(directory: Path = CORPUS_DIR) -> list[SchemaCase]:
    return [load_case(p) for p in sorted(directory.glob("*.json"))]


def load_test_suite(directory: Path) -> list[SchemaCase]:
    """The JSON-Schema-Test-Suite's layout (a checkout's tests/draft2020-12, say): each file
    a list of groups, each group one schema and its instances; one case a group, named
    FILE_INDEX."""
    cases = []
    for path in sorted(directory.glob("*.json")):
        groups = json.loads(path.read_text())
        for i, group in enumerate(groups):
            cases.append(
                SchemaCase(
                    name=f"{path.stem}_{i}",
                    description=group.get("description", ""),
                    schema=group["schema"],
                    tests=tuple((t["valid"], t["data"]) for t in group.get("tests", [])),
                )
            )
    return cases


def serialize(data: Any, schema: Any) -> str:
    """The instance as the grammar expects it: compact, properties in schema order."""
    ordered = _SchemaOrder(schema).order(data, schema)
    return json.dumps(ordered, separators=(",", ":"), ensure_ascii=False)


class _SchemaOrder:
    """Reorders an instance's object keys: the properties the schema lists, in its order (the
    object's own, then allOf parts, then the anyOf/oneOf branch the value matches), then
    required names it does not list, then any other keys as they came."""

    def __init__(self, root: Any) -> None:
        from jsonschema import Draft202012Validator
        from jsonschema.validators import validator_for

        self.root = root
        self.validator = validator_for(root, default=Draft202012Validator)(root)

    def order(self, value: Any, schema: Any) -> Any:
        parts = self.parts(schema, value, 0)
        if isinstance(value, dict):
            subschemas: dict[str, Any] = {}
            for part in parts:
                props = part.get("properties")
                for name, sub in props.items() if isinstance(props, dict) else ():
                    subschemas.setdefault(name, sub)
            for part in parts:
                required = part.get("required")
                for name in required if isinstance(required, list) else ():
                    subschemas.setdefault(name, True)
            extra = next(
                (p["additionalProperties"] for p in parts if "additionalProperties" in p), True
            )
            keys = [k for k in subschemas if k in value] + [k for k in value if k not in subschemas]
            return {k: self.order(value[k], subschemas.get(k, extra)) for k in keys}
        if isinstance(value, list):
            prefix: list = []
            items: Any = True
            for part in parts:
                listed = part.get("prefixItems", part.get("items"))
                if isinstance(listed, list) and not prefix:
                    prefix = listed
                elif "items" in part and not isinstance(part["items"], list) and items is True:
                    items = part["items"]
            return [
                self.order(v, prefix[i] if i < len(prefix) else items) for i, v in enumerate(value)
            ]
        return value

    def parts(self, schema: Any, value: Any, depth: int) -> list[dict]:
        schema = self.resolve(schema)
        if not isinstance(schema, dict) or depth > 32:
            return []
        found = [schema]
        for sub in schema.get("allOf", []) if isinstance(schema.get("allOf"), list) else []:
            found += self.parts(sub, value, depth + 1)
        for key in ("anyOf", "oneOf"):
            branches = schema.get(key)
            for sub in branches if isinstance(branches, list) else []:
                if self.matches(sub, value):
                    found += self.parts(sub, value, depth + 1)
                    break
        return found

    def matches(self, schema: Any, value: Any) -> bool:
        try:
            return self.validator.evolve(schema=schema).is_valid(value)
        except Exception:  # an unresolvable $ref or a malformed branch: not this one
            return False

    def resolve(self, schema: Any) -> Any:
        from braid.grammars.json_schema.convert import resolve_pointer

        for _ in range(32):  # a $ref chain; a cycle of bare refs ends here
            if not (isinstance(schema, dict) and isinstance(schema.get("$ref"), str)):
                return schema
            ref = schema["$ref"]
            schema = resolve_pointer(self.root, ref) if ref.startswith("#") else None
            if not isinstance(schema, (dict, bool)):
                return {}
        return {}


def allows(row, token_id: int) -> bool:
    word = int(row[token_id // 32])
    return (word >> (token_id % 32)) & 1 == 1


def feed(matcher, token_ids: list[int], eos_id: int, row) -> tuple[int | None, list[float]]:
    """Fill the mask before each token, then before EOS. Returns (the index of the first
    token the mask refused, len(token_ids) meaning EOS; None if all were allowed) and the
    seconds each fill took. A token the mask allows but `accept_token` refuses is a bug in
    the matcher: it raises."""
    from time import perf_counter

    seconds = []
    for i, token in enumerate([*token_ids, eos_id]):
        start = perf_counter()
        matcher.fill_bitmask(row)
        seconds.append(perf_counter() - start)
        if not allows(row, token):
            return i, seconds
        if not matcher.accept_token(token):
            raise RuntimeError(f"token {token} at {i} is in the mask but accept_token refused it")
    return None, seconds


def load_vocabulary(model: str | None) -> tuple[Any, Any]:
    """(the model's tokenizer, its grammar vocabulary with EOS as the stop token)."""
    from braid import grammars
    from braid.runtime.loading.model_loader import resolve_model_dir
    from braid.runtime.text.tokenizer import load_tokenizer

    tokenizer = load_tokenizer(resolve_model_dir(model))
    vocab = grammars.build_vocabulary(tokenizer, {tokenizer.eos_token_id})
    return tokenizer, vocab


def percentiles(values: list[float], scale: float) -> dict:
    """p50 and p99 of `values` times `scale` (seconds to ms: 1e3), and how many."""
    if not values:
        return {"p50": float("nan"), "p99": float("nan"), "n": 0}
    ordered = sorted(values)
    p99 = ordered[min(len(ordered) - 1, int(0.99 * len(ordered)))]
    return {"p50": statistics.median(ordered) * scale, "p99": p99 * scale, "n": len(ordered)}
