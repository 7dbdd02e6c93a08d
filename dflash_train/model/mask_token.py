"""Which token fills the block slots after the anchor (docs/architecture.md). Inference
engines (z-lab's `dflash_generate`, vLLM, SGLang) embed an integer `mask_token_id` with the
target's own table, so the default is always a real row of it:

1. the tokenizer's mask token;
2. else the first row of the embedding table past the tokenizer (Qwen3: 151669);
3. else (every row is a token, as in SmolLM2) a token id that never occurs in the training
   data's `input_ids`: a special token first (the highest unseen id among the tokenizer's
   added special tokens that are not bos/eos/pad/unk), else the highest unseen id.

A mask vector learned by the drafter (`--mask-token learned`) is kept for experiments; no
engine loads it, so its export is not servable."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # numpy is imported where it is used: the config module checks the option
    import numpy as np

AUTO = "auto"
LEARNED = "learned"


@dataclass(frozen=True)
class MaskChoice:
    mode: str  # "token" | "learned"
    token_id: int | None
    reason: str


def refuse_seen_mask(saved: MaskChoice, seen: np.ndarray | None, field: str, path: object) -> None:
    """A drafter's weights learned with their mask token, so a run that goes on from them
    (a resume, --init-from) keeps it; but never where this run's data holds it (`seen`:
    tokens_seen, None where the target has a spare row), since a mask token must never be a
    real input. Raises ValueError naming the option."""
    token = saved.token_id
    if saved.mode == "token" and token is not None and seen is not None and seen[token]:
        raise ValueError(
            f"{field}: {path} drafts with mask token {token}, which occurs in this run's "
            "training data; start fresh, or train on data without it"
        )


def parse_mask_request(text: str) -> str | int:
    """`auto`, `learned` or a token id; raises ValueError naming the option."""
    value = text.strip()
    if value in (AUTO, LEARNED):
        return value
    try:
        token = int(value, 10)
    except ValueError:
        raise ValueError(
            f"--mask-token: expected auto, learned or a token id, got {text!r}"
        ) from None
    if token < 0:
        raise ValueError(f"--mask-token: token id {token} is negative")
    return token


def tokens_seen(table: Any, vocab_size: int) -> np.ndarray:
    """A bool array over the vocabulary: which ids occur in the dataset's `input_ids`
    (read chunk by chunk from the Arrow table, so memory stays bounded)."""
    import numpy as np
    import pyarrow.compute as pc

    seen = np.zeros(vocab_size, dtype=bool)
    for chunk in table.data.column("input_ids").chunks:
        ids = pc.list_flatten(chunk).to_numpy(zero_copy_only=False)
        if ids.size:  # one linear pass: no sort, whatever the dataset's size
            seen[ids[(ids >= 0) & (ids < vocab_size)]] = True
    return seen


def _special_candidates(tokenizer: Any) -> list[int]:
    core = {
        getattr(tokenizer, name, None)
        for name in ("bos_token_id", "eos_token_id", "pad_token_id", "unk_token_id")
    }
    added = getattr(tokenizer, "added_tokens_decoder", {}) or {}
    return sorted(
        int(i) for i, token in added.items() if getattr(token, "special", True) and i not in core
    )


def choose_mask(
    tokenizer: Any,
    embedding_rows: int,
    seen: np.ndarray | None,
    request: str | int = AUTO,
) -> MaskChoice:
    """The mask for a target whose embedding table has `embedding_rows` rows; `seen` is
    `tokens_seen` of the training data (needed only when the table has no spare row)."""
    if request == LEARNED:
        return MaskChoice("learned", None, "a learned mask vector (--mask-token learned)")
    if isinstance(request, int):
        if request >= embedding_rows:
            raise ValueError(
                f"--mask-token: token id {request} is outside the target's table "
                f"(0..{embedding_rows - 1})"
            )
        if seen is not None and seen[request]:
            raise ValueError(f"--mask-token: token id {request} occurs in the training data")
        return MaskChoice("token", request, f"token {request} (--mask-token)")
    if getattr(tokenizer, "mask_token_id", None) is not None:
        return MaskChoice("token", int(tokenizer.mask_token_id), "the tokenizer's mask token")
    if embedding_rows > len(tokenizer):
        return MaskChoice("token", len(tokenizer), "the first embedding row past the tokenizer")
    specials = [i for i in _special_candidates(tokenizer) if i < embedding_rows]
    if seen is None:
        # No data to check against (a tool building a drafter without a dataset).
        if specials:
            return MaskChoice(
                "token", specials[-1], f"special token {specials[-1]} (data unchecked)"
            )
        return MaskChoice("token", embedding_rows - 1, "the last token id (data unchecked)")
    unseen = [i for i in specials if not seen[i]]
    if unseen:
        token = unseen[-1]
        return MaskChoice("token", token, f"special token {token}, absent from the training data")
    import numpy as np

    absent = np.flatnonzero(~seen[:embedding_rows])
    if absent.size:
        token = int(absent[-1])
        return MaskChoice("token", token, f"token {token}, absent from the training data")
    raise ValueError(
        f"mask token: all {embedding_rows} token ids occur in the training data; "
        "pass --mask-token learned (not servable) or a token id"
    )
