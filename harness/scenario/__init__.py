"""Scenario files: one TOML file per scenario, read into a ``ScenarioSpec`` and validated in full.

``load_scenario`` / ``load_all`` read files; ``check_scenario`` validates a spec however it was made;
``scenario_toml`` writes a spec back out as a file that loads to an equal spec.
"""

from .loader import (
    SCENARIO_ROOT_DEFAULT,
    ScenarioError,
    check_scenario,
    discover,
    load_all,
    load_scenario,
)
from .spec import BackendExpectation, Expectation, ScenarioSpec
from .writer import scenario_toml

__all__ = [
    "SCENARIO_ROOT_DEFAULT",
    "BackendExpectation",
    "Expectation",
    "ScenarioError",
    "ScenarioSpec",
    "check_scenario",
    "discover",
    "load_all",
    "load_scenario",
    "scenario_toml",
]
