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
