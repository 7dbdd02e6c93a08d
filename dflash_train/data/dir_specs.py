"""train's --data-dir values: one spec, or several (the flag repeated), each `DIR` or `DIR*K`
(DIR's samples K times an epoch). Standard library only: launch's preflight reads them as the
loader and the held-out evaluation do."""

from __future__ import annotations

import re
from collections.abc import Sequence

_WEIGHT = re.compile(r"^(?P<dir>.+)\*(?P<k>\d+)$")


def data_dir_specs(value: str | Sequence[str]) -> tuple[str, ...]:
    """The config's data_dir (a string for one, a list or tuple for several) as specs."""
    return (value,) if isinstance(value, str) else tuple(value)


def spec_parts(spec: str) -> tuple[str, int]:
    """`DIR*K` as (DIR, K), a plain `DIR` as (DIR, 1); K is not judged here."""
    match = _WEIGHT.match(spec)
    return (spec, 1) if match is None else (match["dir"], int(match["k"]))
