"""Fixtures for driving the harness's pytest plugin and CLI on the sample scenario files in ``samples/``.

The samples live outside any folder named ``scenarios`` so the repository's own test run never collects
them; each test copies the ones it needs, optionally edited, into a fresh ``scenarios/`` folder.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Callable, Iterator

import pytest
import torch

SAMPLES = Path(__file__).parent / "samples"


def sample_text(name: str, replace: dict[str, str] | None = None) -> str:
    """The sample ``name``.toml, each ``old -> new`` replacement applied (and required to apply)."""
    text = (SAMPLES / f"{name}.toml").read_text()
    for old, new in (replace or {}).items():
        assert old in text, f"sample {name}.toml has no {old!r} to replace"
        text = text.replace(old, new)
    return text


def _write_scenario(root: Path, name: str, sample: str | None = None, *,
                   replace: dict[str, str] | None = None, text: str | None = None) -> Path:
    """Write ``root/scenarios/<name>.toml`` from a sample (edited) or from literal text."""
    folder = root / "scenarios"
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"{name}.toml"
    path.write_text(text if text is not None else sample_text(sample or name, replace))
    return path


AddScenario = Callable[..., Path]


@pytest.fixture
def one_torch_thread(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """Scenario runs here are a few tiny tensors; on a loaded 2-core machine torch's spinning intra-op
    threads make them ~50x slower. One thread in this process (restored after) and in child processes."""
    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(before)


SAMPLE_MODULES = tuple(sorted(p.stem for p in SAMPLES.glob("*.py")))
"""the sample plug-ins' module names: tests copy them beside their scenarios and import them from there"""


@pytest.fixture
def fresh_sample_modules(monkeypatch: pytest.MonkeyPatch) -> None:
    """A sample module an earlier test of this process imported (from ``samples/`` or its own folder) stays in
    ``sys.modules``, and an in-process run here would use that copy, and say so in its reproduce lines, where a
    fresh process (an xdist worker, a user's shell) imports the one beside the scenarios: the test starts
    without them."""
    for name in SAMPLE_MODULES:
        monkeypatch.delitem(sys.modules, name, raising=False)


@pytest.fixture
def harness_pytester(pytester: pytest.Pytester, one_torch_thread: None,
                     fresh_sample_modules: None) -> pytest.Pytester:
    """A pytester directory whose conftest loads the harness plugin, as the repository's root conftest does,
    with no sample module left imported by an earlier test (``fresh_sample_modules``)."""
    pytester.makeconftest('pytest_plugins = ["harness.plugin"]\n')
    return pytester


@pytest.fixture
def add_scenario(harness_pytester: pytest.Pytester) -> AddScenario:
    def add(name: str, sample: str | None = None, **kwargs) -> Path:
        return _write_scenario(harness_pytester.path, name, sample, **kwargs)

    return add


@pytest.fixture
def write_scenario() -> Callable[..., Path]:
    """``write_scenario(root, name, sample=None, *, replace=None, text=None)`` writes root/scenarios/name.toml."""
    return _write_scenario


@pytest.fixture
def cli_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, one_torch_thread: None) -> Path:
    """A working directory for the CLI; ``scenarios/`` there is its default scenario root."""
    monkeypatch.chdir(tmp_path)
    return tmp_path
