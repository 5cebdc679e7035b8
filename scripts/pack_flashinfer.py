#!/usr/bin/env python3
"""Pack just what the harness's FlashInfer kernels need into one archive for a GPU machine with no network.

FlashInfer's wheel is about 100 MB (700 MB unpacked): the kernel sources of every backend it has, CUTLASS,
CCCL. The harness runs only the FA2 paged decode and prefill kernels (``harness/gpuci/jit.py`` lists the
shapes), which FlashInfer compiles on the machine from a few templates and the headers they include. The
pack holds:

* FlashInfer's Python side that the harness uses: the ``.py``, ``.json`` and ``py.typed`` files of every folder
  of the package from which ``import flashinfer`` and the generators below imported a module (a quarter of
  its Python code), without the other backends' ``.cu`` sources, prebuilt cubins, AOT libraries or docs;
* from ``flashinfer/data``: the files FlashInfer's own generators read to write the harness's modules
  (found by running them, on this CPU, under an audit hook that records every file opened) and the
  transitive ``#include`` closure of those and of the generated sources over FlashInfer's include folders;
* the pure-Python packages ``import flashinfer`` needs that a bare CUDA-torch machine lacks, tvm-ffi (whose
  compiled core matches one Python version, written into the manifest) and the ``ninja`` binary the JIT runs;
* ``MANIFEST.json``: versions, the Python tag, sizes, the file list.

Usage: ``python scripts/pack_flashinfer.py --out flashinfer-pack.tar.gz [--wheel flashinfer_python-X.whl]``
(from the checkout; the packages come from this environment, FlashInfer from the wheel where given). The
check (``scripts/gpu_check.sh``) unpacks it and puts ``site/`` on ``PYTHONPATH`` and ``bin/`` on ``PATH``.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import re
import shutil
import subprocess
import sys
import sysconfig
import tarfile
import tempfile
import zipfile
from collections.abc import Iterable
from pathlib import Path

LIMIT = 64 << 20
"""bytes: what a device run may carry beside the checkout"""
# what `import flashinfer` (0.7.x) imports that a machine with CUDA torch, pytest, pytest-xdist, pandas, Jinja2 and
# Hypothesis lacks: found by importing it with only those on sys.path; cutlass (the DSL) and cuda-python are
# imported only behind availability checks, so the harness's kernels run without them
RUNTIME_PACKAGES = ("tvm_ffi", "requests", "urllib3", "idna", "certifi", "charset_normalizer", "tqdm", "pynvml")
_PYTHON_SUFFIXES = {".py", ".json", ".typed"}
_INCLUDE = re.compile(r'^\s*#\s*include\s*[<"]([^>"]+)[>"]', re.M)
_DATA_INCLUDE_DIRS = ("include", "csrc", "cutlass/include", "cutlass/tools/util/include", "spdlog/include",
                      "cccl/cub", "cccl/libcudacxx/include", "cccl/thrust")
"""FlashInfer's include folders under ``flashinfer/data`` (``jit/env.py``), in its search order"""


def python_files(package: Path, imported: Iterable[Path]) -> list[Path]:
    """The package's Python side the harness uses: every .py/.json/py.typed of each folder from which a module
    was imported (its siblings too, for the imports a kernel call makes later), none from ``data/``."""
    package = package.resolve()
    folders = {Path(p).resolve().parent for p in imported} | {package}
    out = []
    for folder in sorted(f for f in folders if f.is_relative_to(package)):
        if folder.relative_to(package).parts[:1] == ("data",):
            continue
        out += [p for p in sorted(folder.iterdir()) if p.is_file() and p.suffix in _PYTHON_SUFFIXES]
    return out


def include_closure(roots: Iterable[Path], include_dirs: list[Path]) -> set[Path]:
    """``roots`` and every file they include, transitively, that resolves in ``include_dirs`` (a quoted include
    first beside its includer); an include found nowhere (the CUDA toolkit's own headers) is left to the machine."""
    seen: set[Path] = set()
    todo = [Path(r).resolve() for r in roots]
    while todo:
        path = todo.pop()
        if path in seen or not path.is_file():
            continue
        seen.add(path)
        try:
            text = path.read_text(errors="replace")
        except OSError:
            continue
        for name in _INCLUDE.findall(text):
            for base in (path.parent, *include_dirs):
                candidate = (base / name).resolve()
                if candidate.is_file():
                    todo.append(candidate)
                    break
    return seen


def data_selection(package: Path, read_by_generators: Iterable[Path], generated: Iterable[Path]) -> set[Path]:
    """The files of ``package/data`` the JIT needs: what the generators read, and the include closure of that and
    of the sources they generated."""
    data = (package / "data").resolve()
    include_dirs = [data / d for d in _DATA_INCLUDE_DIRS if (data / d).is_dir()]
    roots = [Path(p).resolve() for p in read_by_generators]
    closure = include_closure([*roots, *generated], include_dirs)
    return {p for p in closure if p.is_relative_to(data)}


_PROBE = r"""
import json, os, sys
opened = set()
def hook(event, args):
    if event == "open" and isinstance(args[0], (str, bytes, os.PathLike)):
        opened.add(os.fsdecode(args[0]))
sys.addaudithook(hook)
import flashinfer
from harness.gpuci.jit import _jit_specs, _library_models, harness_kernel_shapes
specs = _jit_specs(harness_kernel_shapes(_library_models()))
imported = [m.__file__ for n, m in list(sys.modules.items()) if n.split(".")[0] == "flashinfer"
            and getattr(m, "__file__", None)]
json.dump({"package": os.path.dirname(flashinfer.__file__), "version": flashinfer.__version__,
           "opened": sorted(opened), "imported": sorted(imported), "generated": sorted(str(s) for spec in specs for s in spec.sources),
           "modules": [spec.name for spec in specs]}, sys.stdout)
"""


def probe_generators(checkout: Path, flashinfer_path: Path | None, arch: str) -> dict:
    """Run FlashInfer's generators for the harness's shapes (no GPU: the target architecture is given) and report
    the package, its version, the files they opened and the sources they wrote."""
    with tempfile.TemporaryDirectory() as workspace:
        paths = [str(checkout), *([str(flashinfer_path)] if flashinfer_path else []), os.environ.get("PYTHONPATH", "")]
        env = {**os.environ, "FLASHINFER_WORKSPACE_BASE": workspace, "FLASHINFER_CUDA_ARCH_LIST": arch,
               "PYTHONPATH": os.pathsep.join(p for p in paths if p)}
        done = subprocess.run([sys.executable, "-c", _PROBE], env=env, capture_output=True, text=True, timeout=600)
        if done.returncode != 0:  # the probe's last line says what; its traceback is FlashInfer's business
            last = (done.stderr.strip().splitlines() or ["no output"])[-1]
            raise SystemExit(f"FlashInfer's generators failed ({last}); run {sys.executable} -c 'import flashinfer' "
                             "to see why")
        return json.loads(done.stdout)


def _package_dir(name: str) -> Path:
    spec = importlib.util.find_spec(name)
    if spec is None or spec.origin is None:
        raise SystemExit(f"{name} is not installed here: install it to pack it")
    origin = Path(spec.origin)
    return origin.parent if origin.name == "__init__.py" else origin


def _runtime_files(name: str) -> list[tuple[Path, str]]:
    root = _package_dir(name)
    if root.is_file():
        return [(root, f"site/{root.name}")]
    return [(p, f"site/{name}/{p.relative_to(root)}") for p in sorted(root.rglob("*"))
            if p.is_file() and "__pycache__" not in p.parts]


def _ninja() -> Path:
    found = shutil.which("ninja") or shutil.which("ninja", path=sysconfig.get_path("scripts"))
    if found is None:
        raise SystemExit("no ninja binary here (pip install ninja): FlashInfer's JIT runs it")
    return Path(found)


def pack(out: Path, *, checkout: Path, wheel: Path | None, arch: str, limit: int = LIMIT) -> dict:
    """Write the archive; its manifest."""
    with tempfile.TemporaryDirectory() as tmp:
        flashinfer_path = None
        if wheel is not None:
            flashinfer_path = Path(tmp) / "wheel"
            with zipfile.ZipFile(wheel) as z:
                z.extractall(flashinfer_path)
        probe = probe_generators(checkout, flashinfer_path, arch)
        package = Path(probe["package"])
        opened = [Path(p) for p in probe["opened"]]
        root = package.resolve()
        entries = [(p, f"site/flashinfer/{p.relative_to(root)}") for p in python_files(package, probe["imported"])]
        data = data_selection(package, [p for p in opened if p.resolve().is_relative_to((package / "data").resolve())],
                              [Path(p) for p in probe["generated"]])
        entries += [(p, f"site/flashinfer/{p.relative_to(package.resolve())}") for p in sorted(data)]
        for name in RUNTIME_PACKAGES:
            entries += _runtime_files(name)
        entries.append((_ninja(), "bin/ninja"))
        manifest = {"flashinfer": probe["version"], "python": f"cp{sys.version_info.major}{sys.version_info.minor}",
                    "platform": sysconfig.get_platform(), "cuda_arch": arch, "modules": probe["modules"],
                    "files": len(entries), "unpacked_bytes": sum(p.stat().st_size for p, _ in entries)}
        manifest_path = Path(tmp) / "MANIFEST.json"
        manifest_path.write_text(json.dumps(manifest, indent=1) + "\n")
        out.parent.mkdir(parents=True, exist_ok=True)
        with tarfile.open(out, "w:gz", compresslevel=6) as tar:
            tar.add(manifest_path, arcname="MANIFEST.json")
            for path, arcname in entries:
                tar.add(path, arcname=arcname)
    manifest["archive_bytes"] = out.stat().st_size
    if manifest["archive_bytes"] > limit:
        raise SystemExit(f"{out}: {manifest['archive_bytes']} bytes, more than the {limit >> 20} MiB a device run "
                         "may carry")
    return manifest


_ARCH = re.compile(r"\d{1,3}\.\d[af]?")
"""one entry of FLASHINFER_CUDA_ARCH_LIST: major.minor, optionally a (arch-specific) or f (family) features"""


def _arch_list(text: str) -> str:
    entries = text.replace(",", " ").split()
    bad = [e for e in entries if not _ARCH.fullmatch(e)]
    if not entries or bad:
        raise argparse.ArgumentTypeError(f"expected CUDA architectures like '9.0' or '8.0 9.0a', got {text!r}")
    return " ".join(entries)


def wheel_problem(wheel: Path) -> str | None:
    """Why ``wheel`` is not a FlashInfer wheel to pack from; None when it is one."""
    if not wheel.is_file():
        return f"--wheel {wheel}: no such file"
    if not zipfile.is_zipfile(wheel):
        return f"--wheel {wheel}: not a wheel (not a zip archive)"
    try:
        with zipfile.ZipFile(wheel) as z:
            names = set(z.namelist())
    except (OSError, zipfile.BadZipFile) as exc:
        return f"--wheel {wheel}: unreadable ({exc})"
    if "flashinfer/__init__.py" not in names:
        return f"--wheel {wheel}: holds no flashinfer package (flashinfer/__init__.py); a flashinfer-python wheel?"
    return None


def environment_problems(wheel: Path | None) -> list[str]:
    """What this environment lacks to pack (FlashInfer where no wheel is given, the runtime packages, ninja),
    before the generators run for a minute and fail on it."""
    out = []
    if wheel is None and importlib.util.find_spec("flashinfer") is None:
        out.append("flashinfer-python is not installed here: install it (make test-gpu's extra gpu) or give --wheel")
    out += [f"{name} is not installed here: install it to pack it" for name in RUNTIME_PACKAGES
            if importlib.util.find_spec(name) is None]
    if shutil.which("ninja") is None and shutil.which("ninja", path=sysconfig.get_path("scripts")) is None:
        out.append("no ninja binary here (pip install ninja): FlashInfer's JIT runs it")
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="scripts/pack_flashinfer.py", description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=Path("flashinfer-pack.tar.gz"), help="the archive to write")
    parser.add_argument("--wheel", type=Path, help="a downloaded flashinfer-python wheel (default: the installed one)")
    parser.add_argument("--arch", type=_arch_list, default="9.0",
                        help="FLASHINFER_CUDA_ARCH_LIST for the generators (9.0: H100/H200)")
    args = parser.parse_args(argv)
    checkout = Path(__file__).resolve().parents[1]
    sys.path.insert(0, str(checkout))
    from harness.gpuci.options import output_file_problem

    if (problem := output_file_problem(args.out)) is not None:
        parser.error(problem)
    if args.wheel is not None and (problem := wheel_problem(args.wheel)) is not None:
        parser.error(problem)
    if problems := environment_problems(args.wheel):
        for line in problems:
            print(f"{parser.prog}: {line}", file=sys.stderr)
        return 1
    try:
        manifest = pack(args.out, checkout=checkout, wheel=args.wheel, arch=args.arch)
    except OSError as exc:  # a full disk or a file-size limit while writing the archive
        print(f"{parser.prog}: writing {args.out} failed: {exc.strerror or exc}", file=sys.stderr)
        args.out.unlink(missing_ok=True)
        return 1
    print(f"{args.out}: {manifest['archive_bytes'] / 2**20:.1f} MiB ({manifest['unpacked_bytes'] / 2**20:.1f} MiB "
          f"unpacked, {manifest['files']} files), flashinfer {manifest['flashinfer']}, {manifest['python']}, "
          f"{len(manifest['modules'])} kernel modules")
    return 0


if __name__ == "__main__":
    sys.exit(main())
