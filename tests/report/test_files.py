"""Report files are written whole (atomically), with the mode the user's umask gives (not mkstemp's 0600),
and only inside their report folder."""

import os
import stat

import pytest

from harness.report.files import ReportFolder, ReportFolderError, unwritable, unwritable_folder, write_atomic
from harness.report.html import write_report


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


def test_a_pages_folder_swapped_for_a_link_after_the_check_is_refused_never_written_through(tmp_path):
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "victim.html").write_text("theirs")
    root = tmp_path / "rep"
    (root / "scenarios").mkdir(parents=True)
    assert unwritable_folder(root) is None
    with ReportFolder(root) as folder:
        (root / "scenarios").rmdir()  # swapped in between the check and the write
        (root / "scenarios").symlink_to(outside)
        with pytest.raises(ReportFolderError, match="not a folder of this report"):
            folder.write("scenarios/victim.html", "ours")
        folder.remove_stale()
    assert [p.name for p in outside.iterdir()] == ["victim.html"] and (outside / "victim.html").read_text() == "theirs"


def test_write_report_into_a_folder_whose_pages_are_a_link_writes_nothing_outside(tmp_path, sample_views):
    outside = tmp_path / "outside"
    outside.mkdir()
    root = tmp_path / "rep"
    root.mkdir()
    (root / "scenarios").symlink_to(outside)
    with pytest.raises(ReportFolderError):
        write_report(root, sample_views, environment={})
    assert list(outside.iterdir()) == []


def test_a_link_at_a_report_files_name_is_replaced_not_followed(tmp_path):
    target = tmp_path / "target.txt"
    target.write_text("theirs")
    root = tmp_path / "rep"
    root.mkdir()
    (root / "index.html").symlink_to(target)
    with ReportFolder(root) as folder:
        folder.write("index.html", "ours")
    assert target.read_text() == "theirs"
    assert not (root / "index.html").is_symlink() and (root / "index.html").read_text() == "ours"


@pytest.mark.parametrize("name", ["../x.html", "scenarios/../../x.html", "/etc/x.html", "scenarios/a/b.html",
                                  "scenarios/..", "..", "notes.txt", "scenarios/.x.html", "scenarios/x.js"])
def test_a_report_writes_only_its_own_file_names(tmp_path, name):
    with ReportFolder(tmp_path / "rep") as folder, pytest.raises(ReportFolderError, match="is not a report file"):
        folder.write(name, "x")
    assert [p.relative_to(tmp_path).as_posix() for p in tmp_path.rglob("*")] == ["rep"]


def test_stale_pages_go_and_everything_else_stays(tmp_path):
    root = tmp_path / "rep"
    (root / "scenarios" / "sub").mkdir(parents=True)
    for name in ("scenarios/old.html", "scenarios/notes.txt", "results.csv", "mine.html"):
        (root / name).write_text("x")
    with ReportFolder(root) as folder:
        folder.write("scenarios/new.html", "x")
        folder.write("index.html", "x")
        folder.remove_stale()
    assert sorted(p.relative_to(root).as_posix() for p in root.rglob("*")) == [
        "index.html", "mine.html", "scenarios", "scenarios/new.html", "scenarios/notes.txt", "scenarios/sub"]


def test_a_report_lands_whole_or_leaves_the_folder_as_it_was(tmp_path):
    root = tmp_path / "rep"
    root.mkdir()
    (root / "index.html").write_text("earlier")
    with pytest.raises(OSError), ReportFolder(root) as folder:
        folder.write("scenarios/a.html", "new page")
        folder.write("index.html", "new index")
        folder.remove_stale()
        raise OSError(28, "No space left on device")  # as the next write would fail on a full disk
    assert sorted(p.relative_to(root).as_posix() for p in root.rglob("*")) == ["index.html"]
    assert (root / "index.html").read_text() == "earlier"
    with pytest.raises(OSError), ReportFolder(tmp_path / "new" / "rep") as folder:
        folder.write("index.html", "x")
        raise OSError(28, "No space left on device")
    assert not (tmp_path / "new").exists()  # the folders this report created go with it


def test_a_page_written_twice_leaves_one_file_and_a_lone_surrogate_is_escaped(tmp_path):
    with ReportFolder(tmp_path / "rep") as folder:
        folder.write("index.html", "first")
        folder.write("index.html", "run \udcff")
    assert [p.name for p in (tmp_path / "rep").iterdir()] == ["index.html"]
    assert (tmp_path / "rep" / "index.html").read_text() == "run \\udcff"
