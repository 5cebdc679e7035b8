"""A target package registers its own serving stacks and faults through a ``harness.targets`` entry point,
touching nothing downstairs; the SGLang target is one, and a scenario names a target's stack in ``[serving]``."""

from __future__ import annotations

import contextlib
import importlib.metadata
import textwrap

import pytest

from harness import imports
from harness.check.matrix.case import cases
from harness.check.matrix.matrix import run_case
from harness.scenario import load_scenario
from harness.serving import faults, registry
from harness.serving.faults import Component, Fault

from .test_extension_points import HighestFirstStack  # noqa: F401 - the stack the toy target registers

_TOY_FAULT = Fault(name="toy_patched", acts_on=Component.TARGET, modes=("eager",), patch=f"{__name__}:toy_patch",
                   summary="enters the toy target's patch around the run", reference="none: a test")
entered: list[str] = []


@contextlib.contextmanager
def toy_patch():
    entered.append("toy")
    yield


def register() -> None:
    """The toy target's registration call, as its entry point names it."""
    registry.register_stack("highest_first_target", f"{__package__}.test_extension_points:HighestFirstStack")
    faults.register_faults(_TOY_FAULT)


def _broken() -> None:
    raise RuntimeError("no such engine\nhere")


@pytest.fixture
def fresh_registries(monkeypatch):
    """The registries as before any target registered, and the entry points ``targets`` names (restored after)."""
    for table in (registry.STACKS, registry.OPTIONAL_STACKS, registry.STACK_AVAILABILITY, registry.EVICTION_POLICIES,
                  faults.FAULTS):
        monkeypatch.setattr(table, "_entries", dict(table._entries))

    def use(*entries: tuple[str, str]) -> None:
        found = [importlib.metadata.EntryPoint(name=n, value=v, group=imports.TARGET_GROUP) for n, v in entries]
        monkeypatch.setattr(importlib.metadata, "entry_points",
                            lambda group: found if group == imports.TARGET_GROUP else [])
        monkeypatch.setattr(imports, "_targets_loaded", False)
    return use


def test_the_installed_harness_registers_the_sglang_target_by_entry_point():
    names = {e.name: e.value for e in importlib.metadata.entry_points(group=imports.TARGET_GROUP)}
    assert names.get("sglang") == "harness.sglang.target:register"
    assert registry.STACKS["sglang"] == "harness.sglang.stack:SGLangStack" and "sglang" in registry.OPTIONAL_STACKS
    assert {n for n, f in faults.FAULTS.items() if f.acts_on is Component.TARGET} == {
        "sglang_evict_one_page_too_far", "sglang_skip_metadata_refresh", "sglang_reuse_plan",
        "sglang_skip_evict_mid_prefill", "sglang_frontier_in_tokens", "sglang_match_len_not_reset"}


def not_installed() -> str:
    return "toyengine is not installed here (pip install toyengine)"


def register_absent() -> None:
    """A target whose stack needs an install this machine lacks, as the SGLang target's does without SGLang."""
    registry.register_stack("highest_first_target", f"{__package__}.test_extension_points:HighestFirstStack",
                            optional_install="toyengine", unavailable=f"{__name__}:not_installed")
    faults.register_faults(_TOY_FAULT)


def test_a_second_target_registers_a_stack_and_a_fault_a_scenario_runs_by_name(fresh_registries, tmp_path):
    fresh_registries(("toy", f"{__name__}:register"))
    assert "highest_first_target" in registry.STACKS and "toy_patched" in faults.FAULTS
    path = _toy_scenario(tmp_path)
    scenario = load_scenario(path)
    entered.clear()
    [case] = cases(scenario)
    result = run_case(case)
    assert result.ok, result.verdict.summary()
    assert entered == ["toy"]
    assert case.run_spec().serving == "highest_first_target"


def test_a_stack_whose_install_is_missing_skips_its_runs_saying_why(fresh_registries, tmp_path):
    # a scenario (a fuzz finding over SGLang, say) on a machine without the target's install: skipped, not an error
    fresh_registries(("toy", f"{__name__}:register_absent"))
    [case] = cases(load_scenario(_toy_scenario(tmp_path)))
    assert case.unsupported == not_installed()
    assert registry.stack_unavailable("miniature") is None


def _toy_scenario(tmp_path):
    path = tmp_path / "toy_target.toml"
    path.write_text(textwrap.dedent("""\
        description = "the toy target's stack and fault, by name"
        [model]
        preset = "gpt-oss-mini"
        [pool]
        full_size = 64
        swa_size = 32
        [serving]
        stack = "highest_first_target"
        [graphs]
        modes = ["eager"]
        [timeline]
        [[timeline.requests]]
        prompt_len = 9
        output_len = 4
        [run]
        designs = ["translate"]
        backends = ["torch_native"]
        faults = ["toy_patched"]
        [expect.translate]
        verdict = "match"
        why = "the patch changes nothing"
        """))
    return path


def test_a_target_that_fails_to_register_is_a_warning_naming_it_and_the_rest_stand(fresh_registries):
    fresh_registries(("broken", f"{__name__}:_broken"), ("toy", f"{__name__}:register"))
    with pytest.warns(UserWarning, match=r"target 'broken' \(.*:_broken\) cannot register: RuntimeError: no such "
                                         r"engine here"):
        assert "miniature" in registry.STACKS
    assert "highest_first_target" in registry.STACKS


def test_a_target_may_not_take_a_name_or_add_a_fault_without_its_patch(fresh_registries):
    fresh_registries()
    with pytest.raises(ValueError, match="'miniature' is registered already"):
        registry.register_stack("miniature", "elsewhere:Stack")
    with pytest.raises(ValueError, match="'no_zero_swa_pad' is in the catalog already"):
        faults.register_faults(Fault(name="no_zero_swa_pad", acts_on=Component.TARGET, modes=("eager",),
                                     patch="a:b", summary="s", reference="r"))
    with pytest.raises(ValueError, match="through a patch"):
        faults.register_faults(Fault(name="toy_no_patch", acts_on=Component.TARGET, modes=("eager",),
                                     summary="s", reference="r"))
