"""The kinds of compile job, each declared once in KINDS: what it produces, how that travels
back from a compile worker, and what the caller's process makes of it.

A job compiles in two halves. `produce(job, vocab, index)` is the part that can take seconds
and gigabytes for a hostile input: GrammarCompiler runs it in a worker process
(compile_worker.py) under time and memory limits, `compile()` in the caller's process. It
yields its results one at a time; a worker sends each as soon as it is made (`dump`), and the
caller reads it back (`load`). `assemble(job, vocab, run, max_state_mb)` makes the compiled
job from them in the caller's process, where `run(job, index)` starts `produce` and hands
back its results in order (`Results.next`).

- A stop regex (CharPattern): its character automaton, a CharRegex (grammars/regex/char_regex.py).
- A grammar: read in its dialect (grammars/dialects); one whose rules do not recurse is its
  regex, compiled as a regex's (below); else lark's parse table over terminal automata
  (grammars/ebnf/grammar.py), sent without the vocabulary structures every EBNF grammar
  shares.
- A regex, JSON schema, choices, tool calls or structural tag: their regex
  (grammars/compiling/constraint_regex.py; for tool calls grammars/tool_calls.py, from each
  tool's schema; for a structural tag grammars/structural_tag_regex.py), then, where `index` asks,
  its outlines index (grammars/regex/outlines_index.py) or None. The regex becomes the lazy
  automaton (grammars/regex/lazy.py), which makes states and masks as they are reached:
  compiling costs milliseconds, and each state's mask one walk of the vocabulary the first
  time it is needed. An index (every state x every token, built up front: up to seconds for
  a JSON schema) is asked for only where the lazy automaton cannot serve: without a C++
  compiler, or for a regex its parser refuses. Both give the same masks. The regex comes
  first so that an index running past INDEX_BUDGET_S or the worker's memory can be dropped
  for the lazy automaton over it.

A new kind is one JobKind in KINDS. Only what a worker needs is imported at the top: the
compile worker starts without torch.
"""

from __future__ import annotations

import logging
import pickle
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

from braid.grammars.compiling.constraint_regex import constraint_regex
from braid.grammars.constraints import (
    Choices,
    Constraint,
    Ebnf,
    JsonSchema,
    Regex,
    StructuralTag,
    ToolCalls,
)
from braid.grammars.regex.char_regex import CharPattern, CharRegex

if TYPE_CHECKING:
    from braid.grammars.compiling.compiler import Compiled
    from braid.grammars.matcher import Grammar
    from braid.grammars.vocabulary import TokenVocabulary

log = logging.getLogger(__name__)

Job = Constraint | CharPattern  # what a compiler takes

# Where an index is built (see above), one that takes longer than this is abandoned for the
# lazy automaton when it is there: its cost (states x vocabulary) is hard to predict.
INDEX_BUDGET_S = 1.0


class Results(Protocol):
    """A running job's results, in the order `produce` yields them."""

    def next(self, budget_s: float | None = None) -> Any:
        """The next result. In a worker, one that does not come within `budget_s` (or the
        job's time limit), or whose making crashes the worker, raises ResultLost."""
        ...


# run(job, index): the job's `produce` started here or in a worker.
Run = Callable[[Job, bool], Results]


class ResultLost(Exception):
    """A worker did not send a result: it ran past its time or memory limit, or crashed (and
    has been stopped)."""


def _unpickle(data: bytes, vocab: TokenVocabulary) -> Any:
    return pickle.loads(data)


@dataclass(frozen=True)
class JobKind:
    """How one kind of job compiles (see the module docstring)."""

    what: str  # the job, as error messages name it
    produce: Callable[[Any, TokenVocabulary, bool], Iterator[Any]]
    assemble: Callable[[Any, TokenVocabulary, Run, int], Compiled]
    dump: Callable[[Any], bytes] = pickle.dumps
    load: Callable[[bytes, TokenVocabulary], Any] = _unpickle
    # What the compiled jobs of this kind share over the vocabulary, counted in a compiler's
    # cache memory once it has compiled one (None: nothing beyond the vocabulary).
    shared_bytes: Callable[[TokenVocabulary], int] | None = None


def kind_of(job: Job) -> JobKind:
    try:
        return KINDS[type(job)]
    except KeyError:
        raise TypeError(f"not a compile job: {job!r}") from None


class _Here:
    """Results made in this process as they are asked for, without limits (`compile()`)."""

    def __init__(self, results: Iterator[Any]) -> None:
        self._results = results

    def next(self, budget_s: float | None = None) -> Any:
        return next(self._results)


def run_here(vocab: TokenVocabulary) -> Run:
    """`run` in this process."""
    return lambda job, index: _Here(kind_of(job).produce(job, vocab, index))


def _only_result(job: Job, vocab: TokenVocabulary, run: Run, max_state_mb: int) -> Compiled:
    """For a kind whose one result is what it compiles to."""
    return run(job, False).next()


# ---- stop regexes --------------------------------------------------------------------------


def _char_regex(job: CharPattern, vocab: TokenVocabulary, index: bool) -> Iterator[CharRegex]:
    yield CharRegex(job.pattern)


# ---- EBNF grammars -------------------------------------------------------------------------


def _ebnf(job: Ebnf, vocab: TokenVocabulary, index: bool) -> Iterator:
    """The grammar's EbnfGrammar, or (read in a dialect, no rule recursing) what a regex
    job yields for its regex."""
    from braid.grammars import dialects
    from braid.grammars.ebnf.grammar import EbnfGrammar

    rules = dialects.read(job.grammar)
    if rules is None:
        yield EbnfGrammar(job.grammar, vocab)
        return
    for schema in rules.json_schemas():
        rules.json_regex[schema] = constraint_regex(dialects.json_constraint(schema))
    pattern = rules.regex()
    if pattern is None:
        text, budgets = rules.lark()
        yield EbnfGrammar(text, vocab, budgets)
        return
    yield from _regex_results(pattern, vocab, index)


def _dump_ebnf(result) -> bytes:
    from braid.grammars.ebnf.grammar import EbnfGrammar

    if isinstance(result, EbnfGrammar):
        return b"E" + result.dumps()
    return b"R" + _dump_regex_result(result)


def _load_ebnf(data: bytes, vocab: TokenVocabulary) -> Any:
    from braid.grammars.ebnf.grammar import EbnfGrammar

    if data[:1] == b"E":
        return EbnfGrammar.loads(data[1:], vocab)
    return pickle.loads(data[1:])


def _ebnf_shared_bytes(vocab: TokenVocabulary) -> int:
    from braid.grammars.ebnf.grammar import trie_memory_bytes

    return trie_memory_bytes(vocab)


# ---- regexes, JSON schemas, choices, tool calls, structural tags ----------------------------

RegexJob = Regex | JsonSchema | Choices | ToolCalls | StructuralTag  # through their regex


def _regex(job: RegexJob, vocab: TokenVocabulary, index: bool) -> Iterator:
    """The job's regex, then, where `index` asks, its outlines index or None (too large for
    an index, past outlines' limits, or out of memory building it)."""
    yield from _regex_results(constraint_regex(job), vocab, index)


def _regex_results(pattern: str, vocab: TokenVocabulary, index: bool) -> Iterator:
    yield pattern
    if not index:
        return
    from braid.grammars.regex.outlines_index import IndexUnbuildable, build_index, fits_index

    if not fits_index(pattern):
        yield None
        return
    try:
        yield build_index(pattern, vocab)
    except (MemoryError, IndexUnbuildable):
        yield None


def _dump_regex_result(result) -> bytes:
    """The regex or its index pickled; an index that runs out of memory pickling goes as None
    (the lazy automaton takes the regex)."""
    try:
        return pickle.dumps(result)
    except MemoryError:
        if isinstance(result, str):
            raise
        return pickle.dumps(None)


def _regex_grammar(job: Job, vocab: TokenVocabulary, run: Run, max_state_mb: int) -> Grammar:
    """The job's grammar from its first result: a regex (a regex job's, or a grammar's that
    does not recurse) compiled below, or a grammar as it came (an EbnfGrammar)."""
    from braid.grammars.regex.lazy import lazy_available

    lazy = lazy_available()
    results = run(job, not lazy)
    first = results.next()
    if not isinstance(first, str):
        return first
    return _regex_grammar_of(job, first, results, lazy, vocab, run, max_state_mb)


def _regex_grammar_of(
    job: Job,
    pattern: str,
    results: Results,
    lazy: bool,
    vocab: TokenVocabulary,
    run: Run,
    max_state_mb: int,
) -> Grammar:
    """The grammar of a job's regex `pattern`: the lazy automaton's, or where it is not
    available or refuses the syntax, the outlines index `results` holds (or a rerun makes)."""
    from braid.grammars.regex.grammar import RegexGrammar
    from braid.grammars.regex.lazy import LazyRegexGrammar, LazyUnsupported

    index = None if lazy else _index(results)
    refusal = None
    if index is None and lazy:
        try:
            return LazyRegexGrammar(pattern, vocab, max_state_mb)
        except LazyUnsupported as e:
            refusal = e
            results = run(job, True)  # syntax only outlines reads
            pattern, index = results.next(), _index(results)
    if index is None:
        raise refusal or ValueError(
            f"regex {pattern[:200]!r} is too large to compile without lazy_dfa.cpp"
        )
    return RegexGrammar(index, vocab, pattern)


def _index(results: Results) -> Any:
    """The index after the regex, where it came within INDEX_BUDGET_S."""
    try:
        return results.next(INDEX_BUDGET_S)
    except ResultLost as e:
        log.info("outlines index abandoned (%s); compiling the regex lazily", e)
        return None


_REGEX = JobKind("the constraint", _regex, _regex_grammar, dump=_dump_regex_result)

KINDS: dict[type, JobKind] = {
    CharPattern: JobKind("the stop regex", _char_regex, _only_result),
    Ebnf: JobKind(
        "the constraint",
        _ebnf,
        _regex_grammar,
        dump=_dump_ebnf,
        load=_load_ebnf,
        shared_bytes=_ebnf_shared_bytes,
    ),
    Regex: _REGEX,
    JsonSchema: _REGEX,
    Choices: _REGEX,
    ToolCalls: _REGEX,
    StructuralTag: _REGEX,
}
