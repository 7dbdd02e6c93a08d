"""Writes a dataset in the trainer's layout with random token ids, for throughput runs on
random-weight targets (throughput does not depend on the tokens or the weights).

    python bench/synthetic_dataset.py --out /tmp/synth --samples 4000 --min-len 512 --max-len 4096

Lengths are log-uniform so the bucketed batching sees a realistic spread; the first
quarter of each row is the "prompt" (loss_mask 0), the rest the "answer"."""

from __future__ import annotations

import argparse
import math
import random
from pathlib import Path

from dflash_train.data.prepare import Sample, write_dataset


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", type=Path, required=True)
    p.add_argument("--samples", type=int, default=4000)
    p.add_argument("--min-len", type=int, default=512)
    p.add_argument("--max-len", type=int, default=4096)
    p.add_argument("--vocab", type=int, default=49152, help="ids stay below this")
    p.add_argument("--seed", type=int, default=0)
    args = p.parse_args()
    rng = random.Random(args.seed)
    samples = []
    for _ in range(args.samples):
        length = round(math.exp(rng.uniform(math.log(args.min_len), math.log(args.max_len))))
        ids = [rng.randrange(args.vocab) for _ in range(length)]
        prompt = length // 4
        samples.append(Sample(ids, [0] * prompt + [1] * (length - prompt), True))
    info = {"target": "synthetic", "samples": args.samples, "seed": args.seed}
    write_dataset(samples, args.out, info, shards=4)
    print(f"wrote {args.samples} samples to {args.out}")


if __name__ == "__main__":
    main()
