"""Third-party declarations are input: a backend, runner, serving stack, eviction policy or design named by
import path whose declaration breaks the contract (``samples/bad_declarations.py``), or whose module fails to
import (``samples/broken_at_import.py``), gives one line naming the class, the declaration and what was
expected; its runs are error verdicts (exit 1), never skips or a traceback, and every other run goes on,
under the CLI and under pytest alike."""

from __future__ import annotations

import json
import sys

import pytest

from harness.backends.registry import backend_class
from harness.check.matrix.case import Selection, cases
from harness.declarations import DeclarationError
from harness.scenario import load_scenario

from .conftest import SAMPLES, sample_text
from .test_cli import rows, run_cli

BAD_BACKENDS = {
    "bad_declarations:UnsupportedRaises":
        "backend bad_declarations:UnsupportedRaises.unsupported(): expected a tuple of reasons (str), empty when it "
        "can run the case, raised RuntimeError: cannot tell",
    "bad_declarations:UnsupportedReturnsNone":
        "backend bad_declarations:UnsupportedReturnsNone.unsupported(): expected a tuple of reasons (str), empty "
        "when it can run the case, got None",
    "bad_declarations:NoDevices":
        "backend bad_declarations:NoDevices.devices: expected a non-empty set of 'cpu'/'cuda', got frozenset()",
    "bad_declarations:GraphSupportString":
        "backend bad_declarations:GraphSupportString.graph_support: expected a GraphSupport (NONE, PIECEWISE_ONLY, "
        "DECODE_ONLY, UNIFORM_BATCH, FULL), got 'FULL'",
    "broken_at_import:Backend":
        "backend 'broken_at_import:Backend' cannot be imported: RuntimeError: this plug-in's own bug, at import",
}


@pytest.fixture
def plugins(monkeypatch):
    """The sample plug-in modules importable by name (forked runs inherit the path)."""
    monkeypatch.syspath_prepend(str(SAMPLES))
    yield
    for module in ("bad_declarations", "broken_at_import"):
        sys.modules.pop(module, None)


@pytest.mark.parametrize("name", sorted(BAD_BACKENDS))
def test_a_backend_whose_declaration_breaks_the_contract_is_one_line_where_it_is_loaded(plugins, name):
    with pytest.raises(DeclarationError) as err:
        backend_class(name)
    assert str(err.value) == BAD_BACKENDS[name]


def test_its_cases_are_errors_not_skips_and_the_other_backends_cases_are_untouched(plugins, tmp_path):
    path = tmp_path / "tiny_match.toml"
    path.write_text(sample_text("tiny_match"))
    got = cases(load_scenario(path), Selection(extra_backends=sorted(BAD_BACKENDS)))
    for case in got:
        if case.backend == "torch_native":
            assert (case.declaration_error, case.unsupported, case.expected) == (None, None, "match")
        else:
            assert case.declaration_error == BAD_BACKENDS[case.backend] and case.unsupported is None
            assert case.expected == "no expectation"  # an expected error must not hide a broken plug-in
    assert {c.backend for c in got} == {"torch_native", *BAD_BACKENDS}


def test_a_hook_that_breaks_the_contract_in_one_case_only_makes_that_case_an_error(plugins, tmp_path):
    path = tmp_path / "tiny_match.toml"
    path.write_text(sample_text("tiny_match"))
    got = {c.mode: c.declaration_error for c in cases(load_scenario(path), Selection(
               designs=["translate"], extra_backends=["bad_declarations:UnsupportedRaisesOnlyInFull"]))
           if c.backend != "torch_native"}
    assert got == {"eager": None, "full": "backend bad_declarations:UnsupportedRaisesOnlyInFull.unsupported(): "
                   "expected a tuple of reasons (str), empty when it can run the case, raised ValueError: full mode "
                   "puzzles me"}


@pytest.mark.parametrize("name", sorted(BAD_BACKENDS))
def test_cli_runs_of_a_broken_backend_are_errors_with_exit_1_and_the_rest_runs(plugins, cli_dir, capsys, write_scenario,
                                                                             name):
    write_scenario(cli_dir, "tiny_match")
    code, out, err = run_cli(capsys, "run", "--jobs", "1", "-v", "--mode", "eager", "--design", "translate",
                             "--backend", "torch_native", "--backend", name, "--json", "r.json")
    assert code == 1, out + err
    assert "Traceback" not in out + err
    table = rows(out)
    assert table["tiny_match[translate-eager-torch_native]"][1:3] == ["match", "match"]
    assert f"observed: error: DeclarationError: {BAD_BACKENDS[name]}" in out
    records = {r["name"]: r for r in json.loads((cli_dir / "r.json").read_text())["records"]}
    record = records[f"tiny_match[translate-eager-{name}]"]
    assert (record["verdict"], record["ok"], record["error"]["message"]) == ("error", False, BAD_BACKENDS[name])


OTHER_PLUGINS = {
    "runner": (("--mode", "full", "--runner", "full=bad_declarations:CoversAList"),
               "runner bad_declarations:CoversAList.covers: expected None or a tuple of GraphCover, got [GraphCover("),
    "serving stack": (("--mode", "eager", "--serving", "bad_declarations:KVGroupsADict"),
                      "serving stack bad_declarations:KVGroupsADict.kv_groups(): expected KVGroups with a group for "
                      "each of layers 0..2, got {'full': (0, 1, 2)}"),
    "design": (("--mode", "eager", "--design", "bad_declarations:sound_as_a_string"),
               "design bad_declarations:sound_as_a_string.design.sound: expected a bool, got 'yes'"),
    "design record": (("--mode", "eager", "--design", "bad_declarations:record_not_a_design"),
                      "design bad_declarations:record_not_a_design.design: expected a Design record "
                      "(serving.designs.declare), got {'sound': True}"),
}


@pytest.mark.parametrize("kind", sorted(OTHER_PLUGINS))
def test_cli_a_runner_stack_or_design_that_breaks_its_contract_gives_error_verdicts_saying_so(plugins, cli_dir, capsys,
                                                                                             write_scenario, kind):
    write_scenario(cli_dir, "tiny_match")
    options, line = OTHER_PLUGINS[kind]
    code, out, err = run_cli(capsys, "run", "--jobs", "1", *options)
    assert code == 1, out + err
    assert "Traceback" not in out + err
    observed = [ln for ln in out.splitlines() if ln.startswith("  observed: ")]
    assert observed and all("error: " in ln and line in ln for ln in observed), observed


def test_cli_an_eviction_policy_whose_frontier_is_not_an_int_gives_error_verdicts_saying_so(plugins, cli_dir, capsys,
                                                                                           write_scenario):
    write_scenario(cli_dir, "tiny_match", replace={
        "[timeline]": '[eviction]\npolicy = "bad_declarations:FrontierAFloat"\n\n[timeline]'})
    code, out, err = run_cli(capsys, "run", "--jobs", "1", "--mode", "eager", "--design", "translate")
    assert code == 1 and "Traceback" not in out + err
    assert ("eviction policy bad_declarations:FrontierAFloat.frontier(): expected an int (the position below which "
            "SWA slots are freed), got ") in out


def test_pytest_items_of_broken_backends_fail_each_saying_why_and_the_session_runs_the_rest(harness_pytester,
                                                                                          add_scenario):
    harness_pytester.syspathinsert(SAMPLES)
    add_scenario("tiny_match")
    try:
        result = harness_pytester.runpytest_inprocess(
            "-q", "-p", "no:randomly", "-k", "translate-eager or oracle",
            *(a for name in sorted(BAD_BACKENDS) for a in ("--harness-backend", name)))
    finally:
        for module in ("bad_declarations", "broken_at_import"):
            sys.modules.pop(module, None)
    # per backend: its oracle item and its translate-eager item; torch_native's pass, the broken ones fail
    result.assert_outcomes(passed=2, failed=2 * len(BAD_BACKENDS))
    assert result.ret == 1
    out = result.stdout.str()
    assert "error" not in out.splitlines()[-1]  # no collection error stopped the session
    for name, line in BAD_BACKENDS.items():
        assert f"no reference run: {line}" in out  # the oracle item
        assert f"observed: error: DeclarationError: {line}" in out  # the run item
