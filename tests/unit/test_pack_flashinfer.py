"""scripts/pack_flashinfer.py's selection, on a fake FlashInfer tree: the Python folders imported from, from
``data/`` only what the generators read and what that includes, transitively; never another backend's
sources, cubins or docs."""

import importlib.util
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
_spec = importlib.util.spec_from_file_location("pack_flashinfer", ROOT / "scripts/pack_flashinfer.py")
pack = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(pack)


def _tree(root: Path, files: dict[str, str]) -> Path:
    for name, text in files.items():
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_text(text)
    return root


def test_the_pack_takes_the_include_closure_of_what_the_generators_read_and_nothing_else(tmp_path):
    fi = _tree(tmp_path / "flashinfer", {
        "__init__.py": "", "decode.py": "", "catalog.json": "{}", "py.typed": "",
        "experimental/big_kernel.cu": "// another backend's own source",
        "experimental/__init__.py": "", "attention/__init__.py": "", "attention/planner.py": "",
        "data/csrc/batch_decode.cu": '#include "batch_decode_config.inc"\n#include <flashinfer/attention/decode.cuh>\n'
                                     "#include <cuda_runtime.h>\n",
        "data/csrc/batch_decode_config.inc": "",
        "data/csrc/batch_decode_customize_config.jinja": "{{ body }}",
        "data/csrc/fused_moe.cu": "#include <cutlass/gemm.h>\n",
        "data/include/flashinfer/attention/decode.cuh": '#include "../utils.cuh"\n',
        "data/include/flashinfer/utils.cuh": "#include <cutlass/numeric_types.h>\n",
        "data/cutlass/include/cutlass/numeric_types.h": "",
        "data/cutlass/include/cutlass/gemm.h": "",
        "data/aot/decode.so": "prebuilt", "data/cubins/k.cubin": "prebuilt",
        "docs/index.md": "",
    })
    generated = _tree(tmp_path / "gen", {"batch_decode_kernel.cu": "#include <flashinfer/utils.cuh>\n"})
    read = [fi / "data/csrc/batch_decode.cu", fi / "data/csrc/batch_decode_customize_config.jinja"]
    data = {p.relative_to(fi.resolve()).as_posix() for p in pack.data_selection(fi, read, [generated / "batch_decode_kernel.cu"])}
    assert data == {"data/csrc/batch_decode.cu", "data/csrc/batch_decode_config.inc",
                    "data/csrc/batch_decode_customize_config.jinja", "data/include/flashinfer/attention/decode.cuh",
                    "data/include/flashinfer/utils.cuh", "data/cutlass/include/cutlass/numeric_types.h"}
    imported = [fi / "__init__.py", fi / "decode.py", fi / "attention/__init__.py"]
    python = {p.relative_to(fi.resolve()).as_posix() for p in pack.python_files(fi, imported)}
    # a folder nothing was imported from (another backend's) is left out whole; siblings of an import come along
    assert python == {"__init__.py", "decode.py", "catalog.json", "py.typed", "attention/__init__.py",
                      "attention/planner.py"}


def test_an_include_cycle_ends(tmp_path):
    files = _tree(tmp_path, {"a.h": '#include "b.h"\n', "b.h": '#include "a.h"\n'})
    assert pack.include_closure([files / "a.h"], []) == {(files / "a.h").resolve(), (files / "b.h").resolve()}


def _refusal(argv: list[str], capsys) -> str:
    import pytest

    with pytest.raises(SystemExit) as stop:
        pack.main(argv)
    assert stop.value.code == 2
    err = capsys.readouterr().err
    assert "Traceback" not in err
    return err.strip().splitlines()[-1]


def test_the_packer_refuses_a_missing_or_junk_wheel_in_one_line(tmp_path, capsys):
    import zipfile

    assert _refusal(["--wheel", str(tmp_path / "none.whl")], capsys).endswith("none.whl: no such file")
    junk = tmp_path / "junk.whl"
    junk.write_bytes(b"not a zip")
    assert _refusal(["--wheel", str(junk)], capsys).endswith("not a wheel (not a zip archive)")
    other = tmp_path / "other-1.0-py3-none-any.whl"
    with zipfile.ZipFile(other, "w") as z:
        z.writestr("other/__init__.py", "")
    assert "holds no flashinfer package" in _refusal(["--wheel", str(other)], capsys)


def test_the_packer_refuses_an_out_or_arch_it_cannot_use(tmp_path, capsys):
    (tmp_path / "a_file").write_text("")
    assert _refusal(["--out", str(tmp_path)], capsys).endswith("is a folder; name the file to write")
    assert _refusal(["--out", "/dev/full"], capsys).endswith("/dev/full: is not a regular file")
    assert "is not a folder" in _refusal(["--out", str(tmp_path / "a_file" / "pack.tgz")], capsys)
    assert "expected CUDA architectures like '9.0'" in _refusal(["--arch", "sm90"], capsys)
    assert pack._arch_list("8.0, 9.0a 10.0f") == "8.0 9.0a 10.0f"


def test_the_packer_names_what_this_environment_lacks_before_running_the_generators(monkeypatch, tmp_path, capsys):
    monkeypatch.setattr(pack.importlib.util, "find_spec", lambda name: None)
    assert pack.main(["--out", str(tmp_path / "p.tgz")]) == 1
    err = capsys.readouterr().err
    assert "flashinfer-python is not installed here: install it" in err and "or give --wheel" in err
    assert "tvm_ffi is not installed here" in err and "Traceback" not in err
