"""docs/architecture.md is the map of the code: every module of both packages is named there,
so a reader finds any module from it (and a module added without a line there fails here)."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
DOC = ROOT / "docs" / "architecture.md"


def _modules(package: str) -> list[str]:
    return sorted(
        str(path.relative_to(ROOT / package))
        for path in (ROOT / package).rglob("*.py")
        if path.name not in {"__init__.py", "__main__.py"}
    )


def _named(doc: str, module: str) -> bool:
    """A module is named by its path inside the package, or by its file name in the row of
    its folder (`folder/` tables list their files by name)."""
    if f"`{module}`" in doc or f"`{module.removesuffix('.py')}`" in doc:
        return True
    folder, _, name = module.rpartition("/")
    if not folder:
        return False
    rows = [line for line in doc.splitlines() if line.startswith(f"| `{folder}/`")]
    return any(re.search(rf"`{re.escape(name)}`", row) for row in rows)


def test_every_module_is_on_the_map() -> None:
    doc = DOC.read_text(encoding="utf-8")
    missing = [
        f"{package}/{module}"
        for package in ("dflash_train", "dflash_tui")
        for module in _modules(package)
        if not _named(doc, module)
    ]
    assert missing == [], f"modules missing from docs/architecture.md: {missing}"


def test_the_readme_sends_a_reader_there_first() -> None:
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    first_doc_link = re.search(r"\(docs/[\w-]+\.md\)", readme)
    assert first_doc_link is not None and first_doc_link.group(0) == "(docs/architecture.md)"
