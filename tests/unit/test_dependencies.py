"""The declared dependencies install and import on a CPU-only machine."""

import importlib


def test_flashinfer_imports_without_a_gpu():
    # its kernels need CUDA; the package itself must still import so GPU code paths can be collected
    flashinfer = importlib.import_module("flashinfer")
    assert flashinfer.__version__


def test_pandas_and_xdist_are_installed():
    assert importlib.import_module("pandas").__version__
    assert importlib.import_module("xdist")
