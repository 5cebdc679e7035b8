"""CUDA-graph correctness harness for attention backends with hybrid sliding-window KV caches.

Packages, from the bottom up (imports only go down; ``tests/unit/test_layering.py`` holds the rules):
``imports`` (named extension points: a registered name or ``package.module:attr``); ``serving`` (the SGLang
miniature under test) and ``graphs`` (the graph engines), which never import each other; ``runspec`` (the
run vocabulary: ``Mode``, ``Outcome``, ``RunSpec``); ``backends`` and ``runners`` (how a batch reaches
attention, eagerly or through captured graphs, the graph dispatcher choosing per forward); ``scenario``
(scenario files, read and validated); ``check`` (a run, its snapshots, its diff and verdict against the
reference run, the matrix of cases); ``report`` (views of results and their renderers); ``sglang`` (the
installed SGLang as a serving stack, imported only when a run asks for it). The front doors sit on top:
``cli`` (``python -m harness``), ``plugin`` and ``collect`` (pytest), the options both share (``options``),
``bench`` (``python -m harness.bench``) with its rows (``bench_rows``), ``gpuci`` (``python -m
harness.gpuci``: the steps of ``make test-gpu``).

Scenarios are loaded with ``harness.scenario.load_scenario``, ``harness.check.case.cases`` gives a
scenario's runs, and ``harness.check.verdict.judge`` compares a run with its reference.
"""
