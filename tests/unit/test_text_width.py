"""The terminal layouts of ``list``: tables narrowed to a width, records of fields packed onto lines."""

from __future__ import annotations

from harness.report.text import record, table


def test_a_table_wider_than_its_width_wraps_its_widest_cells_after_separators_and_keeps_the_first_column():
    rows = [("swa_decode_a_long_scenario_name", "one,two,three,four,five,six", "SGLang PR 1; SGLang PR 2; PR 3")]
    text = table(("scenario", "list", "references"), rows, width=60)
    lines = text.splitlines()
    assert max(map(len, lines)) <= 60 and len(lines) > 2
    assert lines[1].startswith("swa_decode_a_long_scenario_name  ")  # a name is never cut
    assert all(line.startswith(" " * 33) for line in lines[2:])  # continuation lines leave it blank
    assert "".join(line[33:].split("  ")[0].strip() for line in lines[1:]) == "one,two,three,four,five,six"
    assert table(("a", "b"), [("x", "y")], width=60) == table(("a", "b"), [("x", "y")])  # narrow enough already


def test_a_record_packs_its_fields_onto_indented_lines_and_wraps_a_long_value():
    text = record("swa_x", [("tags", "decode,fault"), ("faults", ""), ("why", "word; " * 40)], width=50)
    name, first, *rest = text.splitlines()
    assert name == "swa_x" and first == "    tags: decode,fault"  # the empty field is left out
    assert rest[0].startswith("    why: word;") and all(line.startswith("    ") for line in rest)
    assert max(map(len, text.splitlines())) <= 50
    assert " ".join(line.strip() for line in rest) == "why: " + ("word; " * 40).strip()
