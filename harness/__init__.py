"""CUDA-graph correctness harness for attention backends with hybrid sliding-window KV caches.

The public surface is small: scenarios are loaded with ``harness.scenario.load_scenario``, one run is a
``harness.run.RunSpec`` given to ``harness.run.execute``, and ``harness.verdict.judge`` compares a run
with its reference. Everything else is reached through ``python -m harness`` or pytest.
"""
