"""Where the prompt ends, for HeadwiseCache's snap heads: they stage the prompt and choose at its end
(runtime::EvictionAttentionCore::begin_prompt), so the cache must know how long the prompt is.

As a user gives it: HeadwiseCache.set_prompt_length(P) before the prompt's first forward call, or
else the first forward call is the prompt (what model.generate() prefills in one call). A prompt
prefilled in chunks without set_prompt_length would have the snap heads choose from its first chunk
only, silently; so
- generate(..., prefill_chunk_size=N) on a model HeadwiseCache.from_policy set up tells the cache
  the prompt's length itself (`follow_generate`), whatever the chunks;
- a forward call of more than one token right after a prompt taken from the first call (what a
  chunked prefill's second chunk looks like) is refused in one line. A decoded token is fed alone;
  a one-token last chunk cannot be told from one, which is why generate is followed rather than
  guessed at.
"""
from __future__ import annotations

from typing import Optional

from .selection import observed_begin


class PromptState:
    """Where the prompt ends, shared by a cache's layers. Unless told (set_prompt_length, or
    generate's chunked prefill), the prompt is the cache's first forward call.

    schedule `whole`: every layer's snap heads stage the whole prompt and each layer chooses at its
    first step past the prompt (or HeadwiseCache.end_prompt()), so the prefill peak is the
    whole-prompt figure; `layer`: each layer chooses right after attending the prompt's last token,
    which with the prompt in one forward call is kvpress's layer-by-layer schedule (only one
    layer's staging at a time)."""

    def __init__(self, schedule: str, staged_total):
        self.begin, self.end = 0, None
        self.told = False  # `end` was given (set_prompt_length), not taken from the first call
        self.schedule = schedule
        self._staged_total = staged_total
        self.peak_staged = 0

    def tell(self, tokens: int) -> None:
        self.end, self.told = tokens, True

    def take_first_call(self, first: int, steps: int) -> None:
        """Nothing told: the first forward call is the prompt."""
        if self.end is None and first == 0:
            self.end = steps

    def refuse_untold_chunk(self, layer_id: int, first: int, steps: int) -> None:
        """A call of several tokens right after a prompt taken from the first call: a chunked prefill
        that did not say how long the prompt is (the snap heads would choose from its first chunk)."""
        if self.told or self.end is None or first != self.end or steps <= 1:
            return
        raise ValueError(f"HeadwiseCache layer {layer_id}: a forward call of {steps} tokens right after the prompt, "
                         f"which was taken to be the first call's {self.end} tokens: a prompt prefilled in chunks "
                         "would have its snap heads choose from the first chunk; call cache.set_prompt_length(P) "
                         "before the first chunk (generate(prefill_chunk_size=...) on the model "
                         "HeadwiseCache.from_policy set up does it itself), or feed the tokens after the prompt one "
                         "at a time")

    def forget(self) -> None:
        """A fresh sequence: its prompt is told again or is its first call (the peak is kept: it is a
        property of the whole run, as the runtime's)."""
        self.end, self.told = None, False

    def note_staged(self) -> None:
        self.peak_staged = max(self.peak_staged, self._staged_total())

    def observed_begin(self) -> int:
        return observed_begin(self.end, self.begin)


def _prefill_telling_prompt(original):
    """generate()'s prefill (GenerationMixin._prefill(input_ids, generation_config, model_kwargs, ...)
    in transformers 5.17, HeadwiseCache's pin), which with prefill_chunk_size splits the prompt into
    forward calls of that many tokens: a HeadwiseCache is first told the prompt's length (the whole
    input_ids; transformers' chunked prefill starts from an empty cache)."""

    def _prefill(input_ids, generation_config, model_kwargs, *args, **kwargs):
        cache = model_kwargs.get("past_key_values")
        tell = getattr(cache, "tell_generate_prompt", None)
        if tell is not None and getattr(generation_config, "prefill_chunk_size", None) is not None:
            tell(input_ids.shape[-1])
        return original(input_ids, generation_config, model_kwargs, *args, **kwargs)

    _prefill.headwise_follows_prompt = True
    return _prefill


def follow_generate(model) -> Optional[str]:
    """Has `model.generate(..., prefill_chunk_size=N)` tell a HeadwiseCache its prompt's length
    (wraps this model's generate prefill, once). Returns why it cannot (a transformers without
    GenerationMixin._prefill), else None: then a chunked generate without set_prompt_length is
    still refused at its second chunk (PromptState.refuse_untold_chunk), unless that chunk is one token."""
    original = getattr(model, "_prefill", None)
    if original is None:
        return f"{type(model).__name__} has no _prefill (generate's prefill) to follow"
    if not getattr(original, "headwise_follows_prompt", False):
        model._prefill = _prefill_telling_prompt(original)
    return None
