"""The installed SGLang (0.5.23) as a serving stack, and the pieces that check the miniature against it.

Nothing here imports ``sglang`` at module level: ``installed.load()`` does, once, when a run or a test asks
for it. The default install has no SGLang; ``make sglang-venv`` builds ``.venv-sglang`` with it.

A target: ``target.register`` adds the SGLang stack and the faults on SGLang's code to the harness's
registries, called through the ``harness.targets`` entry point (pyproject.toml); nothing below this package
names it.
"""
