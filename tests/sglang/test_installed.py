"""The adapter's start-up checks: the supported version, the signatures it calls, torchvision's stand-in."""

import dataclasses

import pytest

from harness.sglang import installed


def test_the_installed_sglang_is_the_supported_version_and_every_signature_the_adapter_calls_exists():
    api = installed.load()
    assert api.version == installed.SUPPORTED_VERSION
    assert installed.signature_problems(api) == []


def test_a_missing_parameter_is_named_in_one_line_with_the_supported_version():
    api = installed.load()

    def narrower(size, page_size):  # SWAKVPool without size_swa and the rest
        return None

    problems = installed.signature_problems(dataclasses.replace(api, SWAKVPool=narrower))
    assert problems and problems[0].startswith("SWAKVPool takes no size_swa")


def test_another_version_fails_before_importing_with_the_make_target(monkeypatch):
    monkeypatch.setattr(installed, "installed_version", lambda: "0.5.22")
    monkeypatch.setattr(installed, "_loaded", None)
    with pytest.raises(installed.UnsupportedSGLang, match=r"supports sglang==0\.5\.23 only \(make sglang-venv\)"):
        installed.load()


def test_torchvision_is_a_stand_in_that_raises_when_called():
    installed.load()
    import torchvision.transforms as transforms

    assert "stand-in" in repr(transforms.InterpolationMode.BICUBIC)
    with pytest.raises(RuntimeError, match="stand-in under the harness's SGLang adapter"):
        transforms.Resize(8)


def test_the_invariant_checks_run_at_their_strict_level():
    installed.load()
    from sglang.srt.utils.invariants import InvariantCheckLevel, resolve_level

    assert resolve_level() == InvariantCheckLevel.STRICT
