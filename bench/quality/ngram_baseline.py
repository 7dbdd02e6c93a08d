"""What slot j can get from the anchor token alone: an n-gram table "token at t -> token at
t+j", fitted on 90 % of a prepared dataset's samples and scored on the other 10 % (anchors
where the trainer would put them: loss_mask[t] and loss_mask[t+1] set, label in the answer).
The drafter's teacher-forced slot accuracy should beat this quickly: it also sees the
target's context features. Prints one JSON object.

    python bench/quality/ngram_baseline.py DATA_DIR [--block-size 16]
"""

from __future__ import annotations

import argparse
import json

import numpy as np


def table_accuracy(
    ids: list[np.ndarray], masks: list[np.ndarray], fit: np.ndarray, j: int, vocab: int
) -> float:
    def pairs(rows: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        a_all, b_all = [], []
        for r in rows:
            x, m = ids[r].astype(np.int64), masks[r].astype(bool)
            if len(x) <= j:
                continue
            ok = m[:-j] & np.roll(m, -1)[:-j] & m[j:]
            a_all.append(x[:-j][ok])
            b_all.append(x[j:][ok])
        if not a_all:
            return np.zeros(0, np.int64), np.zeros(0, np.int64)
        return np.concatenate(a_all), np.concatenate(b_all)

    train = np.zeros(len(ids), bool)
    train[fit] = True
    a, b = pairs(np.flatnonzero(train))
    ta, tb = pairs(np.flatnonzero(~train))
    if not len(a) or not len(ta):
        return 0.0
    keys, counts = np.unique(a * vocab + b, return_counts=True)
    first, follower = keys // vocab, keys % vocab
    order = np.lexsort((-counts, first))  # by first token, most frequent follower first
    first, follower = first[order], follower[order]
    head = np.r_[True, first[1:] != first[:-1]]
    best = np.full(vocab, -1, np.int64)
    best[first[head]] = follower[head]
    return float((best[ta] == tb).mean())


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("data_dir")
    parser.add_argument("--block-size", type=int, default=16)
    parser.add_argument("--max-samples", type=int, default=20000)
    args = parser.parse_args()
    from dflash_train.data.dataset import load_dataset_dir

    dataset = load_dataset_dir(args.data_dir)
    n = min(len(dataset), args.max_samples)
    rows = dataset.rows(list(range(n)))
    ids = [r[0] for r in rows]
    masks = [r[1] for r in rows]
    vocab = int(max(int(x.max()) for x in ids)) + 1
    fit = np.random.default_rng(0).permutation(n)[: int(0.9 * n)]
    accs = [table_accuracy(ids, masks, fit, j, vocab) for j in range(1, args.block_size)]
    print(json.dumps({"samples": n, "ngram_slot_acc": [round(a, 4) for a in accs]}))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
