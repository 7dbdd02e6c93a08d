"""The console's import boundary, checked two ways (docs/contracts.md): no module of
dflash_tui names a trainer module other than protocol.py and the config package, and
importing the whole console loads no other trainer module and no torch."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
CONSOLE_MAY_IMPORT = ("dflash_train.protocol", "dflash_train.config")


def _allowed(module: str) -> bool:
    return module == "dflash_train" or any(
        module == name or module.startswith(name + ".") for name in CONSOLE_MAY_IMPORT
    )


def _is_trainer_module(name: str) -> bool:
    package = ROOT / "dflash_train"
    return (package / f"{name}.py").is_file() or (package / name / "__init__.py").is_file()


def _trainer_imports(tree: ast.AST) -> list[str]:
    names = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names += [a.name for a in node.names if a.name.split(".")[0] == "dflash_train"]
        elif (
            isinstance(node, ast.ImportFrom) and (node.module or "").split(".")[0] == "dflash_train"
        ):
            if node.module == "dflash_train":  # `from dflash_train import protocol`
                # A submodule, or a name the package itself holds (`__version__`).
                names += [
                    f"dflash_train.{a.name}" if _is_trainer_module(a.name) else "dflash_train"
                    for a in node.names
                ]
            else:
                names.append(node.module or "")
    return names


def test_console_sources_name_only_protocol_and_config() -> None:
    found = {}
    for path in sorted((ROOT / "dflash_tui").rglob("*.py")):
        bad = [m for m in _trainer_imports(ast.parse(path.read_text("utf-8"))) if not _allowed(m)]
        if bad:
            found[path.relative_to(ROOT).as_posix()] = bad
    assert found == {}
    assert _trainer_imports(ast.parse("from dflash_train import targets")) == [
        "dflash_train.targets"
    ]


def test_importing_the_console_loads_no_other_trainer_module() -> None:
    modules = sorted(
        ".".join(p.relative_to(ROOT).with_suffix("").parts)
        for p in (ROOT / "dflash_tui").rglob("*.py")
        if p.name != "__main__.py"
    )
    code = (
        "import importlib, sys\n"
        f"for name in {modules!r}:\n"
        "    importlib.import_module(name.removesuffix('.__init__'))\n"
        "loaded = sorted(m for m in sys.modules if m.split('.')[0] in ('dflash_train', 'torch'))\n"
        "print('\\n'.join(loaded))\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT)
    assert done.returncode == 0, done.stderr
    loaded = done.stdout.split()
    assert "dflash_train.protocol" in loaded
    assert [m for m in loaded if not _allowed(m)] == []
