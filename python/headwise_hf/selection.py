"""The keep rules' selections on 1-D tensors, as headwise's runtime applies them per head
(runtime/eviction_cache.hpp: keep_indices, snap_keep_indices, pool_scores; snap_attention.cpp:
compress_snap; eviction_attention.cpp: insert). torch only, so that both HeadwiseCache
(transformers as pinned) and HeadwisePress (kvpress's environment) choose the same keys.
"""
from __future__ import annotations

import torch

# EvictionOptions' defaults for the snap rule (docs/keep-rules.md).
OBSERVATION_WINDOW = 32
POOLING_KERNEL = 7
INF = float("inf")


def attention_probs(q: torch.Tensor, k: torch.Tensor, allowed: torch.Tensor, scaling: float, softcap=None,
                    sink_logit=None) -> torch.Tensor:
    """Softmax probabilities [g, t, n] (fp32) of one KV head's queries q [g, t, D] over its keys
    k [n, D] where `allowed` [t, n]: scores in the activation dtype, softmax in fp32; a sink logit
    per query head joins the softmax and is dropped (eviction_attention.cpp's attention_probs)."""
    logits = torch.matmul(q, k.transpose(0, 1)) * scaling  # [g, t, n]
    if softcap:
        logits = torch.tanh(logits / softcap) * softcap
    logits = logits.float().masked_fill(~allowed, float("-inf"))
    if sink_logit is None:
        return torch.softmax(logits, dim=-1)
    sl = sink_logit.float().view(-1, 1, 1).expand(*logits.shape[:-1], 1)
    combined = torch.cat([logits, sl], dim=-1)
    combined = combined - combined.max(dim=-1, keepdim=True).values
    return torch.softmax(combined, dim=-1)[..., :-1]


def keep_indices(position: torch.Tensor, score: torch.Tensor, keep: int, recent: int) -> torch.Tensor:
    """Indices of the candidates to keep, ascending by position: the `recent` most recent, then
    the others by score (higher first, ties to the more recent position), `keep` in all; every
    candidate when there are at most `keep` (runtime::keep_indices)."""

    def ascending(idx: torch.Tensor) -> torch.Tensor:
        return idx.index_select(0, torch.sort(position.index_select(0, idx), stable=True).indices)

    n = position.shape[0]
    if n <= keep:
        return ascending(torch.arange(n, device=position.device))
    by_recency = torch.sort(position, stable=True, descending=True).indices
    rest = by_recency[recent:]
    order = torch.sort(score.index_select(0, rest), stable=True, descending=True).indices
    return ascending(torch.cat([by_recency[:recent], rest.index_select(0, order[:keep - recent])]))


def snap_keep_indices(position: torch.Tensor, primary: torch.Tensor, secondary: torch.Tensor,
                      keep: int) -> torch.Tensor:
    """The `keep` candidates with the highest `primary`, ties to the higher `secondary`, then to
    the lower position; ascending by position (runtime::snap_keep_indices). Stable sorts from the
    weakest key to the strongest."""
    order = torch.sort(position, stable=True).indices
    if position.shape[0] > keep:
        order = order.index_select(0, torch.sort(secondary.index_select(0, order), stable=True,
                                                 descending=True).indices)
        order = order.index_select(0, torch.sort(primary.index_select(0, order), stable=True,
                                                 descending=True).indices)
        order = order[:keep]
    return order.index_select(0, torch.sort(position.index_select(0, order), stable=True).indices)


def pool_scores(score: torch.Tensor, kernel: int = POOLING_KERNEL) -> torch.Tensor:
    """SnapKV's max pooling along positions: stride 1, padding kernel // 2 (runtime::pool_scores)."""
    if score.shape[0] == 0 or kernel == 1:
        return score.float()
    return torch.nn.functional.max_pool1d(score.float().view(1, 1, -1), kernel, 1, kernel // 2).view(-1)


def observed_begin(prompt_end: int, prompt_begin: int = 0, window: int = OBSERVATION_WINDOW) -> int:
    """First position of the observation window: the prompt's last `window` tokens."""
    return max(prompt_begin, prompt_end - window)


def snap_choice(position: torch.Tensor, raw: torch.Tensor, first_observed: int, keep: int):
    """A snap head's choice at the prompt's end (snap_attention.cpp's compress_snap): among its
    candidates (ascending by position, `raw` the observation window's summed attention on each),
    the observation window and the prefix keys with the highest max-pooled score; ties to the
    higher raw score, then the lower position (the window: the more recent). Returns the indices
    kept (ascending by position) and the score each candidate keeps for decoding (pooled for the
    prefix, -inf for the window: the recency ring's tokens)."""
    n = position.shape[0]
    prefix = int((position < first_observed).sum())
    pooled = pool_scores(raw[:prefix])
    rest = n - prefix
    primary = torch.cat([pooled, torch.full((rest,), INF, dtype=pooled.dtype, device=pooled.device)])
    secondary = torch.cat([raw[:prefix].float(), position[prefix:].float()])
    kept_score = torch.cat([pooled, torch.full((rest,), -INF, dtype=pooled.dtype, device=pooled.device)])
    return snap_keep_indices(position, primary, secondary, keep), kept_score


def ring_insert(position: torch.Tensor, score: torch.Tensor, held: int, length: int, ring: int) -> torch.Tensor:
    """A snap head's decode (SnapDecode::kRecentRing, eviction_attention.cpp's insert): the held
    entries keep their scores, the new ones (after `held`) score -inf; once more than `length`,
    the `ring` most recent stay and the selected prefix keys outrank the rest. Returns the
    indices kept (ascending by position) and the scores of all candidates."""
    score = torch.cat([score[:held], torch.full((position.shape[0] - held,), -INF, dtype=torch.float32,
                                                device=score.device)])
    return keep_indices(position, score, length, min(ring, length)), score
