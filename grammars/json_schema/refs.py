"""References turned into pointers from the document's root, or refused by name.

The converter follows `$ref`s that are JSON pointers from the root ("#/$defs/a"). What else
a reference may say is rewritten into such a pointer first, as a validator would read it:
- a URI resolved against the base URI where the reference stands: `$id` (`id` in draft 4)
  changes the base inside its subschema, so "#/$defs/a" in an embedded resource points into
  that resource, and "other.json#/a" into the resource whose id it names;
- a plain-name fragment ("#node") names an anchor: `$anchor` (2019-09 on), `$dynamicAnchor`
  (2020-12), or an id that is a fragment alone (drafts 4 to 7);
- `$dynamicRef` (2020-12) goes where `$ref` would, unless its target holds the dynamic
  anchor it names: then to the outermost resource of the dynamic scope that defines it. The
  root resource is always outermost, and a name that only one resource defines has one
  answer too; any other case depends on the path taken, and is refused;
- `$recursiveRef` (2019-09) likewise with `$recursiveAnchor`.
A reference to a document that is not this one is refused. Schemas without identifiers or
anchors (nearly all) skip the rewrite.
"""

from __future__ import annotations

import copy
from collections.abc import Callable
from typing import Any
from urllib.parse import unquote, urldefrag, urljoin

from braid.grammars.json_schema.errors import InvalidSchema, UnsupportedSchema

# Keywords whose value is one schema, a list of schemas, or a map of names to schemas: the
# places where an `$id` starts an embedded resource.
_ONE = {
    "additionalProperties", "additionalItems", "unevaluatedProperties", "unevaluatedItems",
    "contains", "propertyNames", "not", "if", "then", "else", "items", "contentSchema",
}  # fmt: skip
_LIST = {"allOf", "anyOf", "oneOf", "prefixItems", "items"}
_MAP = {"properties", "patternProperties", "$defs", "definitions", "dependentSchemas",
        "dependencies"}  # fmt: skip
# Keywords whose value is data, never a schema.
_DATA = {"enum", "const", "default", "examples", "example", "required"}
_DYNAMIC = {"$id", "id", "$anchor", "$dynamicAnchor", "$dynamicRef", "$recursiveRef",
            "$recursiveAnchor"}  # fmt: skip


def draft_of(root: Any) -> int:
    """The draft a schema declares (4, 6, 7, 2019 or 2020); 2020 when it declares none, as
    validators default to the latest."""
    declared = root.get("$schema") if isinstance(root, dict) else None
    if not isinstance(declared, str):
        return 2020
    for marker, draft in (("draft-03", 4), ("draft-04", 4), ("draft-06", 6), ("draft-07", 7),
                          ("2019-09", 2019)):  # fmt: skip
        if marker in declared:
            return draft
    return 2020


def local_refs(root: Any) -> Any:
    """`root` with every reference a pointer from the root (a rewritten copy where needed)."""
    if not _needs_rewrite(root):
        return root
    index = _Index(draft_of(root))
    index.walk(root, (), "", (), True)
    rewrites = []  # (pointer of the schema, {reference keyword: pointer it names})
    for pointer, node in index.refs:
        keys = [k for k in ("$ref", "$dynamicRef", "$recursiveRef") if isinstance(node.get(k), str)]
        targets = {key: index.target(node, key, pointer) for key in keys}
        if targets != {"$ref": node.get("$ref")}:
            rewrites.append((pointer, targets))
    if not rewrites:
        return root
    out = copy.deepcopy(root)
    for pointer, targets in rewrites:
        node = _node_at(out, pointer)
        for key in targets:
            del node[key]
        refs = list(dict.fromkeys(targets.values()))
        if len(refs) == 1:
            node["$ref"] = refs[0]
        else:  # a $ref and a dynamic one: each applies
            node["allOf"] = [*node.get("allOf", []), *({"$ref": r} for r in refs)]
    return out


def _needs_rewrite(root: Any) -> bool:
    """Whether any schema holds an identifier, an anchor, a dynamic reference or a `$ref`
    that is not a pointer from the root."""
    stack = [root]
    while stack:
        node = stack.pop()
        if isinstance(node, list):
            stack.extend(node)
        elif isinstance(node, dict):
            if node.keys() & _DYNAMIC:
                return True
            ref = node.get("$ref")
            if isinstance(ref, str) and not (ref == "#" or ref.startswith("#/")):
                return True
            for key, value in node.items():
                if key in _MAP and isinstance(value, dict):
                    stack.extend(value.values())
                elif key not in _DATA:
                    stack.append(value)
    return False


class _Index:
    """Where the document's resources, anchors and references are."""

    def __init__(self, draft: int) -> None:
        self.draft = draft
        self.resources: dict[str, tuple] = {}  # base URI -> pointer of its root
        self.anchors: dict[tuple[str, str], tuple] = {}  # (base URI, name) -> pointer
        self.dynamic: dict[str, list[tuple[str, tuple]]] = {}  # name -> (base URI, pointer)
        self.recursive: list[tuple] = []  # resource roots with $recursiveAnchor: true
        self.refs: list[tuple[tuple, dict]] = []  # (pointer, schema) holding a reference
        self.bases: dict[tuple, tuple[str, tuple]] = {}  # schema pointer -> (base, resource)
        self.root_base = ""

    def walk(self, node: Any, pointer: tuple, base: str, resource: tuple, known: bool) -> None:
        if isinstance(node, list):
            for i, item in enumerate(node):
                self.walk(item, (*pointer, i), base, resource, known)
            return
        if not isinstance(node, dict):
            return
        ident = self.identifier(node)
        if ident is not None and not ident.startswith("#"):
            if not known:
                raise UnsupportedSchema(
                    f"an '$id' inside an unknown keyword at {_show(pointer)} (its resource "
                    "is not one a validator would see)"
                )
            base = urldefrag(urljoin(base, ident))[0]
            resource = pointer
            self.resources.setdefault(base, pointer)
            if not pointer:
                self.root_base = base
        self.resources.setdefault(base, resource)
        for name in self.anchor_names(node, ident):
            self.anchors.setdefault((base, name), pointer)
        if self.draft >= 2020 and isinstance(node.get("$dynamicAnchor"), str):
            self.dynamic.setdefault(node["$dynamicAnchor"], []).append((base, pointer))
        if node.get("$recursiveAnchor") is True and pointer == resource:
            self.recursive.append(pointer)
        if any(isinstance(node.get(k), str) for k in ("$ref", "$dynamicRef", "$recursiveRef")):
            self.refs.append((pointer, node))
        self.bases[pointer] = (base, resource)
        for key, value in node.items():
            if key in _DATA:
                continue
            here = (*pointer, key)
            if key in _MAP and isinstance(value, dict):
                for name, sub in value.items():
                    self.walk(sub, (*here, name), base, resource, known)
            else:
                schema_place = key in _ONE or key in _LIST
                self.walk(value, here, base, resource, known and schema_place)

    def identifier(self, node: dict) -> str | None:
        key = "id" if self.draft == 4 else "$id"
        if self.draft <= 7 and "$ref" in node:
            return None  # drafts up to 7 ignore everything beside a $ref
        ident = node.get(key)
        return ident if isinstance(ident, str) else None

    def anchor_names(self, node: dict, ident: str | None) -> list[str]:
        names = []
        if self.draft <= 7 and ident is not None and ident.startswith("#") and len(ident) > 1:
            names.append(ident[1:])
        if self.draft >= 2019 and isinstance(node.get("$anchor"), str):
            names.append(node["$anchor"])
        if self.draft >= 2020 and isinstance(node.get("$dynamicAnchor"), str):
            names.append(node["$dynamicAnchor"])
        return names

    def target(self, node: dict, key: str, pointer: tuple) -> str:
        """The pointer from the root that `node[key]` (a reference) names."""
        ref = node[key]
        base, resource = self.bases[pointer]
        if key == "$recursiveRef":
            return self.recursive_target(ref, resource, pointer)
        uri, fragment = urldefrag(urljoin(base, ref))
        if uri not in self.resources:
            raise UnsupportedSchema(
                f"'{key}' {ref!r} at {_show(pointer)} names another document (only references "
                "within the schema are supported)"
            )
        fragment = unquote(fragment)
        if fragment == "" or fragment.startswith("/"):
            found = (*self.resources[uri], *_segments(fragment))
        else:
            found = self.anchors.get((uri, fragment))
            if found is None:
                raise InvalidSchema(f"'{key}' {ref!r} at {_show(pointer)} names no anchor")
            if key == "$dynamicRef":
                found = self.dynamic_target(fragment, found, pointer)
        return _pointer(found)

    def dynamic_target(self, name: str, static: tuple, pointer: tuple) -> tuple:
        holders = self.dynamic.get(name, [])
        if static not in [p for _, p in holders]:
            return static  # the target holds no dynamic anchor of that name: a plain $ref
        outermost = [p for base, p in holders if base == self.root_base]
        if outermost or len(holders) == 1:
            return (outermost or [holders[0][1]])[0]
        raise UnsupportedSchema(
            f"'$dynamicRef' '#{name}' at {_show(pointer)}: several resources define the "
            "dynamic anchor, so the target depends on the path taken"
        )

    def recursive_target(self, ref: str, resource: tuple, pointer: tuple) -> str:
        """`$recursiveRef` goes to its resource's root; where that root sets
        `$recursiveAnchor`, to the outermost anchored resource: the root when it is
        anchored, the one anchored resource when there is only one."""
        if ref != "#":
            raise InvalidSchema(f"'$recursiveRef' must be '#' at {_show(pointer)}")
        if resource not in self.recursive:
            return _pointer(resource)
        if () in self.recursive or len(self.recursive) == 1:
            return _pointer(() if () in self.recursive else resource)
        raise UnsupportedSchema(
            f"'$recursiveRef' at {_show(pointer)}: several resources set $recursiveAnchor, so "
            "the target depends on the path taken"
        )


def _segments(fragment: str) -> list[str]:
    return [s.replace("~1", "/").replace("~0", "~") for s in fragment.split("/")[1:]]


def _pointer(parts: tuple) -> str:
    return "#" + "".join("/" + str(p).replace("~", "~0").replace("/", "~1") for p in parts)


def _show(pointer: tuple) -> str:
    return _pointer(pointer)


def _node_at(root: Any, pointer: tuple) -> Any:
    for part in pointer:
        root = root[part]
    return root


def recursive_refs(root: Any, resolve: Callable[[str], Any]) -> frozenset[str]:
    """The `$ref` pointers that lie on a cycle: following one may lead back to it, so it is
    recursion, which the converter unrolls to a bounded depth. Other references (nested
    models, shared definitions) are a finite chain and are followed to their end.
    `resolve(pointer)` is what a pointer names (None for nothing)."""
    found = _refs_within(root)
    edges: dict[str, list[str]] = {}
    while found:
        ref = found.pop()
        if ref not in edges:
            target = resolve(ref)
            edges[ref] = sorted(_refs_within(target)) if target is not None else []
            found.update(edges[ref])
    return frozenset(r for component in _components(edges) for r in component)


def _refs_within(node: Any) -> set[str]:
    """The local `$ref` pointers anywhere in a schema."""
    refs, stack = set(), [node]
    while stack:
        node = stack.pop()
        if isinstance(node, list):
            stack.extend(node)
        elif isinstance(node, dict):
            ref = node.get("$ref")
            if isinstance(ref, str) and ref.startswith("#"):
                refs.add(ref)
            stack.extend(v for k, v in node.items() if k not in _DATA)
    return refs


def _components(edges: dict[str, list[str]]) -> list[list[str]]:
    """The cyclic strongly connected components of a graph (Tarjan's, iteratively): each
    of more than one node, or of one node with an edge to itself."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    on_stack: set[str] = set()
    stack: list[str] = []
    out = []
    for start in edges:
        if start in index:
            continue
        work = [(start, 0)]
        while work:
            node, i = work.pop()
            if i == 0:
                index[node] = low[node] = len(index)
                stack.append(node)
                on_stack.add(node)
            successors = edges[node]
            if i < len(successors):
                work.append((node, i + 1))
                nxt = successors[i]
                if nxt not in index:
                    work.append((nxt, 0))
                elif nxt in on_stack:
                    low[node] = min(low[node], index[nxt])
                continue
            if low[node] == index[node]:
                component = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.append(member)
                    if member == node:
                        break
                if len(component) > 1 or node in successors:
                    out.append(component)
            if work:
                parent = work[-1][0]
                low[parent] = min(low[parent], low[node])
    return out
