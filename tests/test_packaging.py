"""The distribution: a built (non-editable) wheel ships the themes and both console scripts."""

from __future__ import annotations

import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def wheel(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("dist")
    subprocess.run(
        [
            sys.executable,
            "-m",
            "build",
            "--wheel",
            "--no-isolation",
            "--outdir",
            str(out),
            str(ROOT),
        ],
        check=True,
        capture_output=True,
    )
    (built,) = out.glob("dflash-*.whl")
    return built


def test_wheel_contains_packages_themes_and_scripts(wheel: Path) -> None:
    names = zipfile.ZipFile(wheel).namelist()
    themes = {Path(n).name for n in names if n.startswith("dflash_tui/themes/")}
    assert {p.name for p in (ROOT / "themes").glob("*.toml")} <= themes
    assert "dflash_train/protocol.py" in names
    entry_points = next(n for n in names if n.endswith("entry_points.txt"))
    text = zipfile.ZipFile(wheel).read(entry_points).decode()
    assert "dflash-train = dflash_train.cli:main" in text
    assert "dflash-tui = dflash_tui.cli:main" in text


def test_installed_wheel_finds_its_themes(wheel: Path, tmp_path: Path) -> None:
    target = tmp_path / "site"
    subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "install",
            "-q",
            "--no-deps",
            "--target",
            str(target),
            str(wheel),
        ],
        check=True,
        capture_output=True,
    )
    code = (
        "import dflash_tui, pathlib;"
        "pkg = pathlib.Path(dflash_tui.__file__).parent;"
        f"assert str(pkg).startswith({str(target)!r}), pkg;"
        "print(sorted(f.name for f in (pkg / 'themes').glob('*.toml')))"
    )
    result = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        cwd=tmp_path,
        env={"PYTHONPATH": str(target), "PATH": "/usr/bin:/bin"},
    )
    assert result.returncode == 0, result.stderr
    assert "dflash-dark.toml" in result.stdout
