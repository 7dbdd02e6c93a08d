"""Training options come from the config, not from the environment read deep inside: only
the config package, the launch environment (control/launch.py) and the rank setup
(pipeline/distributed.py) touch `os.environ`."""

from __future__ import annotations

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[1] / "dflash_train"
ALLOWED = {
    "config/loader.py",
    "config/environment.py",
    "control/launch.py",
    "pipeline/distributed.py",
}
ENV_NAMES = {"environ", "environb", "getenv", "getenvb", "putenv", "unsetenv"}


def _reads_environment(tree: ast.AST) -> list[int]:
    lines = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and node.attr in ENV_NAMES:
            if isinstance(node.value, ast.Name) and node.value.id == "os":
                lines.append(node.lineno)
        elif (
            isinstance(node, ast.ImportFrom)
            and node.module == "os"
            and any(alias.name in ENV_NAMES for alias in node.names)
        ):
            lines.append(node.lineno)
    return lines


def test_only_the_config_launch_and_ranks_read_the_environment() -> None:
    found = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        name = path.relative_to(PACKAGE).as_posix()
        lines = _reads_environment(ast.parse(path.read_text(encoding="utf-8")))
        if lines and name not in ALLOWED:
            found[name] = lines
    assert found == {}


def test_the_check_sees_each_way_of_reading() -> None:
    """A positive control: the check is not blind."""
    samples = [
        "import os\nos.environ.get('X')",
        "import os\nos.getenv('X')",
        "from os import environ",
        "import os\nx = os.environ['X']",
    ]
    assert all(_reads_environment(ast.parse(code)) for code in samples)
    assert not _reads_environment(ast.parse("import os\nos.path.join('a')"))
