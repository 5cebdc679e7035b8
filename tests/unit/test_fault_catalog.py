"""One fault catalog: every component takes its switches from it, and a fault that cannot act is refused."""

import contextlib
import dataclasses
import sys
from pathlib import Path

import pytest

from harness.backends.registry import BACKENDS, backend_class
from harness.check.drive import execute
from harness.imports import load_named
from harness.runners.decode_graph import DecodeGraphRunner
from harness.runners.piecewise import PiecewisePrefillRunner
from harness.runners.speculative import SpeculativeWorker
from harness.runspec import RunSpec
from harness.scenario import ScenarioError, load_all, load_scenario
from harness.serving.faults import FAULTS, Component, faults_acting_on
from harness.serving.model import model_spec
from harness.serving.pool import PoolSpec
from harness.serving.prefix_cache import SWARadixCache
from harness.serving.scheduler import Scheduler
from harness.serving.timeline import RequestSpec, TimelineSpec

SGLANG_SCENARIOS = Path(__file__).resolve().parents[1] / "sglang" / "sglang_scenarios"

COMPONENTS = {
    Component.SCHEDULER: Scheduler,
    Component.DECODE_GRAPH_RUNNER: DecodeGraphRunner,
    Component.PIECEWISE_RUNNER: PiecewisePrefillRunner,
    Component.ATTENTION_BACKEND: backend_class("torch_native"),
    Component.SPECULATIVE_WORKER: SpeculativeWorker,
    Component.PREFIX_CACHE: SWARadixCache,
}


def test_every_catalog_fault_is_known_by_exactly_one_component():
    owners = {name: [c for c in COMPONENTS if name in faults_acting_on(c)] for name in FAULTS
              if FAULTS[name].patch is None}
    assert all(len(found) == 1 for found in owners.values()), owners
    assert set().union(*(faults_acting_on(c) for c in Component)) == set(FAULTS)


def test_a_fault_on_the_installed_sglang_is_a_patch_and_only_such_a_fault_is():
    patched = {name for name, fault in FAULTS.items() if fault.patch is not None}
    assert patched == faults_acting_on(Component.TARGET) != set()
    for name in patched:  # importable without SGLang: each imports it only when entered
        assert callable(load_named(FAULTS[name].patch, {}, kind="fault patch", check=lambda obj: None)), name


def test_every_patch_fault_is_flagged_by_an_sglang_scenario_and_matches_without_it():
    specs, errors = load_all([SGLANG_SCENARIOS])
    assert not errors, "\n".join(str(e) for e in errors)
    for name in faults_acting_on(Component.TARGET):
        flagged = [(s.name, e.design) for s in specs if name in s.faults for e in s.expectations
                   if e.without_faults == "match" and e.verdict in ("diverge", "error", "invariant")]
        assert flagged, f"no SGLang scenario flags {name} and expects a match once it is switched off"


def test_a_patch_is_entered_around_the_run_and_left_after_it(monkeypatch):
    entered = []

    @contextlib.contextmanager
    def patch():
        entered.append("in")
        yield
        entered.append("out")

    monkeypatch.setattr(sys.modules[__name__], "_patch", patch, raising=False)
    fault = dataclasses.replace(FAULTS["sglang_reuse_plan"], name="probe", patch=f"{__name__}:_patch")
    monkeypatch.setitem(FAULTS, "probe", fault)
    result = execute(RunSpec(model=model_spec("gpt-oss-mini"), pool=PoolSpec(full_size=32, swa_size=16),
                             timeline=TimelineSpec(requests=(RequestSpec(rid="a", prompt_len=3, output_len=1),)),
                             faults=frozenset({"probe"})))
    assert result.error is None and entered == ["in", "out"]


def test_each_component_class_takes_its_switches_from_the_catalog():
    for component, cls in COMPONENTS.items():
        assert cls.component is component
    assert SpeculativeWorker.known_faults == faults_acting_on(Component.SPECULATIVE_WORKER)
    for name in BACKENDS:
        assert backend_class(name).known_faults <= faults_acting_on(Component.ATTENTION_BACKEND)


def test_a_worker_ignores_faults_that_are_not_its_own():
    worker = SpeculativeWorker(object(), {"no_zero_swa_pad", "stale_swa_after_reassign"})  # runs nothing
    assert worker.faults == {"stale_swa_after_reassign"}


def test_a_fault_that_cannot_act_in_any_mode_is_a_load_error(tmp_path: Path):
    path = tmp_path / "s.toml"
    path.write_text(
        'description = "d"\n[model]\npreset = "gpt-oss-mini"\n[pool]\nfull_size = 64\nswa_size = 32\n'
        '[graphs]\nmodes = ["eager", "piecewise"]\n[timeline]\n[[timeline.requests]]\nprompt_len = 4\n'
        '[run]\ndesigns = ["translate"]\nfaults = ["skip_memo_invalidate", "no_zero_swa_pad"]\n'
        '[expect.translate]\nverdict = "match"\nwhy = "w"\n'
    )
    with pytest.raises(ScenarioError) as err:
        load_scenario(path)
    assert err.value.problems == (
        f"{path}: run.faults[1]: no_zero_swa_pad acts only in full mode; graphs.modes has eager, piecewise",
    )


def test_the_fault_table_in_docs_lists_exactly_the_catalog():
    readme = (Path(__file__).resolve().parents[2] / "docs/scenarios.md").read_text()
    table = readme[readme.index("| fault | acts on | real bug |"):].split("\n\n", 1)[0]
    listed = [line.split("`")[1] for line in table.splitlines()[2:]]
    assert listed == list(FAULTS), "docs/scenarios.md's fault table and harness/serving/faults.py disagree"
    for name, fault in FAULTS.items():
        assert fault.reference in table, name
