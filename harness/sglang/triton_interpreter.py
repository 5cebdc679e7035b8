"""SGLang's ``@triton.jit`` kernels run as SGLang wrote them on a CPU, in Triton's interpreter.

A Triton launch needs a GPU driver; ``triton.runtime.interpreter.InterpretedFunction`` runs the same kernel
body on CPU tensors, program by program, with Triton's own semantics for ``tl.load``/``tl.store`` masks,
``tl.arange`` and the reductions. ``interpreted(module, ...)`` swaps the named kernels of an SGLang module,
every other jit function of that module they may call (SGLang's helpers such as ``_load_token_ids``), and
every jit function of ``triton.language`` (``tl.cdiv``, ``tl.cumsum``, ...) for their interpreted forms for
the duration of a launch, and puts them back after: SGLang's own wrapper launches the kernel unchanged.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any


@contextmanager
def interpreted(module: Any, *kernel_names: str) -> Iterator[None]:
    """``module``'s kernels ``kernel_names`` (and the jit functions they may call) interpreted, for one launch."""
    import triton.language as tl
    from triton.runtime.interpreter import InterpretedFunction
    from triton.runtime.jit import JITFunction

    missing = [name for name in kernel_names if not isinstance(getattr(module, name, None), JITFunction)]
    if missing:
        # an SGLang release that renamed or un-jitted a kernel: say which, rather than launch a GPU kernel
        raise AttributeError(f"{module.__name__}: no @triton.jit kernel named {', '.join(missing)}")
    swapped = [(module, name, fn) for name, fn in vars(module).items() if isinstance(fn, JITFunction)]
    for lang in (tl, tl.standard, tl.math):
        swapped += [(lang, name, fn) for name, fn in vars(lang).items() if isinstance(fn, JITFunction)]
    for owner, name, fn in swapped:
        setattr(owner, name, InterpretedFunction(fn.fn))
    try:
        yield
    finally:
        for owner, name, fn in swapped:
            setattr(owner, name, fn)
