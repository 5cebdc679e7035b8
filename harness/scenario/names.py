"""Scenario names that look the same are the same name.

A scenario's name is its file's stem, and it names pytest items, report pages and rows. Two files whose
names differ only by Unicode normalization (``swa_café`` written with a precomposed ``é`` and with ``e``
plus a combining accent) or by a look-alike letter (a Cyrillic ``о`` in ``swa_decode_pad_tail_not_zeroed``)
would load as two scenarios that look identical everywhere they are shown. Names are normalized to NFC,
and a name whose skeleton (NFKC, then each letter that is drawn like a Latin one replaced by it, in the
spirit of Unicode TS #39's confusable skeletons) equals an existing name's is refused.
"""

from __future__ import annotations

import unicodedata

# Letters of other scripts drawn like a Latin letter or digit in common fonts (a subset of Unicode's
# confusables.txt: the Cyrillic and Greek letters that pass for Latin ones).
_LOOK_ALIKES = str.maketrans({
    # Cyrillic
    "а": "a", "е": "e", "һ": "h", "і": "i", "ј": "j", "к": "k", "ӏ": "l", "о": "o", "р": "p", "ԛ": "q",
    "ѕ": "s", "у": "y", "ԝ": "w", "х": "x", "ԁ": "d", "ь": "b", "А": "A", "В": "B", "Е": "E", "Н": "H",
    "І": "I", "Ј": "J", "К": "K", "М": "M", "О": "O", "Р": "P", "Ѕ": "S", "Т": "T", "Х": "X", "У": "Y",
    "С": "C", "с": "c", "Ү": "Y", "ү": "y", "Ԛ": "Q", "Ԝ": "W",
    # Greek
    "α": "a", "β": "b", "ε": "e", "ι": "i", "κ": "k", "ν": "v", "ο": "o", "ρ": "p", "υ": "u", "χ": "x",
    "γ": "y", "Α": "A", "Β": "B", "Ε": "E", "Ζ": "Z", "Η": "H", "Ι": "I", "Κ": "K", "Μ": "M", "Ν": "N",
    "Ο": "O", "Ρ": "P", "Τ": "T", "Υ": "Y", "Χ": "X",
})


def scenario_name(stem: str) -> str:
    """The name of the scenario in a file with this stem: the stem in NFC."""
    return unicodedata.normalize("NFC", stem)


def skeleton(name: str) -> str:
    """What ``name`` looks like: compatibility forms folded (full-width letters), look-alikes made Latin."""
    return unicodedata.normalize("NFKC", name).translate(_LOOK_ALIKES)


def look_alike_note(name: str, other: str) -> str:
    """Why ``name`` looks like ``other``: the first character that differs, by its Unicode name."""
    for i, (a, b) in enumerate(zip(name, other)):
        if a != b:
            return (f"its character {i + 1} is {_describe(a)} where the other has {_describe(b)}")
    return "they differ only in compatibility forms"


def _describe(ch: str) -> str:
    return f"U+{ord(ch):04X} {unicodedata.name(ch, 'an unnamed character')} ({ch!r})"
