"""``-k`` expressions on the CLI select as pytest's do: substrings of any name, ignoring case, joined by
``not``, ``and``, ``or`` (tightest first) and parentheses."""

from __future__ import annotations

import re

import pytest

from harness.cli.keywords import KeywordError, Keywords

NAMES = ("swa_decode_pad_tail_not_zeroed[forward_batch-full-torch_native]", "decode", "padding", "fault",
         "swa_decode_pad_tail_not_zeroed.toml", "faults")


@pytest.mark.parametrize("expr, selected", [
    ("", True),
    ("PADDING", True),
    ("forward_batch-full", True),
    ("torch_native]", True),
    ("prefill", False),
    ("not prefill", True),
    ("prefill or decode and padding", True),  # and binds tighter: prefill or (decode and padding)
    ("(prefill or decode) and not padding", False),
    ("not not fault", True),
    ("prefill and decode or full", True),
])
def test_an_expression_selects_as_pytest_k_does(expr, selected):
    assert Keywords(expr).matches(NAMES) is selected


@pytest.mark.parametrize("expr, problem", [
    ("decode and", "expected a word, 'not' or '(' at the end"),
    ("(decode", "expected ')' at the end"),
    ("decode padding", "expected an operator or the end at column 8, got 'padding'"),
    ("decode & padding", "unexpected character '&' at column 8"),
])
def test_a_bad_expression_says_where_and_what_was_expected(expr, problem):
    with pytest.raises(KeywordError, match=re.escape(problem)):
        Keywords(expr)
