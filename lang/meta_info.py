"""SGLang's meta_info, made from braid's meta: what `state.get_meta_info(name)` returns.

A logprob listing holds [logprob, token id, token text] per token, as SGLang's /generate
reports it; an id or text a backend does not know is None (select scores text, not ids).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

TokenTexts = Callable[[list[int]], list[Any]]


def sglang_meta_info(meta: dict, token_texts: TokenTexts | None) -> dict | None:
    """The meta_info of a gen or select; None for a variable set otherwise (set_var,
    var_scope, a join), as SGLang has none for those either."""
    if not meta:
        return None
    if "choices" in meta:
        return _select_info(meta)
    info = {
        "prompt_tokens": meta.get("prompt_tokens"),
        "completion_tokens": meta.get("completion_tokens"),
        "cached_tokens": meta.get("cached_tokens", 0),
        "finish_reason": _finish_reason(meta["finish_reason"], meta.get("completion_tokens")),
    }
    if "logprobs" in meta:
        info["output_token_logprobs"] = _listing(
            meta["logprobs"], meta.get("token_ids"), token_texts
        )
        info["output_token_logprobs_length"] = len(meta["logprobs"])
        tops = meta.get("top_logprobs") or []
        if "next_top_logprobs" in meta:  # max_tokens=0: the top tokens after the prompt
            tops = [meta["next_top_logprobs"]]
        if any(tops):
            info["output_top_logprobs"] = [
                _listing(list(top.values()), list(top), token_texts) for top in tops
            ]
    if "prompt_logprobs" in meta:
        info["input_token_logprobs"] = _listing(
            meta["prompt_logprobs"], meta.get("prompt_token_ids"), token_texts
        )
    return info


def _select_info(meta: dict) -> dict:
    logprobs = meta["logprobs"]
    info = {
        "normalized_prompt_logprobs": [sum(lp) / len(lp) for lp in logprobs],
        "input_token_logprobs": [_listing(lp, None, None) for lp in logprobs],
        "output_token_logprobs": [[] for _ in logprobs],
    }
    if "unconditional_logprobs" in meta:
        info["unconditional_token_logprobs"] = [
            _listing(lp, None, None) for lp in meta["unconditional_logprobs"]
        ]
        info["normalized_unconditional_prompt_logprobs"] = meta["scores"]
    return info


def _finish_reason(reason: str, completion_tokens: int | None) -> dict:
    if reason == "length":
        return {"type": "length", "length": completion_tokens}
    return {"type": reason, "matched": None}  # braid does not report which stop matched


def _listing(
    logprobs: list[float], token_ids: list[int] | None, token_texts: TokenTexts | None
) -> list[list]:
    if token_ids is None or len(token_ids) != len(logprobs):  # ids not reported
        return [[lp, None, None] for lp in logprobs]
    texts = token_texts(token_ids) if token_texts is not None else [None] * len(token_ids)
    return [[lp, t, text] for lp, t, text in zip(logprobs, token_ids, texts, strict=True)]


def sglang_piece_info(piece: Any, tokens_so_far: int, token_texts: TokenTexts | None) -> dict:
    """The meta_info of a streamed piece before a gen's last (a StreamedText, whose tokens
    are the ones since the previous piece; other text has none): completion_tokens so far and,
    where the gen asked for logprobs, the listings of the piece's own tokens."""
    info: dict[str, Any] = {"finish_reason": None, "completion_tokens": tokens_so_far}
    logprobs = getattr(piece, "logprobs", None)
    if logprobs is not None:
        ids = piece.token_ids
        info["output_token_logprobs"] = _listing(logprobs, ids, token_texts)
        info["output_token_logprobs_length"] = tokens_so_far
        if any(piece.top_logprobs):
            info["output_top_logprobs"] = [
                _listing(list(top.values()), list(top), token_texts) for top in piece.top_logprobs
            ]
    return info


def sglang_last_piece_info(info: dict | None, tokens_before: int) -> dict | None:
    """The meta_info of a gen's last streamed piece: the gen's, its listings from the tokens
    after the earlier pieces' on (a select's piece is its only one)."""
    if info is None or tokens_before == 0:
        return info
    cut = dict(info)
    for key in ("output_token_logprobs", "output_top_logprobs"):
        if key in cut:
            cut[key] = cut[key][tokens_before:]
    return cut
