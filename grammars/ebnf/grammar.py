"""EBNF grammars (lark syntax) as a token-level matcher.

lark builds the LALR(1) parse table; we drive it ourselves over immutable state stacks so
that a parser position is a hashable value that costs nothing to keep for rollback. The
terminals are byte automata (grammars.ebnf_lexer). A position is (lexer state, parser stack).

The mask for a position walks a byte trie of the vocabulary. The walk is split where it
stops depending on the parser: `_lex_walk(lex, node)` follows the lexer alone below a trie
node and is cached on the grammar (it yields the tokens that stay inside the current
terminal, or pass through ignored ones, and the places where a terminal ends inside a
token); only those places consult the parser. Whole masks are cached per position too, so
a repeated structure (list items, object members) costs a lookup.
"""

from __future__ import annotations

import io
import pickle
import sys
import types
from collections import OrderedDict

import lark
import numpy as np
import torch
from lark.exceptions import LarkError
from lark.lexer import PatternStr
from lark.parsers.lalr_analysis import Shift

from braid.grammars.ebnf.lexer import CONTINUE, EMIT, Lexer, LexState, build_terminal
from braid.grammars.matcher import Grammar, Matcher, bitmask_words, set_bits
from braid.grammars.vocabulary import TokenVocabulary, per_vocabulary

Stack = tuple[int, ...]
Position = tuple[LexState, Stack]

_MASK_CACHE = 4096  # masks kept per grammar (each is V/8 bytes)
_STEP_CACHE = 200_000  # parser steps and lexer walks kept per grammar before starting over
_MAX_FORCED_CHARS = 4096


class EbnfGrammar(Grammar):
    """`budgets`: terminals (by name) whose lexeme may take at most this many tokens, after
    which it ends where it stands (llguidance's max_tokens inside a grammar)."""

    def __init__(
        self, text: str, vocab: TokenVocabulary, budgets: dict[str, int] | None = None
    ) -> None:
        try:
            parser = lark.Lark(text, parser="lalr", lexer="contextual", start="start")
        except LarkError as e:
            raise ValueError(f"invalid EBNF grammar: {type(e).__name__}: {e}") from None
        self.text = text
        self.vocab = vocab
        table = parser.parser.parser._parse_table
        # lark's table as plain values (its Shift marker does not survive pickling): per
        # state, a symbol -> the state to shift to (an int), or the rule to reduce by
        # (its length, its head's name).
        self._states = {
            state: {
                name: arg if kind is Shift else (len(arg.expansion), arg.origin.name)
                for name, (kind, arg) in actions.items()
            }
            for state, actions in table.states.items()
        }
        self._end_state = table.end_states["start"]
        names = [t.name for t in parser.terminals]
        self._term_id = {name: i for i, name in enumerate(names)}
        self._names = names
        terminals = [
            build_terminal(
                t.name, t.pattern.to_regexp(), t.priority, isinstance(t.pattern, PatternStr)
            )
            for t in parser.terminals
        ]
        self.ignore = frozenset(self._term_id[n] for n in parser.ignore_tokens)
        self.budgets = {self._term_id[n]: k for n, k in (budgets or {}).items()}
        self.lexer = Lexer(terminals, self.ignore)
        self.trie = _token_trie(vocab)
        self.eos_ids = np.array(sorted(vocab.eos_token_ids), dtype=np.int64)
        self.words = bitmask_words(vocab.size)
        self._feeds: dict[tuple[Stack, int], Stack | None] = {}
        self._accepted: dict[Stack, frozenset[int]] = {}
        self._walks: dict[tuple[LexState, int], tuple] = {}
        self._masks: OrderedDict[Position, tuple[np.ndarray, bool]] = OrderedDict()
        self._table_bytes: int | None = None  # memory_bytes' estimate of the tables
        start: Stack = (table.start_states["start"],)
        self.initial: Position = (self._fresh(start), start)
        self.mask(self.initial)  # the first mask's walk is the slow one: pay it here

    def matcher(self) -> EbnfMatcher:
        return EbnfMatcher(self)

    def memory_bytes(self) -> int:
        """An estimate: the parse table and terminal automata (their objects, counted once),
        and the memo tables filled so far (per entry, what tracemalloc measured)."""
        if self._table_bytes is None:
            self._table_bytes = _deep_size((self._states, self.lexer, self._names, self._term_id))
        # Snapshots: the engine's thread may be adding entries (copying a dict is atomic).
        walks = tuple(self._walks.values())
        masks = len(self._masks) * (self.words * 4 + 260)
        walked = sum(
            ids.nbytes + 260 + 140 * (len(ends) + len(later)) for ids, ends, later in walks
        )
        memos = 150 * len(self._feeds) + 250 * len(self._accepted) + 100 * self.lexer.memo_entries()
        return self._table_bytes + masks + walked + memos + len(self.text)

    # The compile worker builds grammars (lark's tables and the terminals' automata can take
    # seconds); one travels back without the vocabulary and its trie, which the receiving
    # process already holds.

    def dumps(self) -> bytes:
        shared = {id(self.vocab): "vocab", id(self.trie): "trie"}
        out = io.BytesIO()
        pickler = pickle.Pickler(out, protocol=pickle.HIGHEST_PROTOCOL)
        pickler.persistent_id = lambda obj: shared.get(id(obj))
        pickler.dump(self)
        return out.getvalue()

    @staticmethod
    def loads(data: bytes, vocab: TokenVocabulary) -> EbnfGrammar:
        shared = {"vocab": vocab, "trie": _token_trie(vocab)}
        unpickler = pickle.Unpickler(io.BytesIO(data))
        unpickler.persistent_load = shared.__getitem__
        return unpickler.load()

    # ---- the parser ---------------------------------------------------------------------

    def _feed(self, stack: Stack, terminal: int | str) -> Stack | None:
        """The stack after shifting `terminal` (an id, or "$END"), or None if refused."""
        key = (stack, terminal)
        if key in self._feeds:
            return self._feeds[key]
        name = terminal if isinstance(terminal, str) else self._names[terminal]
        result = None
        while (action := self._states[stack[-1]].get(name)) is not None:
            if isinstance(action, int):
                result = stack + (action,)
                break
            length, head = action
            if length:
                stack = stack[:-length]
            stack = stack + (self._states[stack[-1]][head],)
            if name == "$END" and stack[-1] == self._end_state:
                result = stack
                break
        self._feeds[key] = result
        return result

    def _fresh(self, stack: Stack) -> LexState:
        accepted = self._accepted.get(stack)
        if accepted is None:
            names = (n for n in self._states[stack[-1]] if n in self._term_id)
            accepted = frozenset(
                self._term_id[n] for n in names if self._feed(stack, self._term_id[n])
            )
            self._accepted[stack] = accepted
        return self.lexer.fresh(accepted)

    def _after(self, stack: Stack, terminal: int, ch: str) -> Position | None:
        """Feed `terminal`, then start the next one with `ch`."""
        stack2 = self._feed(stack, terminal)
        if stack2 is None:
            return None
        result = self.lexer.step_char(self._fresh(stack2), ch)
        return (result[1], stack2) if result[0] == CONTINUE else None

    def budgeted(self, position: Position) -> int | None:
        """The budgeted terminal whose lexeme `position` is inside, if any."""
        lex = position[0]
        if lex[2]:
            return None
        return next((t for t, _ in lex[0] if t in self.budgets), None)

    def ended(self, position: Position, terminal: int) -> Position | None:
        """`position` with `terminal`'s lexeme ended where it stands, or None where it cannot
        end (inside a character, or not at a final state)."""
        lex, stack = position
        state = dict(lex[0]).get(terminal)
        if lex[1] or state not in self.lexer.terminals[terminal].fsm.finals:
            return None
        stack2 = self._feed(stack, terminal)
        return None if stack2 is None else (self._fresh(stack2), stack2)

    def can_end(self, position: Position) -> bool:
        lex, stack = position
        if lex[1]:
            return False
        if not lex[2]:
            last = self.lexer.best_final(lex)
            if last is None:
                return False
            if last not in self.ignore:
                stack = self._feed(stack, last)
                if stack is None:
                    return False
        return self._feed(stack, "$END") is not None

    def advance(self, position: Position, data: bytes) -> Position | None:
        lex, stack = position
        for byte in data:
            result = self.lexer.step_byte(lex, byte)
            if result[0] == CONTINUE:
                lex = result[1]
            elif result[0] == EMIT:
                after = self._after(stack, result[1], result[2])
                if after is None:
                    return None
                lex, stack = after
            else:
                return None
        return lex, stack

    # ---- masks --------------------------------------------------------------------------

    def mask(self, position: Position) -> tuple[np.ndarray, bool]:
        """(int32 bitmask words, True when only EOS is allowed)."""
        hit = self._masks.get(position)
        if hit is not None:
            self._masks.move_to_end(position)
            return hit
        # A shared grammar lives as long as the engine: keep its memo tables bounded.
        for memo in (self._feeds, self._accepted, self._walks):
            if len(memo) > _STEP_CACHE:
                memo.clear()
        allowed = np.zeros(self.vocab.size, dtype=bool)
        self._walk(position, 0, allowed)
        only_eos = not allowed.any()
        if self.can_end(position):
            allowed[self.eos_ids] = True
        packed = np.zeros(self.words * 4, dtype=np.uint8)
        bits = np.packbits(allowed, bitorder="little")
        packed[: bits.size] = bits
        hit = (packed.view(np.int32), only_eos)
        self._masks[position] = hit
        if len(self._masks) > _MASK_CACHE:
            self._masks.popitem(last=False)
        return hit

    def _walk(self, position: Position, node: int, allowed: np.ndarray) -> None:
        lex, stack = position
        ids, ends, pending_ends = self._lex_walk(lex, node)
        allowed[ids] = True
        trie = self.trie
        for child, terminal, ch in ends:
            after = self._after(stack, terminal, ch)
            if after is None:
                continue
            if trie.tokens[child]:
                allowed[list(trie.tokens[child])] = True
            if trie.children[child]:
                self._walk(after, child, allowed)
        for child, terminal, pending in pending_ends:
            stack2 = self._feed(stack, terminal)
            if stack2 is not None:
                cands, _, _, restart = self._fresh(stack2)
                if self.lexer.may_complete((cands, pending, True, restart)):
                    allowed[list(trie.tokens[child])] = True

    def _lex_walk(self, lex: LexState, node: int) -> tuple:
        """Below trie `node`, starting in `lex`: (token ids the lexer alone accepts,
        [(node, terminal, char)] where a terminal ends and `char` starts the next,
        [(node, terminal, pending bytes)] for tokens that end a terminal and stop inside
        the next one's first character)."""
        key = (lex, node)
        hit = self._walks.get(key)
        if hit is not None:
            return hit
        trie, lexer = self.trie, self.lexer
        ids: list[int] = []
        ends: list = []
        pending_ends: list = []
        todo = [(node, lex)]
        while todo:
            parent, state = todo.pop()
            for byte, child in trie.children[parent].items():
                result = lexer.step_byte(state, byte)
                if result[0] == EMIT:
                    ends.append((child, result[1], result[2]))
                    continue
                if result[0] != CONTINUE:
                    continue
                nxt = result[1]
                if trie.tokens[child]:
                    if lexer.may_complete(nxt):
                        ids.extend(trie.tokens[child])
                    elif nxt[1] and not nxt[2]:
                        last = lexer.best_final((nxt[0], b"", False, nxt[3]))
                        if last in self.ignore:
                            cands, _, _, restart = lexer.fresh(nxt[3] - self.ignore)
                            if lexer.may_complete((cands, nxt[1], True, restart)):
                                ids.extend(trie.tokens[child])
                        elif last is not None:
                            pending_ends.append((child, last, nxt[1]))
                if trie.children[child]:
                    todo.append((child, nxt))
        hit = (np.array(ids, dtype=np.int64), ends, pending_ends)
        self._walks[key] = hit
        return hit

    def forced_text(self, position: Position) -> str:
        """The characters every continuation of `position` starts with."""
        out = []
        while len(out) < _MAX_FORCED_CHARS and not self.can_end(position):
            chars = self._next_chars(position)
            if chars is None or len(chars) != 1:
                break
            (ch,) = chars
            nxt = self.advance(position, ch.encode())
            if nxt is None:
                break
            out.append(ch)
            position = nxt
        return "".join(out)

    def _next_chars(self, position: Position) -> set[str] | None:
        lex, stack = position
        chars = self.lexer.next_chars(lex)
        last = None if lex[2] else self.lexer.best_final(lex)
        if chars is None or last is None:
            return chars
        if last in self.ignore:
            more = self.lexer.next_chars(self.lexer.fresh(lex[3] - self.ignore))
        else:
            stack2 = self._feed(stack, last)
            more = set() if stack2 is None else self.lexer.next_chars(self._fresh(stack2))
        return None if more is None else chars | more


class EbnfMatcher(Matcher):
    def __init__(self, grammar: EbnfGrammar) -> None:
        self.grammar = grammar
        self.positions = [grammar.initial]  # one per accepted token, for rollback
        # Per position: (the budgeted terminal it is inside, the tokens its lexeme has
        # taken), or None.
        self.spent: list[tuple[int, int] | None] = [None]
        self.ended = False

    def _position(self) -> Position:
        """Where the next token starts: the last position, with a budgeted lexeme that has
        taken its tokens ended."""
        position, spent = self.positions[-1], self.spent[-1]
        if spent is not None and spent[1] >= self.grammar.budgets[spent[0]]:
            return self.grammar.ended(position, spent[0]) or position
        return position

    def fill_bitmask(self, row: torch.Tensor) -> None:
        g = self.grammar
        if self.ended:
            row.zero_()
            set_bits(row, g.vocab.eos_token_ids)
        else:
            row.copy_(torch.from_numpy(g.mask(self._position())[0]))

    def accept_token(self, token_id: int) -> bool:
        g = self.grammar
        if self.ended:
            return False
        start = self._position()
        if token_id in g.vocab.eos_token_ids:
            self.ended = g.can_end(start)
            return self.ended
        data = g.vocab.token_bytes[token_id] if token_id < g.vocab.size else None
        if not data:
            return False
        nxt = g.advance(start, data)
        if nxt is None:
            return False
        self.spent.append(self._spent(start, nxt))
        self.positions.append(nxt)
        return True

    def _spent(self, start: Position, nxt: Position) -> tuple[int, int] | None:
        """What a token from `start` to `nxt` leaves spent: one more token of the budgeted
        lexeme it stays in, or the first of one it starts."""
        if not self.grammar.budgets:
            return None
        terminal = self.grammar.budgeted(nxt)
        if terminal is None:
            return None
        before = self.spent[-1] if start is self.positions[-1] else None  # not ended
        return (terminal, before[1] + 1 if before and before[0] == terminal else 1)

    def is_terminated(self) -> bool:
        return self.ended or self.grammar.mask(self._position())[1]

    def rollback(self, n: int) -> None:
        if n and self.ended:
            self.ended = False
            n -= 1
        if n >= len(self.positions):
            raise ValueError(f"cannot roll back {n} tokens: only {len(self.positions) - 1} taken")
        if n:
            del self.positions[-n:]
            del self.spent[-n:]

    def jump_forward(self) -> str:
        return "" if self.ended else self.grammar.forced_text(self._position())


class _TokenTrie:
    """Tokens by their bytes: node 0 is the root; `children[n]` maps a byte to a node,
    `tokens[n]` lists the token ids spelled by the path to n."""

    def __init__(self, vocab: TokenVocabulary) -> None:
        self.children: list[dict[int, int]] = [{}]
        self.tokens: list[tuple[int, ...]] = [()]
        for token_id, data in enumerate(vocab.token_bytes):
            if not data:
                continue
            node = 0
            for byte in data:
                nxt = self.children[node].get(byte)
                if nxt is None:
                    nxt = len(self.children)
                    self.children[node][byte] = nxt
                    self.children.append({})
                    self.tokens.append(())
                node = nxt
            self.tokens[node] += (token_id,)


@per_vocabulary
def _token_trie(vocab: TokenVocabulary) -> _TokenTrie:
    return _TokenTrie(vocab)


def _deep_size(root: object) -> int:
    """sys.getsizeof over everything reachable from `root` through containers and object
    attributes, each object once (numpy arrays with their buffers)."""
    seen: set[int] = set()
    total, todo = 0, [root]
    while todo:
        obj = todo.pop()
        if id(obj) in seen or isinstance(obj, (type, types.ModuleType, types.FunctionType)):
            continue  # code is shared, not the grammar's
        seen.add(id(obj))
        total += obj.nbytes if isinstance(obj, np.ndarray) else sys.getsizeof(obj)
        if isinstance(obj, dict):
            todo += [*obj.keys(), *obj.values()]
        elif isinstance(obj, (list, tuple, set, frozenset)):
            todo += obj
        elif hasattr(obj, "__dict__"):
            todo.append(vars(obj))
        elif hasattr(type(obj), "__slots__"):
            todo += [getattr(obj, a) for a in type(obj).__slots__ if hasattr(obj, a)]
    return total


@per_vocabulary
def trie_memory_bytes(vocab: TokenVocabulary) -> int:
    """What the byte trie every EBNF grammar over `vocab` shares holds (built now if it was
    not): its dicts, token tuples and node ids, as sys.getsizeof counts them."""
    trie = _token_trie(vocab)
    nodes = sum(sys.getsizeof(c) for c in trie.children)
    tokens = sum(sys.getsizeof(t) for t in trie.tokens if t)
    ids = 28 * len(trie.children)  # each node id past 256 is an int object of its own
    return nodes + tokens + ids + sys.getsizeof(trie.children) + sys.getsizeof(trie.tokens)
