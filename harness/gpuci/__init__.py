"""GPU CI: the steps of ``make test-gpu`` (``python -m harness.gpuci``), the tape-versus-cuda verdict check,
FlashInfer's JIT build and the pinning of pytest-xdist workers to GPUs.

A front door like ``bench``: it sits on top of the run machinery and imports it only in the steps that need it,
so the plan, its dry run and the refusal of a promised but missing GPU run on any machine.
"""
