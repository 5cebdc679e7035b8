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


def first_clean_spec(path):
    """The run spec of a library scenario's first design, mode and backend with its faults off: the run the SGLang
    graph tests drive."""
    from harness.scenario.loader import load_scenario

    scenario = load_scenario(path)
    return scenario.run_spec(design=scenario.designs[0], mode=scenario.modes[0], backend=scenario.backends[0],
                             with_faults=False)


@pytest.fixture(scope="session")
def clean_spec():
    """``clean_spec(path)``: ``first_clean_spec`` as a fixture, for test modules (which do not import conftest)."""
    return first_clean_spec


@pytest.fixture(scope="session")
def graph_runner():
    """``harness.sglang.graph_runner``, imported only where SGLang is installed."""
    from harness.sglang import graph_runner

    return graph_runner


@pytest.fixture(scope="session")
def trtllm_runs():
    """``runs(path) -> (spec, eager, graph)``: a library scenario's timeline through SGLang's TRT-LLM MHA backend,
    eagerly and under SGLang's decode graph runner on the tape, built once per session (several test modules
    read the same runs)."""
    from harness.graphs import get_engine
    from harness.sglang import graph_runner

    cache = {}

    def runs(path):
        if path not in cache:
            spec = first_clean_spec(path)
            from harness.fuzz.driven import step_certifier

            observe, certification = step_certifier(spec)
            eager = graph_runner.run_timeline(spec, engine=None, attention="trtllm_mha", observe=observe)
            eager.certification = certification()
            cache[path] = (spec, eager,
                           graph_runner.run_timeline(spec, engine=get_engine("tape"), attention="trtllm_mha"))
        return cache[path]

    return runs


@pytest.fixture(scope="session")
def oracle_certifier():
    """``harness.fuzz.driven.step_certifier``: snapshots of an observed ``run_timeline`` certified against the
    dense oracle (what every library run's reference is certified by)."""
    from harness.fuzz.driven import step_certifier

    return step_certifier


@pytest.fixture(scope="session")
def observed_trtllm_run(graph_runner, oracle_certifier):
    """``observed(spec, engine)``: ``run_timeline`` over the TRT-LLM MHA backend, observed step by step, with its
    certification against the dense oracle as ``run.certification``."""
    def observed(spec, engine):
        observe, certification = oracle_certifier(spec)
        run = graph_runner.run_timeline(spec, engine=engine, attention="trtllm_mha", observe=observe)
        run.certification = certification()
        return run

    return observed
