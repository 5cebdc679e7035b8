"""The SGLang target's own scenarios (``tests/sglang/sglang_scenarios``), moved onto the installed SGLang
(``library.on_sglang``): every case gives the verdict its file expects, faults on real code included (each
patch entered in the run's forked child only), and each reference run agrees with the dense oracle."""

from pathlib import Path

import pytest

from harness.check.matrix.case import cases
from harness.check.matrix.matrix import run_cases, scenario_reference
from harness.check.run.oracle import certify, dense_oracle
from harness.scenario.loader import load_scenario
from harness.serving.model import SyntheticModel
from harness.sglang import designs
from harness.sglang.backend import InstalledTorchNativeAttn
from harness.sglang.installed import load
from harness.sglang.library import on_sglang

SCENARIOS = sorted((Path(__file__).parent / "sglang_scenarios").glob("*.toml"))


@pytest.mark.parametrize("path", SCENARIOS, ids=lambda p: p.stem.replace("_", "-"))  # -k with a scenario name selects its file, not this
def test_every_case_gives_its_expected_verdict_and_the_reference_is_certified(path):
    scenario = on_sglang(load_scenario(path))
    runnable = [c for c in cases(scenario) if c.unsupported is None]
    assert runnable, "nothing to run"
    said = [f"{r.case.name}: expected {r.case.expected}, got {r.verdict.outcome} "
            f"({r.verdict.error.message if r.verdict.error else r.verdict.first})"
            for r in run_cases(runnable, jobs=1) if not r.ok]
    assert said == []
    _assert_unpatched()
    for backend in scenario.backends:
        reference = scenario_reference(scenario, backend=backend)
        assert reference.error is None, reference.error
        model = SyntheticModel(reference.spec.model, "cpu")
        cert = certify(reference.snapshots, dense_oracle(model, reference.spec.timeline), model=model,
                       kv_dtype=reference.spec.pool.kv_dtype, kv_scales=model.kv_scales())
        assert cert.ok, cert.problems


def _assert_unpatched() -> None:
    """The faults' patches were entered in the runs' children only: this process's SGLang is as installed."""
    api = load()
    common = __import__(api.free_swa_out_of_window_slots.__module__, fromlist=["_"])
    assert common.free_swa_out_of_window_slots is api.free_swa_out_of_window_slots
    from sglang.srt.mem_cache.unified_cache.components import swa  # the radix tree's SWA component

    assert swa.free_swa_out_of_window_slots is api.free_swa_out_of_window_slots
    assert swa.SWAComponent.create_match_validator.__qualname__ == "SWAComponent.create_match_validator"
    assert api.KVIndexTranslator.plan.__qualname__ == "KVIndexTranslator.plan"
    assert designs._skip_refresh is False


def test_the_installed_backend_is_judged_against_the_harness_backend_and_runs_eager_only():
    scenario = on_sglang(load_scenario(next(p for p in SCENARIOS if "within_window" in p.stem)))
    assert scenario_reference(scenario, backend=scenario.backends[0]).spec.backend == "torch_native"
    [reason] = InstalledTorchNativeAttn.unsupported(mode="full", device="cpu")
    assert "graph runners" in reason and "need CUDA" in reason
    assert InstalledTorchNativeAttn.unsupported(mode="eager", device="cpu") == ()
