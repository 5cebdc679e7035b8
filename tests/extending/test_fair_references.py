"""Issue 26 section 1: no plug-in is its own reference. A backend named by import path is judged against the
library's reference backend for its geometry unless it declares ``reference_backend``; the reference of any run
with a plug-in is certified against the dense oracle, so a reference that is itself wrong is named as such. The
plug-ins are in ``own_engine/``, written outside the harness."""

from __future__ import annotations

from pathlib import Path

from harness.check.matrix.case import Selection, cases
from harness.check.matrix.matrix import NOT_CERTIFIED, run_case
from harness.report.build import case_view
from harness.report.text import failure_block
from harness.scenario import load_scenario

CHUNKED = load_scenario(Path(__file__).resolve().parents[2] / "scenarios" / "swa_prefill_chunked_cross_window.toml")
BACKENDS = "tests.extending.own_engine.backends"


def _case(backend: str, mode: str = "eager"):
    chosen = cases(CHUNKED, Selection(designs=["forward_batch"], modes=[mode], backends=[backend],
                                      extra_backends=[backend]))
    (case,) = chosen
    return case


def test_an_added_backend_is_judged_by_the_librarys_reference_backend_and_the_report_says_so():
    case = _case(f"{BACKENDS}:SameGather")
    assert case.reference_backend == "torch_native"
    view = case_view(run_case(case))
    assert (view.verdict, view.ok) == ("match", True)  # a correct backend: within tolerance of another's numbers
    assert view.judged_by == ("the eager forward_batch run on torch_native (the library's reference backend for this "
                              "geometry: it declares no reference_backend), certified against the dense oracle")
    assert view.to_record()["judged_by"] == view.judged_by
    builtin = case_view(None, case=_case("torch_gather"))
    assert builtin.judged_by is None and "judged_by" not in builtin.to_record()  # the library's records keep their shape


def test_a_gather_backend_reading_untranslated_ids_on_its_eager_path_diverges_in_eager_mode():
    view = case_view(run_case(_case(f"{BACKENDS}:UntranslatedEagerGather")))
    assert (view.expected, view.verdict) == ("match", "diverge")  # its own eager run would have matched itself
    assert "judged against: the eager forward_batch run on torch_native" in failure_block(view)


def test_a_reference_wrong_in_every_mode_is_named_by_the_dense_oracle():
    case = _case(f"{BACKENDS}:HalvedGather", mode="full")
    assert case.reference_backend == case.backend  # it declares itself its reference
    view = case_view(run_case(case))
    assert view.verdict == "error" and view.error.type == NOT_CERTIFIED
    assert view.error.message.startswith(
        "reference run failed: the dense oracle disagrees with it (eager forward_batch on "
        f"{BACKENDS}:HalvedGather, serving stack miniature, eviction policy tight, judging the runs of "
        f"{BACKENDS}:HalvedGather): step 0 full pool layer 1 slot 1 (long@0) k: max |diff|")
