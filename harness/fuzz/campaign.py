"""One fuzz target as a plain Hypothesis test, for a long campaign under HypoFuzz (``make fuzz-campaign``:
``hypothesis fuzz -- harness/fuzz/campaign.py``) or a plain ``pytest harness/fuzz/campaign.py``.

The target comes from ``HARNESS_FUZZ_TARGET`` (``design:mode[:fault...]``, as ``make fuzz`` spells them;
default ``forward_batch:full``). The test is the search's own property (``search.property_test``) over the
target's folder of the example database, loaded as the default profile (HypoFuzz fuzzes only tests that
use the default database), so both have the same database key: whatever a campaign finds is replayed
first by ``python -m harness fuzz`` on the same target, which shrinks it and writes it under
``scenarios/regressions/``. No time budget and no seed: the campaign's engine decides. Not under
``tests/``: ``make test`` never runs it.
"""

from __future__ import annotations

import os

from hypothesis import HealthCheck, settings
from hypothesis.database import DirectoryBasedExampleDatabase

from ..runspec import Outcome, RunSpec
from .search import SLOW_AND_FILTERED, PropertyFailed, database_folder, property_test
from .target import FuzzTarget

TARGET_VARIABLE = "HARNESS_FUZZ_TARGET"


def _check(spec: RunSpec) -> None:
    from ..check.matrix.judgement import Judgement, judge_one
    from ..check.matrix.matrix import limit_threads

    limit_threads()  # tiny tensors: torch's intra-op threads only contend with each other
    verdict = judge_one(spec, Judgement(expected=Outcome.MATCH, why="the fuzzed property")).verdict
    if verdict.outcome != Outcome.MATCH:
        raise PropertyFailed(verdict.summary())


TARGET = FuzzTarget.parse(os.environ.get(TARGET_VARIABLE, "forward_batch:full"))
settings.register_profile("harness-fuzz-campaign", database=DirectoryBasedExampleDatabase(
    str(database_folder(TARGET))), deadline=None, suppress_health_check=[HealthCheck[h] for h in SLOW_AND_FILTERED])
settings.load_profile("harness-fuzz-campaign")

test_property = property_test(TARGET, _check, database=settings().database)
