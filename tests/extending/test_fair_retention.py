"""Issue 26 section 2: the ``retained`` invariant holds every eviction policy to what SGLang may retain (the
model's window, the page size, the declared eviction interval), not to the policy's own frontier: a policy of
one's own (``own_engine/policies.py``) that stops freeing once a request decodes breaches it wherever a request
outlives its window, as the same leak patched into the scheduler does."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from harness.check.matrix.case import Selection, cases
from harness.check.matrix.matrix import run_case
from harness.scenario import load_scenario
from harness.serving.eviction import RequestWindow, SGLangEviction, TightEviction, EvictionSpec, retention_bound

LIBRARY = Path(__file__).resolve().parents[2] / "scenarios"
LEAKING = "tests.extending.own_engine.policies:StopsFreeingOnceDecoding"


@pytest.mark.parametrize("scenario", ["swa_decode_past_window_reuse", "swa_paged_decode_pages_of_4",
                                      "swa_prefix_multi_turn"],
                         ids=lambda n: n.replace("_", "-"))  # hyphens: -k <family> keeps to scenario items
def test_a_policy_that_stops_freeing_once_decoding_breaches_retained_in_every_mode(scenario):
    spec = load_scenario(LIBRARY / f"{scenario}.toml")
    spec = dataclasses.replace(spec, eviction=dataclasses.replace(spec.eviction, policy=LEAKING))
    runs = cases(spec, Selection(designs=[spec.designs[0]], backends=[spec.backends[0]]))
    assert runs
    for case in runs:
        verdict = run_case(case).verdict
        assert str(verdict.outcome) == "invariant", (case.name, verdict.summary())
        assert verdict.error.message.startswith("retained: swa slot "), verdict.error.message
        assert "is below what its request may retain" in verdict.error.message


def _walk(policy_cls, *, window: int, page_size: int, interval: int, sharing: bool, steps: int = 400) -> None:
    """Decode one request token by token under a built-in policy: its frontier never falls behind the bound."""
    policy = policy_cls(EvictionSpec(interval=interval, prefix_cache=sharing), window=window, page_size=page_size)
    evicted = 0
    for decoded, seq_len in enumerate(range(7, 7 + steps)):
        req = RequestWindow(seq_len=seq_len, swa_evicted=evicted, prefilling=False, decoded=decoded)
        evicted = policy.frontier(req)
        bound = retention_bound(req, window=window, page_size=page_size, interval=policy.declared_interval,
                                prefix_sharing=policy.prefix_sharing)
        assert evicted >= bound, (policy_cls.name, seq_len, evicted, bound)


@pytest.mark.parametrize("policy_cls", [TightEviction, SGLangEviction])
@pytest.mark.parametrize("page_size", [1, 4, 16])
@pytest.mark.parametrize("sharing", [False, True])
def test_the_built_in_policies_never_fall_behind_the_bound(policy_cls, page_size, sharing):
    for window in (4, 8, 33):
        for interval in (1, 5, 128):
            _walk(policy_cls, window=window, page_size=page_size, interval=interval, sharing=sharing)


def test_tight_declares_an_interval_of_one_and_its_bound_is_its_own_frontier():
    tight = TightEviction(EvictionSpec(interval=128), window=8, page_size=4)
    assert tight.declared_interval == 1 and SGLangEviction(EvictionSpec(interval=9), window=8).declared_interval == 9
    req = RequestWindow(seq_len=30, swa_evicted=0, prefilling=False, decoded=3)
    assert retention_bound(req, window=8, page_size=4, interval=1, prefix_sharing=False) == tight.frontier(req) == 20
