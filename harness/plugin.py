"""pytest hooks only; each delegates to harness.collect (scenario files) or marks GPU tests."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from .check.matrix import limit_threads
from .collect import ScenarioFile, is_scenario_file


def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("harness", "SWA CUDA-graph harness")
    group.addoption("--harness-device", choices=("cpu", "cuda"), default="cpu",
                    help="device scenario runs use (cuda items are marked gpu)")
    group.addoption("--harness-engine", choices=("tape", "cuda"), default=None,
                    help="graph engine for scenario runs (default: tape on cpu, cuda on cuda)")


def pytest_configure(config: pytest.Config) -> None:
    limit_threads()
    config.addinivalue_line("markers", "gpu: needs CUDA (skipped with a reason when no GPU is present)")
    config.addinivalue_line("markers", "slow: takes more than a few seconds")


def pytest_collect_file(file_path: Path, parent: pytest.Collector) -> pytest.Collector | None:
    if is_scenario_file(file_path, parent.config.rootpath):
        return ScenarioFile.from_parent(parent, path=file_path)
    return None


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="needs CUDA: no GPU on this machine")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)
