"""The distribution: a built (non-editable) wheel under its own name ships the themes, both
console scripts, metadata a packager reads, and extras that match use; installed, both programs
answer `--version`."""

from __future__ import annotations

import email
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest
from packaging.requirements import Requirement

from dflash_train import DISTRIBUTION, __version__

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
    (built,) = out.glob("dflash_train_console-*.whl")
    return built


def test_wheel_contains_packages_themes_and_scripts(wheel: Path) -> None:
    names = zipfile.ZipFile(wheel).namelist()
    themes = {Path(n).name for n in names if n.startswith("dflash_tui/themes/")}
    assert {p.name for p in (ROOT / "themes").glob("*.toml")} <= themes
    assert "dflash_train/protocol.py" in names
    entry_points = next(n for n in names if n.endswith("entry_points.txt"))
    text = zipfile.ZipFile(wheel).read(entry_points).decode()
    assert "dflash-train = dflash_train.cli:main" in text
    assert "dflash-tui = dflash_tui.entry:main" in text  # --version before any extra


def _metadata(wheel: Path) -> email.message.Message:
    archive = zipfile.ZipFile(wheel)
    name = next(n for n in archive.namelist() if n.endswith(".dist-info/METADATA"))
    return email.message_from_bytes(archive.read(name))


def test_wheel_metadata_names_our_distribution_and_its_extras(wheel: Path) -> None:
    meta = _metadata(wheel)
    assert meta["Name"] == DISTRIBUTION == "dflash-train-console"
    assert meta["Version"] == __version__
    assert meta["Requires-Python"] == ">=3.10"
    classifiers = meta.get_all("Classifier")
    assert "Programming Language :: Python :: 3.10" in classifiers
    assert "License :: OSI Approved :: Apache Software License" in classifiers
    assert any(u.startswith("DFlash paper, https://") for u in meta.get_all("Project-URL"))
    assert {"train", "tui", "serve", "demo", "test"} <= set(meta.get_all("Provides-Extra"))
    requires = [Requirement(r) for r in meta.get_all("Requires-Dist")]

    def extra(name: str) -> set[str]:
        return {r.name for r in requires if r.marker and r.marker.evaluate({"extra": name})}

    assert "textual-serve" in extra("serve") and "textual-serve" not in extra("tui")
    assert "gguf" in extra("demo") and "gguf" not in extra("train")
    assert "tomli-w" not in extra("tui") and "tomlkit" in extra("tui")
    assert "accelerate" in extra("train")  # transformers 4.x's device_map needs it


@pytest.fixture(scope="module")
def installed(wheel: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The wheel installed into a folder of its own (not the checkout's editable install)."""
    target = tmp_path_factory.mktemp("site")
    pip = [sys.executable, "-m", "pip", "install", "-q", "--no-deps"]
    subprocess.run(
        [*pip, "--target", str(target), str(wheel)],
        check=True,
        capture_output=True,
    )
    return target


def _run_installed(installed: Path, code: str, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-c", code, *args],
        capture_output=True,
        text=True,
        cwd=installed.parent,
        env={"PYTHONPATH": str(installed), "PATH": "/usr/bin:/bin"},
    )


@pytest.mark.parametrize(
    ("module", "program"), [("dflash_train.cli", "dflash-train"), ("dflash_tui.cli", "dflash-tui")]
)
def test_installed_wheel_answers_version(installed: Path, module: str, program: str) -> None:
    code = f"import sys; from {module} import main; sys.exit(main())"
    done = _run_installed(installed, code, "--version")
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == f"{program} {__version__} ({DISTRIBUTION})"


def test_installed_wheel_finds_its_themes(installed: Path) -> None:
    code = (
        "import dflash_tui, pathlib;"
        "pkg = pathlib.Path(dflash_tui.__file__).parent;"
        f"assert str(pkg).startswith({str(installed)!r}), pkg;"
        "print(sorted(f.name for f in (pkg / 'themes').glob('*.toml')))"
    )
    result = _run_installed(installed, code)
    assert result.returncode == 0, result.stderr
    assert "dflash-dark.toml" in result.stdout
