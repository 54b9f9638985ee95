"""StreamedText: a piece of a gen's output as a backend streams it, with the tokens that wrote it.

It is a `str`, so the executor appends and keeps it as it keeps any text (its chunks hold the
piece itself), and whoever reads a gen's stream can tell which tokens each piece came from:
SGLang's `text_async_iter(name, return_meta_data=True)` reports each piece's own logprobs and
the count of tokens so far (lang/state.py). A token that ends inside a character writes no
text; its id and logprobs go with the next piece that does, so no piece is empty.
"""

from __future__ import annotations


class StreamedText(str):
    """Text, and the output tokens since the previous piece: their ids, and when the gen
    asked for logprobs, their logprobs and top alternatives (id -> logprob), one per token."""

    token_ids: list[int]
    logprobs: list[float] | None
    top_logprobs: list[dict[int, float]] | None

    def __new__(
        cls,
        text: str,
        token_ids: list[int],
        logprobs: list[float] | None = None,
        top_logprobs: list[dict[int, float]] | None = None,
    ) -> StreamedText:
        piece = super().__new__(cls, text)
        piece.token_ids = token_ids
        piece.logprobs = logprobs
        piece.top_logprobs = top_logprobs
        return piece


class PieceBuffer:
    """The tokens streamed since the last piece that had text, until one has."""

    def __init__(self, with_logprobs: bool) -> None:
        self.with_logprobs = with_logprobs
        self._ids: list[int] = []
        self._logprobs: list[float] = []
        self._tops: list[dict[int, float]] = []

    def add(
        self,
        text: str,
        token_ids: list[int],
        logprobs: list[float] | None,
        top_logprobs: list[dict[int, float]] | None,
    ) -> StreamedText | None:
        """These tokens and their text; the piece they complete, or None while no text came."""
        self._ids += token_ids
        if self.with_logprobs:
            self._logprobs += logprobs or []
            self._tops += top_logprobs or [{} for _ in logprobs or []]
        if not text:
            return None
        piece = StreamedText(
            text,
            self._ids,
            self._logprobs if self.with_logprobs else None,
            self._tops if self.with_logprobs else None,
        )
        self._ids, self._logprobs, self._tops = [], [], []
        return piece
