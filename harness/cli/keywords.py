"""``-k EXPR`` for ``python -m harness run``: pytest's keyword grammar, so one expression selects the same runs
under the CLI as under pytest.

An expression is words joined by ``and``, ``or``, ``not`` and parentheses; a word matches a run when it is
a substring, ignoring case, of one of the run's names: the run name (``scenario[design-mode-backend]``),
the scenario's tags, its file name and the folder holding it. Words take the characters pytest's do
(letters, digits, ``_ : + - . [ ] \\ /``), so ``-k "forward_batch-full"`` selects one design in one mode.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable
from dataclasses import dataclass

_TOKEN = re.compile(r"\s*(?:(\()|(\))|([\w:+\-.\[\]\\/]+)|(\S))")
_OPERATORS = ("and", "or", "not")

Matcher = Callable[[str], bool]
"""whether one word of the expression matches the run"""


class KeywordError(ValueError):
    """An expression that does not parse: the message says where and what was expected."""


@dataclass(frozen=True, slots=True)
class Keywords:
    """A parsed ``-k`` expression."""

    text: str

    def __post_init__(self) -> None:
        _Parser(self.text).parse(lambda _word: True)  # refuses a bad expression where it is written

    def matches(self, names: Iterable[str]) -> bool:
        """Whether the run with these names is selected."""
        lowered = [n.lower() for n in names]
        return _Parser(self.text).parse(lambda word: any(word.lower() in n for n in lowered))


class _Parser:
    """Recursive descent over ``expr := and ('or' and)*; and := not ('and' not)*; not := 'not' not | '(' expr ')'
    | word``, evaluating as it goes (expressions are a few words long)."""

    def __init__(self, text: str) -> None:
        self.text = text
        self.tokens: list[tuple[str, str, int]] = []
        for m in _TOKEN.finditer(text):
            if m.group(4) is not None:
                raise KeywordError(f"-k {text!r}: unexpected character {m.group(4)!r} at column {m.start(4) + 1}")
            kind = "(" if m.group(1) else ")" if m.group(2) else "word"
            value = m.group(3) or kind
            if kind == "word" and value in _OPERATORS:
                kind = value
            self.tokens.append((kind, value, m.start() + len(m.group(0)) - len(value) + 1))
        self.at = 0

    def parse(self, match: Matcher) -> bool:
        self.at = 0
        if not self.tokens:
            return True  # an empty expression selects everything, as under pytest
        value = self._or(match)
        if self.at < len(self.tokens):
            self._fail("an operator or the end")
        return value

    def _peek(self) -> str | None:
        return self.tokens[self.at][0] if self.at < len(self.tokens) else None

    def _fail(self, wanted: str) -> None:
        if self.at < len(self.tokens):
            _, value, column = self.tokens[self.at]
            raise KeywordError(f"-k {self.text!r}: expected {wanted} at column {column}, got {value!r}")
        raise KeywordError(f"-k {self.text!r}: expected {wanted} at the end")

    def _or(self, match: Matcher) -> bool:
        value = self._and(match)
        while self._peek() == "or":
            self.at += 1
            value = self._and(match) or value
        return value

    def _and(self, match: Matcher) -> bool:
        value = self._not(match)
        while self._peek() == "and":
            self.at += 1
            value = self._not(match) and value
        return value

    def _not(self, match: Matcher) -> bool:
        kind = self._peek()
        if kind == "not":
            self.at += 1
            return not self._not(match)
        if kind == "(":
            self.at += 1
            value = self._or(match)
            if self._peek() != ")":
                self._fail("')'")
            self.at += 1
            return value
        if kind == "word":
            word = self.tokens[self.at][1]
            self.at += 1
            return match(word)
        self._fail("a word, 'not' or '('")
        raise AssertionError("unreachable")
