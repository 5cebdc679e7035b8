"""Tests of the SGLang target: they need the installed SGLang (``make sglang-venv``) and skip, naming the
make target, where it is missing. Collecting them imports no SGLang."""

import pytest

from harness.sglang.installed import unavailable_reason

REASON = unavailable_reason()


def pytest_collection_modifyitems(config, items):
    if REASON is None:
        return
    skip = pytest.mark.skip(reason=REASON)
    for item in items:
        if "tests/sglang/" in str(item.path).replace("\\", "/"):
            item.add_marker(skip)


def pytest_configure(config):
    # SGLang warns at import that its AWQ and GGUF kernels need a GPU: nothing the adapter uses
    config.addinivalue_line("filterwarnings", "ignore:Only CUDA.*support:UserWarning")
