"""The field names of a dataclass, looked up once per class.

``dataclasses.fields`` filters a class's field table into a new tuple at every call; the input audit, the
report's records and the results channel ask it of every object they meet (hundreds of thousands a run
library), always for the same few classes.
"""

from __future__ import annotations

import dataclasses
from functools import cache


@cache
def field_names(cls: type) -> tuple[str, ...] | None:
    """The names of dataclass ``cls``'s fields in order (``dataclasses.fields``), or None for any other class."""
    return tuple(f.name for f in dataclasses.fields(cls)) if dataclasses.is_dataclass(cls) else None
