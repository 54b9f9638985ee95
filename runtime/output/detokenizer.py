"""Incremental detokenization: text deltas that never split a UTF-8 character."""

from __future__ import annotations

from transformers import PreTrainedTokenizerBase

# Context tokens decoded ahead of the new ones, so spacing rules (SentencePiece's leading
# space, byte-level merges) see the same neighbours as a full decode does.
_CONTEXT_TOKENS = 5


class IncrementalDetokenizer:
    """Feed token ids one step at a time and get back only the newly finished text.

    Decoding a window [prefix_offset:] and subtracting the decode of [prefix_offset:read_offset]
    gives the text the new tokens add; a trailing U+FFFD means a multi-byte character is not
    complete yet, so it is held back until the next token completes it.
    """

    def __init__(
        self,
        tokenizer: PreTrainedTokenizerBase,
        prompt_ids: list[int],
        keep_special: bool = False,
        given: str = "",
    ) -> None:
        """`keep_special`: special tokens stay in the text (a reasoning format's markers
        that are special tokens, which the output is split at). `given`: text the output's
        tokens start with that the caller has already (the prompt text token healing took
        off and the output spells again); it is left out of what `add` returns."""
        self.decode = _decoder(tokenizer)
        self.skip_special = not keep_special
        self.ids = list(prompt_ids[-_CONTEXT_TOKENS:])
        self.prefix_offset = 0
        self.read_offset = len(self.ids)
        self.healed = given  # the text token healing took off the prompt ("" if none)
        self.given = given  # what of it the output has not spelled yet

    def add(self, token_ids: list[int]) -> str:
        text = self._add(token_ids)
        if self.given and text:
            # The tokens spell the given text's bytes first, so the text starts with it.
            n = min(len(text), len(self.given))
            text, self.given = text[n:], self.given[n:]
        return text

    def _add(self, token_ids: list[int]) -> str:
        self.ids.extend(token_ids)
        decode = self.decode
        skip = self.skip_special
        prefix = decode(self.ids[self.prefix_offset : self.read_offset], skip_special_tokens=skip)
        full = decode(self.ids[self.prefix_offset :], skip_special_tokens=skip)
        if full.endswith("\ufffd") or len(full) <= len(prefix):
            return ""
        self.prefix_offset = max(self.read_offset - _CONTEXT_TOKENS, 0)
        self.read_offset = len(self.ids)
        return full[len(prefix) :]


def _decoder(tokenizer: PreTrainedTokenizerBase):
    """tokenizer.decode, or the fast tokenizer's own decode where transformers would return
    its text unchanged (no clean-up of spaces), which skips transformers' wrapping on a call
    made twice per token (docs/benchmarks.md)."""
    backend = getattr(tokenizer, "backend_tokenizer", None)
    if backend is None or tokenizer.clean_up_tokenization_spaces:
        return tokenizer.decode
    return backend.decode
