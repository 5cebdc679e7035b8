"""The installed SGLang (0.5.23) as a serving stack, and the pieces that check the miniature against it.

Nothing here imports ``sglang`` at module level: ``installed.load()`` does, once, when a run or a test asks
for it. The default install has no SGLang; ``make sglang-venv`` builds ``.venv-sglang`` with it.
"""
