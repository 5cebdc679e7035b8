"""The package layout shows the architecture: what is under test and the generic graph machinery never
import each other, nothing imports back up, the scenario schema knows nothing of the checking, and a target
(``sglang/``, the installed SGLang's adapter) sits on top of what it adapts, which never names it."""

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2] / "harness"

TARGETS = {"sglang"}
"""target packages: each registers itself (``harness.targets`` entry points), and nothing below names it"""

# package -> packages it must never import
FORBIDDEN = {
    "serving": {"graphs", "backends", "runners", "check", "scenario", "report", "runspec", "gpuci", *TARGETS},
    "graphs": {"serving", "backends", "runners", "check", "scenario", "report", "runspec", "gpuci", *TARGETS},
    "runspec": {"graphs", "backends", "runners", "check", "scenario", "report", "gpuci", *TARGETS},
    "backends": {"graphs", "runners", "check", "scenario", "report", "gpuci", *TARGETS},
    "runners": {"check", "scenario", "report", "gpuci", *TARGETS},
    "scenario": {"check", "report", "runners", "graphs", "backends.torch_native", "gpuci", *TARGETS},
    "check": {"report", "collect", "plugin", "cli", "bench", "diffbench", "gpuci", *TARGETS},
    # inside the checking: the diff knows no run, and a run knows no matrix of cases or how it is judged
    "check.diff": {"check.run", "check.matrix"},
    "check.run": {"check.matrix"},
    "report": {"collect", "plugin", "cli", "bench", "diffbench", "gpuci", *TARGETS},
    "cli": {"collect", "plugin", "bench", "diffbench", "gpuci", *TARGETS},
    "imports": {"serving", "graphs", "backends", "runners", "check", "scenario", "report", "runspec", "gpuci",
                *TARGETS},
    # the checks of third-party declarations: primitives each registry applies to its own kind, importing none
    "declarations": {"serving", "graphs", "backends", "runners", "check", "scenario", "report", "runspec",
                     "imports", "gpuci", *TARGETS},
    # a dataclass's field names, for whoever walks objects: the audit, the records, the results channel
    "fields": {"serving", "graphs", "backends", "runners", "check", "scenario", "report", "runspec", "imports",
               "declarations", "options", "gpuci", *TARGETS},
    "options": {"serving", "graphs", "backends", "runners", "check", "scenario", "report", "runspec", "imports",
                "gpuci", *TARGETS},
    # the SGLang target adapts the serving stack, the backends and the scenarios to the installed SGLang; the
    # checking, the report and the front doors run it, never the other way
    "sglang": {"check", "report", "runners", "graphs", "collect", "plugin", "cli", "bench", "diffbench", "gpuci"},
    # the GPU CI's planning (shards, pinning, agreement between machines) reads results and backends' declarations
    "gpuci": {"check", "collect", "plugin", "cli", "bench", "diffbench", *TARGETS},
    # the fuzzer sits beside the matrix: it judges runs (check) and writes scenarios; the front doors run it
    "fuzz": {"report", "collect", "plugin", "cli", "bench", "diffbench", "gpuci", *TARGETS},
}


def _imports(path: Path) -> set[str]:
    module = ".".join(path.relative_to(ROOT.parent).with_suffix("").parts)
    package = module.rsplit(".", 1)[0] if path.name != "__init__.py" else module.removesuffix(".__init__")
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")[: len(package.split(".")) - node.level + 1]
                target = ".".join(base + ([node.module] if node.module else []))
            else:
                target = node.module or ""
            found.add(target)
            found.update(f"{target}.{a.name}" for a in node.names)
        elif isinstance(node, ast.Import):
            found.update(a.name for a in node.names)
    return {t.removeprefix("harness.") for t in found if t.startswith("harness.")}


@pytest.mark.parametrize("package", sorted(FORBIDDEN))
def test_package_never_imports_upwards(package):
    home = ROOT.joinpath(*package.split("."))
    files = [home.with_suffix(".py")] if home.with_suffix(".py").exists() else sorted(home.rglob("*.py"))
    assert files, f"no harness/{package.replace('.', '/')}"
    for path in files:
        for target in _imports(path):
            for banned in FORBIDDEN[package]:
                assert not (target == banned or target.startswith(banned + ".")), (
                    f"{path.relative_to(ROOT.parent)} imports harness.{target}")


def test_every_package_has_layering_rules():
    packages = {p.name for p in ROOT.iterdir() if p.is_dir() and (p / "__init__.py").exists()}
    assert packages - set(FORBIDDEN) == set(), "a package without rules in FORBIDDEN"


@pytest.mark.parametrize("target", sorted(TARGETS))
def test_no_module_outside_a_target_names_it_even_by_string(target):
    # the registries find a target through its entry point: a name in a string would be an import by the back door
    for path in ROOT.rglob("*.py"):
        if path.is_relative_to(ROOT / target):
            continue
        assert f"harness.{target}" not in path.read_text(), f"{path.relative_to(ROOT.parent)} names harness.{target}"


def test_the_concrete_backend_is_named_only_in_its_module_and_the_registry():
    for path in ROOT.rglob("*.py"):
        if path.parent.name == "backends" and path.name in ("torch_native.py", "registry.py"):
            continue
        assert "TorchNativeBackend" not in path.read_text(), path


@pytest.mark.parametrize("cls", ["HybridSWAKVPool", "SWATokenToKVPoolAllocator", "ReqToTokenPool"])
def test_the_miniatures_memory_layer_is_built_only_by_its_serving_stack(cls):
    # every run gets its pools through a serving stack, so another stack (the installed SGLang) replaces all
    for path in ROOT.rglob("*.py"):
        if path.parent.name == "serving" and path.name in ("miniature.py", "pool.py", "allocator.py"):
            continue
        if path.parent.name == "sglang":
            continue  # SGLang's own classes of these names (and the SGLang stack's view of their buffers)
        assert f"{cls}(" not in path.read_text(), f"{path.relative_to(ROOT.parent)} builds a {cls}"
