"""Fixtures for the control-plane tests."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from control_harness import end_trainer


@pytest.fixture
def run_dirs(tmp_path: Path) -> Iterator[Callable[[str], Path]]:
    """Make run directories whose trainers are ended when the test ends, however it ends."""
    made: list[Path] = []

    def make(name: str) -> Path:
        path = tmp_path / name
        made.append(path)
        return path

    yield make
    for path in made:
        end_trainer(path)
