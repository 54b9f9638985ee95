"""ConstraintState: one request's constraint as decoding sees it, and the only code that
advances its grammar matcher.

The sampler asks it for the step's mask, output processing has it take each sampled token
(and the text the grammar then forces: jump-forward), and speculative decoding walks draft
paths through it and puts it back. A matcher that fails (MatcherError) leaves its message in
`error`; the request then ends, alone.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from transformers import PreTrainedTokenizerBase

from braid.grammars.matcher import Matcher, MatcherError, accept_all, bitmask_words
from braid.grammars.phases import PhasedMatcher
from braid.grammars.token_healing import HealingIndex
from braid.grammars.vocabulary import TokenVocabulary


class JumpForward:
    """Turns the text a grammar forces into the tokens the model would write for it.

    `index` gives the vocabulary sorted by bytes (the grammar service's, shared with token
    healing); without it one is built here when first needed."""

    def __init__(
        self,
        tokenizer: PreTrainedTokenizerBase,
        vocab: TokenVocabulary,
        enabled: bool,
        index: Callable[[], HealingIndex] | None = None,
    ) -> None:
        self.tokenizer = tokenizer
        self.vocab = vocab
        self.enabled = enabled  # EngineConfig.jump_forward
        self._index = index
        self._own_index: HealingIndex | None = None

    def longer_tokens(self, token: int) -> torch.Tensor:
        """The ids of the tokens whose bytes extend `token`'s."""
        if self._index is not None:
            index = self._index()
        else:
            if self._own_index is None:
                self._own_index = HealingIndex(self.vocab)
            index = self._own_index
        ids = torch.from_numpy(index.extending(self.vocab.token_bytes[token]))
        return ids[ids != token]

    def tokenize(self, data: bytes) -> list[int] | None:
        """Token ids spelling exactly `data`, or None (a partial UTF-8 character, or text
        the tokenizer would turn into special tokens)."""
        try:
            text = data.decode()
        except UnicodeDecodeError:
            return None
        ids = self.tokenizer.encode(text, add_special_tokens=False)
        spelled = [self.vocab.token_bytes[i] for i in ids]
        if not ids or any(b is None for b in spelled) or b"".join(spelled) != data:
            return None
        return ids


class ConstraintState:
    def __init__(self, matcher: Matcher, jump: JumpForward) -> None:
        self._matcher = matcher
        self._jump = jump
        self.error: str | None = None  # set when the matcher fails: the request then ends
        self._num_drafted = 0  # draft tokens accepted since the last `reset_draft`
        # Steering changed the output (it took a token other than the one the plain mask
        # would have given), so the output ends for its length whatever ends it.
        self.steered = False
        self._room: int | None = None  # the output's room the last mask was filled with
        # Where the last mask was steered: the plain one, and the token it would have given
        # (the sampler's `note_plain_choice`; None: not known, counted as steered).
        self.plain_mask: torch.Tensor | None = None
        self._plain_choice: int | None = None

    def fill_bitmask(self, row: torch.Tensor, tokens_left: int | None = None) -> bool:
        """Write the tokens allowed next into `row`; False (row left as it was, the error
        kept) when the matcher fails. With `tokens_left` (the output's room, the token
        sampled next included) the mask is steered to let the text complete in time; draft
        tokens walked since the last reset count as taken."""
        if self.error is not None:
            return False
        try:
            self._room = None if tokens_left is None else tokens_left - self._num_drafted
            self.plain_mask, self._plain_choice = None, None
            if tokens_left is None:
                self._matcher.fill_bitmask(row)
            elif self._matcher.fill_bitmask_within(row, self._room):
                self.plain_mask = torch.empty_like(row)
                self._matcher.fill_bitmask(self.plain_mask)
        except MatcherError as e:
            self.error = str(e)
            return False
        return True

    def note_plain_choice(self, token: int) -> None:
        """The token the plain mask would have given where the last mask was steered."""
        self._plain_choice = token

    def is_terminated(self) -> bool:
        return self._matcher.is_terminated()

    @property
    def reasoning_tokens(self) -> int | None:
        """The tokens of the output's thought, markers included (None: not a reasoning
        request)."""
        m = self._matcher
        return m.reasoning_tokens if isinstance(m, PhasedMatcher) else None

    def close_candidate(self) -> int | None:
        """The token that would close the thought where a soft thinking budget offers it now
        (the sampler forces it when the model ranks it high), else None."""
        m = self._matcher
        return m.close_candidate() if isinstance(m, PhasedMatcher) else None

    def start(self) -> list[int]:
        """The tokens of the text the grammar forces before anything is sampled (accepted);
        [] with `error` set when the matcher fails."""
        return self._guarded(lambda: self._forced(None))

    def accept(self, token: int) -> list[int]:
        """Take a sampled token: the tokens to append, `token` and those of the text the
        grammar forces after it (the sampled token may merge into them: then the list does
        not start with it). [] with `error` set when the grammar refuses the token or the
        matcher fails."""

        if self.plain_mask is not None and self._plain_choice != token:
            self.steered = True
        self.plain_mask = None

        def take() -> list[int]:
            if self._matcher.accept_token(token):
                return self._within_room(token, self._forced(token))
            self.error = f"token {token} is outside the grammar"
            return []

        return self._guarded(take)

    def _within_room(self, sampled: int, tokens: list[int]) -> list[int]:
        """`tokens` (the sampled one and the forced text's), or the sampled one alone where
        the forced text's tokens would leave too little room to close the document (the
        steered mask counted on the state right after the sampled token)."""
        if self._room is None or tokens == [sampled]:
            return tokens
        need = self._matcher.shortest_completion()
        if need is None or need <= self._room - len(tokens):
            return tokens
        self._matcher.rollback(len(tokens))
        self._matcher.accept_token(sampled)
        return [sampled]

    def push_draft(self, token: int) -> list[int] | None:
        """Walk one draft token: [token] plus the tokens the grammar then forces (the path
        takes them as free draft tokens), or None where the path must end (the grammar
        refuses the token, or it merges with the forced text into other tokens)."""
        if self.error is not None:
            return None
        try:
            if self._matcher.is_terminated() or not self._matcher.accept_token(token):
                return None
            tokens = self._forced(token)  # the matcher has accepted exactly these
        except MatcherError as e:  # the request fails when it samples
            self.error = str(e)
            return None
        if tokens[0] != token:
            self._matcher.rollback(len(tokens))
            return None
        self._num_drafted += len(tokens)
        return tokens

    def reset_draft(self) -> None:
        """Undo every draft token pushed since the last reset."""
        if self._num_drafted:
            self._matcher.rollback(self._num_drafted)
            self._num_drafted = 0

    def _guarded(self, take) -> list[int]:
        try:
            return take()
        except MatcherError as e:
            self.error = str(e)
            return []

    def _forced(self, sampled: int | None) -> list[int]:
        """The tokens to append after `sampled` was accepted (None: at the start): `sampled`
        itself plus the tokens of any text the grammar forces next.

        The forced text is tokenized together with the sampled token when that spells the
        same bytes, so the model sees the tokens it would have produced itself (`"` then
        `name` would otherwise stand where the tokenizer writes `"name`). The matcher is
        left having accepted exactly the returned tokens."""
        matcher, jump = self._matcher, self._jump
        tokens = [] if sampled is None else [sampled]
        if not jump.enabled or matcher.is_terminated():
            return tokens
        forced = matcher.jump_forward().encode()
        if not forced:
            return tokens
        tail = jump.tokenize(forced)
        if sampled is not None:
            merged = jump.tokenize(jump.vocab.token_bytes[sampled] + forced)
            # A steered mask counted on the sampled token and the forced text's own tokens:
            # a merge into more tokens than those could overrun the room it left.
            longer = self._room is not None and (tail is None or len(merged or ()) > 1 + len(tail))
            if merged is not None and not longer:
                matcher.rollback(1)
                if accept_all(matcher, merged):
                    return self._open_end(merged, sampled)
                matcher.accept_token(sampled)
        if tail is not None and accept_all(matcher, tail):
            return self._open_end(tokens + tail, None)
        return tokens

    def _open_end(self, tokens: list[int], merged_from: int | None) -> list[int]:
        """`tokens`, accepted, less the last one where the model could write a longer token
        in its place: that token's bytes may merge with what the model writes next (forced
        `name"` before optional whitespace and `:`, where the tokenizer writes `":`), so the
        model writes it itself. `merged_from`: the sampled token when `tokens` replace it (a
        merge); where the tokens kept would not hold all of its bytes, it stands alone."""
        matcher, spelled = self._matcher, self._jump.vocab.token_bytes
        if matcher.is_terminated():
            return tokens
        matcher.rollback(1)
        if not self._allows_any(self._jump.longer_tokens(tokens[-1])):
            matcher.accept_token(tokens[-1])
            return tokens
        kept = tokens[:-1]
        if merged_from is not None:
            if sum(len(spelled[t]) for t in kept) < len(spelled[merged_from]):
                matcher.rollback(len(kept))
                matcher.accept_token(merged_from)
                return [merged_from]
        return kept

    def _allows_any(self, ids: torch.Tensor) -> bool:
        """Whether the matcher allows one of `ids` next."""
        if not len(ids):
            return False
        row = torch.empty(bitmask_words(self._jump.vocab.size), dtype=torch.int32)
        self._matcher.fill_bitmask(row)
        return bool(((row[ids >> 5] >> (ids & 31)) & 1).any())
