"""docs/architecture.md names every module of the four packages, in its package's section (issue 39)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
DOC = (ROOT / "docs" / "architecture.md").read_text(encoding="utf-8")
PACKAGES = ("dl2ray", "clusters", "serve", "elastic_mxnet")


def section(package: str) -> str:
    """The text under ``## `PACKAGE/` ...`` up to the next ``## `` heading of another package."""
    heads = [(m.start(), m.group(1)) for m in re.finditer(r"^## `([a-z0-9_]+)/`", DOC, re.M)]
    for k, (start, name) in enumerate(heads):
        if name == package:
            end = heads[k + 1][0] if k + 1 < len(heads) else len(DOC)
            return DOC[start:end]
    raise AssertionError(f"docs/architecture.md has no section for {package}/")


def modules(package: str) -> list[Path]:
    skip = {"__init__.py"}
    return sorted(p for p in (ROOT / package).rglob("*.py")
                  if p.name not in skip and "proto" not in p.relative_to(ROOT).parts)


@pytest.mark.parametrize("package", PACKAGES)
def test_every_module_is_on_the_map(package: str) -> None:
    text = section(package)
    missing = [str(p.relative_to(ROOT)) for p in modules(package)
               if not re.search(rf"`{re.escape(p.stem)}[`:( ]|{re.escape(p.name)}|"
                                rf"{re.escape('.'.join(p.relative_to(ROOT).with_suffix('').parts))}", text)]
    assert not missing, f"docs/architecture.md ({package}/ section) does not name: {', '.join(missing)}"
