"""What :func:`~tl_geometry.analyze` is given, made uniform once: texts tokenised, tokens and masks
of a model or a cache checked, the windows' BOS record, and the warnings about inputs that would
measure something else (padding without a mask, N past the candidate sources)."""

from __future__ import annotations

import warnings
from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import Any

import torch
from jaxtyping import Int
from torch import Tensor

from ..capture.adapters import bos_flags, check_attention_mask, hook_names
from ..capture.cache import batched_cache, describe_cache, is_cache
from ..capture.hooks import warn_hooks_left
from ..capture.model_info import describe_model, pad_token_id
from ..config import RunConfig
from ..errors import TLGeometryError

__all__ = ["tokenize_texts", "as_tokens", "cache_tokens", "check_windows", "check_batch_size", "bos_record", "differs", "warn_not_measurable", "warn_unmasked_padding"]


def tokenize_texts(model: Any, texts: Sequence[str]) -> tuple[Int[Tensor, "seq pos"], Int[Tensor, "seq pos"]]:
    """BOS + each text's tokens (no other special tokens), right-padded: ``(tokens, attention_mask)``."""
    tokenizer = getattr(model, "tokenizer", None)
    if tokenizer is None:
        raise TLGeometryError("the model has no tokenizer: pass token ids [seq, pos] instead of texts.")
    if tokenizer.bos_token_id is None:
        raise TLGeometryError("the tokenizer has no BOS token; geometry needs the sink at position 0. Pass token ids.")
    ids = [[tokenizer.bos_token_id, *tokenizer(text, add_special_tokens=False)["input_ids"]] for text in texts]
    if len(texts) > 1 and (texts[0] == getattr(tokenizer, "bos_token", None) or all(len(row) <= 2 for row in ids)):
        raise TLGeometryError("these strings look like string tokens (model.to_str_tokens output), one window each: "
                              "pass the token ids (model.to_tokens(text)) or the texts themselves.")
    length = max(len(row) for row in ids)
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.bos_token_id
    tokens = torch.full((len(ids), length), pad, dtype=torch.long)
    mask = torch.zeros(len(ids), length, dtype=torch.long)
    for i, row in enumerate(ids):
        tokens[i, :len(row)] = torch.tensor(row)
        mask[i, :len(row)] = 1
    return tokens, mask


def warn_not_measurable(config: RunConfig, tokens: Tensor, attention_mask: Tensor | None) -> None:
    """Refuse a run where no N can be measured; warn of the N that will be NaN and why."""
    longest = int(tokens.shape[1] if attention_mask is None else attention_mask.sum(1).max())
    if len(config.unmeasurable_n(longest)) == len(config.n):
        raise TLGeometryError(f"no N in {list(config.n)} is measurable on sequences of at most {longest} tokens: "
                              "N must be fewer than a query's candidate sources; pass smaller n or longer texts.")
    if config.unmeasurable_n(longest):  # the first reason; a skipped baseline (repeats=0) was asked for
        warnings.warn(f"results will be NaN for {config.not_measurable(longest)[0]}.", stacklevel=3)


def warn_unmasked_padding(tokens: Tensor, attention_mask: Tensor | None, pad: int | None) -> None:
    """Warn when windows look padded, right or left (they end or start with the pad id, in runs or in
    some rows only), and no attention mask says so: the pads would be measured as real tokens."""
    if attention_mask is not None or pad is None or tokens.shape[1] < 2:
        return
    for side, edge, next_to in (("end in", -1, -2), ("start with", 0, 1)):  # right padding, left padding
        ends = tokens[:, edge] == pad
        runs = ends & (tokens[:, next_to] == pad)
        if bool(runs.any()) or (bool(ends.any()) and not bool(ends.all())):
            warnings.warn(f"{int(ends.sum())} of {tokens.shape[0]} windows {side} the pad token id {pad} and no "
                          "attention_mask was given: pads would be measured as real tokens. Pass attention_mask= "
                          "(1 for real tokens) to tlg.analyze, and to run_with_cache when you analyse its cache.",
                          stacklevel=4)
            return


def bos_record(tokens: Tensor | None, attention_mask: Tensor | None, bos_token_id: int | None, window_ids: Tensor,
                from_cache: bool) -> dict[str, Any]:
    """Whether each window starts with the model's BOS, for the results' settings
    (``{"known": bool, "without": [window ids]}``). Told where the caller can act: the windows that
    lack a BOS the tokenizer has (and how to prepend it), or a cache analysed without the tokens
    that would tell. A model without a BOS id has none to miss: its results say "BOS unknown"."""
    flags = bos_flags(tokens, attention_mask, bos_token_id)
    if flags is None:
        if from_cache and tokens is None and bos_token_id is not None:
            warnings.warn("cannot tell whether the cached windows start with BOS without their tokens: position 0 is "
                          "taken as the sink. Pass the tokens, tlg.analyze(cache, tokens), to have it checked.",
                          stacklevel=4)
        return {"known": False, "without": []}
    without = window_ids[~flags].tolist()
    if without:
        warnings.warn(f"{len(without)} of {len(flags)} windows {'does' if len(without) == 1 else 'do'} not start with the BOS token (id {bos_token_id}; "
                      f"windows {without[:5]}{' …' if len(without) > 5 else ''}): their sink statistics and mixer "
                      "labels describe their first content token. Prepend BOS: model.to_tokens(text) does "
                      "(prepend_bos=True), or torch.cat([torch.full((n, 1), model.tokenizer.bos_token_id), tokens], 1).",
                      stacklevel=4)
    return {"known": True, "without": without}


def check_windows(tokens: Tensor, batch_size: int, info: Any) -> None:
    """At least one window of two tokens, within the model's context, and a usable batch size."""
    if tokens.ndim != 2 or tokens.shape[0] == 0 or tokens.shape[1] < 2:
        raise TLGeometryError(f"need at least one window of ≥ 2 tokens; got shape {tuple(tokens.shape)}.")
    check_batch_size(batch_size)
    info.check_length(int(tokens.shape[1]))


def check_batch_size(batch_size: int) -> None:
    if isinstance(batch_size, bool) or not isinstance(batch_size, int) or batch_size < 1:
        raise TLGeometryError(f"batch_size must be an int ≥ 1 (windows per forward pass); got {batch_size!r}.")


def as_tokens(model, tokens_or_texts, attention_mask):
    if isinstance(tokens_or_texts, str):
        tokens_or_texts = [tokens_or_texts]
    if type(tokens_or_texts).__module__ == "numpy":  # token ids from numpy: same meaning
        tokens_or_texts = torch.as_tensor(tokens_or_texts)
    if isinstance(tokens_or_texts, Tensor):
        tokens = tokens_or_texts if tokens_or_texts.ndim == 2 else tokens_or_texts[None]
        if tokens.is_floating_point() or tokens.is_complex() or tokens.dtype == torch.bool:
            raise TLGeometryError(f"token ids must be integers; got a {tokens.dtype} tensor (texts? pass a list of str).")
        if attention_mask is not None:
            attention_mask = torch.as_tensor(attention_mask)
            check_attention_mask(attention_mask, *tokens.shape)
            empty = (~attention_mask.bool().any(1)).nonzero().flatten().tolist()
            if empty:
                raise TLGeometryError(f"attention_mask rows {empty[:5]} have no real token: drop those sequences.")
        return tokens, attention_mask
    texts = list(tokens_or_texts)
    if not texts or not all(isinstance(t, str) for t in texts):
        raise TLGeometryError("pass token ids [seq, pos] or a non-empty list of strings.")
    if attention_mask is not None:
        raise TLGeometryError("attention_mask is built from the texts; pass it only with token ids.")
    return tokenize_texts(model, texts)


def cache_tokens(cache, tokens_or_texts, attention_mask) -> tuple[Tensor, Tensor | None]:
    """The token ids (or, without them, placeholders of the cached shape) and the attention mask of
    the run a cache came from; shapes checked against the cached pattern."""
    batch, _, pos, _ = cache[hook_names(0)[0]].shape
    if tokens_or_texts is None:  # unknown ids: every sequence is taken to start with BOS
        tokens_or_texts = torch.zeros(batch, pos, dtype=torch.long)
    if isinstance(tokens_or_texts, Tensor) and tokens_or_texts.ndim == 1 and batch == 1:  # remove_batch_dim
        tokens_or_texts = tokens_or_texts[None]
    tokens, attention_mask = as_tokens(getattr(cache, "model", None), tokens_or_texts, attention_mask)
    if tuple(tokens.shape) != (batch, pos):
        raise TLGeometryError(f"the cache holds {batch} sequences of {pos} positions, but the tokens have shape "
                              f"{tuple(tokens.shape)}: pass those the cache was computed from.")
    return tokens, attention_mask


def differs(value: Any, default: Any) -> bool:
    """Whether a keyword setting was changed from its default (tensors always count as given)."""
    if isinstance(value, Tensor):
        return True
    if isinstance(value, list | tuple) and isinstance(default, tuple):
        return tuple(value) != default
    return value != default


@dataclass(frozen=True)
class Windows:
    """The windows a run measures, checked: token ids ``[seq, pos]`` and their mask, the model's (or
    the cache's) description, each window's global id and the BOS record of the results' settings;
    ``cache``: the batched cache analysed instead of a model (``tokens_given``: whether its tokens
    were passed, or stand in as placeholders of its shape)."""

    tokens: Int[Tensor, "seq pos"]
    attention_mask: Int[Tensor, "seq pos"] | None
    info: Any
    window_ids: Int[Tensor, " seq"]
    bos: dict[str, Any]
    cache: Any | None = None
    tokens_given: bool = True

    def select(self, rows: Tensor) -> Windows:
        """The windows ``rows`` (a shard's), with their ids."""
        mask = None if self.attention_mask is None else self.attention_mask[rows]
        return replace(self, tokens=self.tokens[rows], attention_mask=mask, window_ids=self.window_ids[rows])


def _refuse_meta(model: Any, tokens_or_texts: Any) -> None:
    """Tensors on the meta device hold shapes and no values: nothing can be measured on them."""
    weight = next(iter(model.parameters()), None) if hasattr(model, "parameters") else None
    if (weight is not None and weight.is_meta) or (isinstance(tokens_or_texts, Tensor) and tokens_or_texts.is_meta):
        what = "the model's weights are" if weight is not None and weight.is_meta else "the tokens are"
        raise TLGeometryError(f"{what} on the meta device (shapes without values): load real weights "
                              "(e.g. model.to_empty(device='cpu') and load_state_dict) or pass real tokens.")


def read_windows(model: Any, tokens_or_texts: Any, attention_mask: Tensor | None, window_ids: Tensor | None,
                 *, checkpoint: Any, batch_size: int, allow_hooks: bool) -> Windows:
    """The windows of a run of ``model`` (or of a cache) on ``tokens_or_texts``, checked and warned
    about once: hooks left on the model, pads without a mask, windows without BOS."""
    cache = model if is_cache(model) else None
    if cache is not None and checkpoint is not None:
        raise TLGeometryError("a cache is analysed in one step: checkpoint applies to runs of a model.")
    if cache is None and tokens_or_texts is None:
        raise TLGeometryError("pass the token ids [seq, pos] or texts to analyse (or an ActivationCache "
                              "instead of the model).")
    _refuse_meta(model, tokens_or_texts)
    if cache is not None:
        cache = batched_cache(cache)
        info = describe_cache(cache)
        tokens, attention_mask = cache_tokens(cache, tokens_or_texts, attention_mask)
        if tokens_or_texts is not None:  # a cache keeps its model (ActivationCache.model): its pad id
            warn_unmasked_padding(tokens, attention_mask, pad_token_id(getattr(cache, "model", None)))
    else:
        tokens, attention_mask = as_tokens(model, tokens_or_texts, attention_mask)
        info = describe_model(model)
        warn_hooks_left(model, allow_hooks)
        warn_unmasked_padding(tokens, attention_mask, pad_token_id(model))
    check_windows(tokens, batch_size, info)
    window_ids = torch.arange(tokens.shape[0]) if window_ids is None else torch.as_tensor(window_ids)
    given = cache is None or tokens_or_texts is not None
    bos = bos_record(tokens if given else None, attention_mask, info.bos_token_id, window_ids, cache is not None)
    return Windows(tokens, attention_mask, info, window_ids, bos, cache, given)
