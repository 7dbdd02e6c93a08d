"""The decode-time drafter over a cache of its context keys/values computes what the
training forward computes for the same block: the cache only saves re-projecting the
context every round, it must not change a single draft."""

from __future__ import annotations

import torch
from drafter_fixtures import frozen_head, random_context, tiny_drafter

from dflash_train.decode.draft_cache import CachedDrafter, DraftCache


def _reference(drafter, embed, context: torch.Tensor, anchor: int, token: int) -> torch.Tensor:
    """The training forward's final hidden states of one block anchored at `anchor`, given
    only the context strictly before it."""
    block = drafter.embed_blocks(embed, torch.tensor([[token]]))
    return drafter(block, context[:, :anchor], torch.tensor([[anchor]]))[0]


@torch.no_grad()
def test_cached_rounds_equal_the_training_forward_at_every_anchor() -> None:
    drafter = tiny_drafter(num_layers=2, block_size=4).eval()
    embed, head = frozen_head()
    context = random_context(1, 40)
    size = drafter.config.block_size
    cache = DraftCache(drafter, head, embed, capacity=40 + size)
    # The prompt's 9 positions, then rounds as decoding makes them: each round writes a whole
    # verify's block of features at the last anchor, of which only the accepted part (and
    # the anchor) stays visible; the rest must be hidden and later overwritten.
    cache.extend(context[:, :9], 0)
    anchor, token = 9, 5
    for accepted in (0, 3, 1, 2, 0, 3):
        got = cache.block_hidden(torch.tensor([token]), anchor)[0]
        want = _reference(drafter, embed, context, anchor, token)
        torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
        cache.extend(context[:, anchor : anchor + size], anchor)
        anchor, token = anchor + accepted + 1, (token * 7 + 3) % 40
    # A stale column past the anchor (rejected drafts' features) changes nothing it sees.
    cache.extend(torch.randn(1, size, context.shape[-1]), anchor)
    got = cache.block_hidden(torch.tensor([token]), anchor)[0]
    torch.testing.assert_close(got, _reference(drafter, embed, context, anchor, token))


@torch.no_grad()
def test_rows_of_one_cache_each_draft_their_own_sequence_at_its_own_anchor() -> None:
    """Three sequences in one cache (the in-run evaluation's batch), each extended and
    drafted at its own positions in the same calls: every row's block equals the training
    forward of that sequence alone, however far the others have gone."""
    drafter = tiny_drafter(num_layers=2, block_size=4).eval()
    embed, head = frozen_head()
    contexts = [random_context(1, 40) for _ in range(3)]
    size = drafter.config.block_size
    cache = DraftCache(drafter, head, embed, capacity=40 + size, batch=3)
    prompts = [5, 11, 8]  # prompt lengths: the shorter prompts' padding stays masked
    padded = torch.zeros(3, max(prompts), contexts[0].shape[-1])
    for row, (context, length) in enumerate(zip(contexts, prompts, strict=True)):
        padded[row, :length] = context[0, :length]
    cache.extend(padded, 0)
    anchors, tokens = list(prompts), [5, 9, 2]
    for accepted in ((0, 3, 1), (2, 0, 3), (3, 3, 0), (1, 2, 2)):
        at = torch.tensor(anchors)
        got = cache.block_hidden(torch.tensor(tokens), at)
        for row, context in enumerate(contexts):
            want = _reference(drafter, embed, context, anchors[row], tokens[row])
            torch.testing.assert_close(got[row], want, rtol=1e-5, atol=1e-5)
        drafts = cache.draft(torch.tensor(tokens), at)
        for row, context in enumerate(contexts):
            hidden = _reference(drafter, embed, context, anchors[row], tokens[row])
            assert drafts[row].tolist() == head(hidden[1:]).argmax(dim=-1).tolist()
        verified = torch.stack([c[0, a : a + size] for c, a in zip(contexts, anchors, strict=True)])
        cache.extend(verified, at)
        anchors = [a + n + 1 for a, n in zip(anchors, accepted, strict=True)]
        tokens = [(t * 7 + 3) % 40 for t in tokens]


@torch.no_grad()
def test_cached_drafter_drafts_the_argmax_of_the_training_forward() -> None:
    drafter = tiny_drafter(num_layers=1, block_size=4).eval()
    embed, head = frozen_head()
    context = random_context(1, 24)
    runner = CachedDrafter(drafter, head, embed, capacity=30, feature_size=context.shape[-1])
    assert runner.graph is None  # no CUDA graph off the GPU
    drafts = runner.begin(context[0, :11], torch.tensor([7]))
    want = head(_reference(drafter, embed, context, 11, 7)[1:]).argmax(dim=-1)
    assert drafts.tolist() == want.tolist() and drafts.shape == (3,)
    drafts = runner.round(context[0, 11:15], 11, torch.tensor([2]), 13)
    want = head(_reference(drafter, embed, context, 13, 2)[1:]).argmax(dim=-1)
    assert drafts.tolist() == want.tolist()
