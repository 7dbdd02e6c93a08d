"""Length-bucketed, token-budget batching: which samples go together in each batch of an
epoch, how well that packs, and how a batch of indices becomes padded tensors."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:
    import torch

    from dflash_train.data.dataset import TokenDataset


def length_buckets(lengths: Sequence[int] | np.ndarray, num_buckets: int) -> np.ndarray:
    """The bucket (0 = shortest) of every sample. Boundaries are length quantiles, so buckets
    hold about as many samples each whatever the length distribution; equal lengths always
    share a bucket, so some buckets may stay empty."""
    if num_buckets < 1:
        raise ValueError(f"num_buckets: must be at least 1, got {num_buckets}")
    lengths = np.asarray(lengths, dtype=np.int64)
    if lengths.size == 0:
        return np.zeros(0, dtype=np.int64)
    inner_edges = np.quantile(lengths, np.linspace(0, 1, num_buckets + 1)[1:-1])
    return np.searchsorted(inner_edges, lengths, side="left").astype(np.int64)


def bucketed_batches(
    lengths: Sequence[int] | np.ndarray,
    *,
    tokens_per_batch: int,
    epoch: int,
    seed: int,
    num_buckets: int,
    max_length: int | None = None,
) -> list[list[int]]:
    """One epoch's batches as lists of sample indices.

    Samples are shuffled within their length bucket with a generator seeded by (seed, epoch),
    cut into batches whose padded size (batch size x longest sample, lengths clipped to
    `max_length`) fits `tokens_per_batch`, and the batch order is shuffled. A sample longer
    than the budget forms a batch of its own. Every sample appears exactly once.
    """
    if tokens_per_batch < 1:
        raise ValueError(f"tokens_per_batch: must be at least 1, got {tokens_per_batch}")
    clipped = np.asarray(lengths, dtype=np.int64)
    if max_length is not None:
        clipped = np.minimum(clipped, max_length)
    buckets = length_buckets(clipped, num_buckets)
    rng = np.random.default_rng([seed, epoch])
    batches: list[list[int]] = []
    for bucket in range(num_buckets):
        members = np.flatnonzero(buckets == bucket)
        rng.shuffle(members)
        batches.extend(_cut_to_budget(members, clipped, tokens_per_batch))
    order = rng.permutation(len(batches))
    return [batches[i] for i in order]


def _cut_to_budget(
    members: np.ndarray, lengths: np.ndarray, tokens_per_batch: int
) -> list[list[int]]:
    batches: list[list[int]] = []
    current: list[int] = []
    longest = 0
    for index in members.tolist():
        length = int(lengths[index])
        grown = max(longest, length)
        if current and grown * (len(current) + 1) > tokens_per_batch:
            batches.append(current)
            current, grown = [], length
        current.append(index)
        longest = grown
    if current:
        batches.append(current)
    return batches


@dataclass(frozen=True)
class BatchPlanStats:
    """How one epoch's batches pack: sizes in samples, and the share of padded tokens that
    are real (1.0 = no padding)."""

    batches: int
    min_size: int
    max_size: int
    avg_size: float
    real_tokens: int
    padded_tokens: int

    @property
    def padding_efficiency(self) -> float:
        return self.real_tokens / self.padded_tokens if self.padded_tokens else 1.0

    def describe(self) -> str:
        return (
            f"Batches per epoch: {self.batches} (min={self.min_size} max={self.max_size} "
            f"avg={self.avg_size:.1f} samples), padding efficiency "
            f"{100 * self.padding_efficiency:.1f}%"
        )

    def as_dict(self) -> dict[str, float | int]:
        return {
            "batches": self.batches,
            "min_size": self.min_size,
            "max_size": self.max_size,
            "avg_size": round(self.avg_size, 3),
            "padding_efficiency": round(self.padding_efficiency, 4),
        }


def batch_plan_stats(
    lengths: Sequence[int] | np.ndarray,
    batches: Sequence[Sequence[int]],
    max_length: int | None = None,
) -> BatchPlanStats:
    clipped = np.asarray(lengths, dtype=np.int64)
    if max_length is not None:
        clipped = np.minimum(clipped, max_length)
    sizes = [len(b) for b in batches]
    real = padded = 0
    for batch in batches:
        batch_lengths = clipped[np.asarray(batch, dtype=np.int64)]
        real += int(batch_lengths.sum())
        padded += int(batch_lengths.max()) * len(batch) if len(batch) else 0
    return BatchPlanStats(
        batches=len(batches),
        min_size=min(sizes, default=0),
        max_size=max(sizes, default=0),
        avg_size=float(np.mean(sizes)) if sizes else 0.0,
        real_tokens=real,
        padded_tokens=padded,
    )


@dataclass(frozen=True)
class Batch:
    """Right-padded tensors of one batch (int64, shape [batch, longest]); `bucket` is the
    length bucket it was cut from (-1 when the caller did not say)."""

    input_ids: torch.Tensor
    attention_mask: torch.Tensor
    loss_mask: torch.Tensor
    bucket: int = -1

    @property
    def num_tokens(self) -> int:
        return int(self.input_ids.shape[0] * self.input_ids.shape[1])

    def to(self, device: torch.device | str, *, non_blocking: bool = False) -> Batch:
        return Batch(
            self.input_ids.to(device, non_blocking=non_blocking),
            self.attention_mask.to(device, non_blocking=non_blocking),
            self.loss_mask.to(device, non_blocking=non_blocking),
            self.bucket,
        )

    def pin_memory(self) -> Batch:
        return Batch(
            self.input_ids.pin_memory(),
            self.attention_mask.pin_memory(),
            self.loss_mask.pin_memory(),
            self.bucket,
        )


def collate(
    dataset: TokenDataset,
    indices: Sequence[int],
    max_length: int,
    pad_id: int,
    *,
    bucket: int = -1,
) -> Batch:
    """Gather `indices` from the dataset, truncate each to `max_length` and right-pad to the
    longest; padding has attention 0 and loss 0."""
    import torch

    if not indices:
        raise ValueError("collate: indices must not be empty")
    rows = dataset.rows(indices)
    width = min(max_length, max(len(ids) for ids, _ in rows))
    input_ids = np.full((len(rows), width), pad_id, dtype=np.int64)
    attention = np.zeros((len(rows), width), dtype=np.int64)
    loss = np.zeros((len(rows), width), dtype=np.int64)
    for row, (ids, mask) in enumerate(rows):
        n = min(len(ids), width)
        input_ids[row, :n] = ids[:n]
        attention[row, :n] = 1
        loss[row, :n] = mask[:n]
    return Batch(
        torch.from_numpy(input_ids),
        torch.from_numpy(attention),
        torch.from_numpy(loss),
        bucket,
    )
