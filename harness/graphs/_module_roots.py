"""Module-level state of the code under test, as roots of the input audit.

The audit names a graph input by the attribute path that held it, from the roots the caller
passes (the pool, the backend, the runner, the model).  State kept in a module's globals (a
tensor a design or backend keeps between calls, refreshed only by the eager path) is reachable
from none of them.  ``module_roots`` gives the modules that define the code under test as more
roots, named by the module, so such a tensor is named ``module.attr``.  The audit walks them
after every object root, so a tensor an object also holds keeps the object's name.
"""

from __future__ import annotations

import functools
import sys
import types
from typing import Any

__all__ = ["module_roots"]

_OWN_PACKAGE = __name__.rpartition(".")[0]
_NOT_UNDER_TEST = frozenset({"builtins", "torch", "numpy", "typing", *sys.stdlib_module_names})


def module_roots(*under_test: Any) -> dict[str, types.ModuleType]:
    """``{module name: module}`` for the modules defining each function, class or instance (its class and bases).

    Standard-library, torch and numpy modules are left out, and so is the graph machinery itself.
    """
    found: dict[str, types.ModuleType] = {}
    for obj in under_test:
        for name in _defining_modules(obj):
            top = name.partition(".")[0]
            if top in _NOT_UNDER_TEST or name == _OWN_PACKAGE or name.startswith(_OWN_PACKAGE + "."):
                continue
            module = sys.modules.get(name)
            if isinstance(module, types.ModuleType):
                found.setdefault(name, module)
    return found


def _defining_modules(obj: Any) -> list[str]:
    while isinstance(obj, (types.MethodType, functools.partial)):
        obj = obj.__func__ if isinstance(obj, types.MethodType) else obj.func
    if isinstance(obj, (types.FunctionType, types.BuiltinFunctionType)):
        return [getattr(obj, "__module__", None) or ""]
    cls = obj if isinstance(obj, type) else type(obj)
    return [getattr(klass, "__module__", "") for klass in cls.__mro__]
