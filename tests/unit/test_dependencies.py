"""Every package the harness imports is declared in pyproject.toml, so ``make test`` works from a fresh
clone: a module that arrives only as another package's dependency (numpy through pandas) would vanish the
day that package stops requiring it."""

import ast
import re
import sys
import tomllib
from importlib import metadata
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def _normal(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def _imported_top_levels(package: Path) -> dict[str, str]:
    """Top-level module -> a file importing it, for every absolute import (lazy ones in functions too)."""
    found: dict[str, str] = {}
    for path in sorted(package.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
            if isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom) and not node.level and node.module:
                names = [node.module]
            else:
                continue
            for name in names:
                found.setdefault(name.split(".")[0], str(path.relative_to(package.parent)))
    return found


def _third_party(imported: dict[str, str]) -> dict[str, str]:
    return {m: p for m, p in imported.items() if m not in sys.stdlib_module_names and m != "harness"}


def _declared() -> set[str]:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    return {_normal(re.match(r"[A-Za-z0-9._-]+", req).group()) for req in project["dependencies"]}


def _undeclared(modules: dict[str, str], declared: set[str]) -> list[str]:
    dists = metadata.packages_distributions()
    out = []
    for module, path in sorted(modules.items()):
        providers = {_normal(d) for d in dists.get(module, ())}
        if not providers & declared:
            out.append(f"{path} imports {module} (from {', '.join(sorted(providers)) or 'nothing installed'})")
    return out


_EXTRA_HOMES = {"sglang": ("harness/sglang/",),
                "gpu": ("harness/backends/flashinfer", "harness/backends/trtllm_mha", "harness/gpuci/jit"),
                "ci": ("harness/gpuci/shards",)}
"""each optional extra and the only code that may import it (lazily: the base install lacks it)"""


def _optional_target_imports(modules: dict[str, str]) -> set[str]:
    """Modules only an optional extra's own code imports, declared as that extra."""
    extras = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"].get("optional-dependencies", {})
    out = set()
    for extra, homes in _EXTRA_HOMES.items():
        dists = {_normal(re.match(r"[A-Za-z0-9._-]+", req).group()) for req in extras.get(extra, ())}
        providers = metadata.packages_distributions()
        # an extra's package installed: it must be the extra's; not installed (a base venv): its own code only
        out |= {m for m, path in modules.items() if dists and path.startswith(homes)
                and ({_normal(d) for d in providers.get(m, ())} & dists or not providers.get(m))}
    return out


@pytest.mark.slow  # over two seconds on one core (tests/README.md)
def test_every_package_the_harness_imports_is_a_declared_dependency():
    modules = _third_party(_imported_top_levels(ROOT / "harness"))
    for module in _optional_target_imports(modules):
        del modules[module]
    assert {"torch", "pandas", "jinja2", "pytest"} <= modules.keys()  # the scan sees imports at all
    assert _undeclared(modules, _declared()) == []


def test_an_import_through_another_packages_dependency_is_caught(tmp_path):
    (tmp_path / "pkg").mkdir()
    (tmp_path / "pkg" / "m.py").write_text("import os\n\ndef f():\n    import numpy as np\n    from pandas import DataFrame\n")
    modules = _third_party(_imported_top_levels(tmp_path / "pkg"))
    assert _undeclared(modules, {"pandas"}) == ["pkg/m.py imports numpy (from numpy)"]
