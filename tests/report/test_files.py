"""Report files are written whole (atomically) and with the mode the user's umask gives, not mkstemp's 0600."""

import os
import stat

from harness.report.files import unwritable, write_atomic


def test_a_report_file_gets_the_users_normal_mode(tmp_path):
    old = os.umask(0o022)
    try:
        write_atomic(tmp_path / "r.json", "{}")
    finally:
        os.umask(old)
    assert stat.S_IMODE((tmp_path / "r.json").stat().st_mode) == 0o644
    assert [p.name for p in tmp_path.iterdir()] == ["r.json"]  # no temporary file left behind


def test_a_destination_is_judged_before_a_run(tmp_path):
    assert unwritable(tmp_path / "new" / "deeper" / "r.json") is None
    assert unwritable(tmp_path) == "is a directory; name a file"
    (tmp_path / "file").write_text("")
    assert unwritable(tmp_path / "file" / "r.json") == f"{tmp_path / 'file'} is not a directory"
