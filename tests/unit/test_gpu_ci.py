"""GPU CI's CPU side: the refusal of a promised GPU, the plan, the engine-agreement check, worker pinning and
the FlashInfer JIT shapes. The GPU steps themselves need a GPU (docs/gpu.md lists what stays unverified)."""

import copy
import json
from pathlib import Path

import pytest

from harness.gpuci import __main__ as gpuci
from harness.gpuci.agree import compare_engines, main as agree_main
from harness.gpuci.jit import KernelShape, harness_kernel_shapes
from harness.gpuci.machine import Machine
from harness.gpuci.pinning import pin_worker, worker_device
from harness.gpuci.plan import Settings, ci_plan

ROOT = Path(__file__).resolve().parents[2]
GOLD = json.loads((ROOT / "tests/report/gold/tiny_wrong_window_record.json").read_text())
NO_GPU = Machine(python="3.11", torch="2.13.0+cpu", torch_cuda=None, flashinfer=None, driver=None, devices=(), gpus=())


def _results(path: Path, engine: str, verdicts: dict[str, str], *, complete: bool = True) -> Path:
    records = []
    for name, verdict in verdicts.items():
        r = copy.deepcopy(GOLD)
        r.update(name=name, engine=engine, verdict=verdict, device="cuda")
        records.append(r)
    path.write_text(json.dumps({"version": 1, "complete": complete, "environment": {}, "duration_s": 1.0,
                                "records": records}))
    return path


def test_a_promised_gpu_that_is_missing_fails_with_a_line_saying_so(tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("HARNESS_REQUIRE_GPU", "1")
    monkeypatch.setattr(gpuci, "probe", lambda: NO_GPU)
    assert gpuci.main(["--out", str(tmp_path)]) == 1
    out = capsys.readouterr().out
    assert "a GPU was promised (HARNESS_REQUIRE_GPU=1 or --require-gpu) but no CUDA device is visible" in out
    assert "| scenarios-cuda | skipped |" in (tmp_path / "summary.md").read_text()


def test_without_a_gpu_or_the_promise_every_gpu_step_skips_and_the_run_succeeds(tmp_path, capsys, monkeypatch):
    monkeypatch.delenv("HARNESS_REQUIRE_GPU", raising=False)
    monkeypatch.setattr(gpuci, "probe", lambda: NO_GPU)
    assert gpuci.main(["--out", str(tmp_path)]) == 0
    assert "no CUDA device visible: every GPU step skipped" in capsys.readouterr().out


def test_a_visible_gpu_on_which_no_gpu_test_ran_fails_the_run(tmp_path, capsys):
    junit = tmp_path / "t.xml"
    junit.write_text('<testsuites><testsuite tests="3" failures="0" errors="0" skipped="3"/></testsuites>')
    step = gpuci.Step(name="t", argv=("true",), timeout_s=30, junit=junit, gpu_tests=True)
    machine = Machine(python="3.11", torch="x", torch_cuda="12.8", flashinfer=None, driver="570", devices=("0: H",),
                      gpus=("0",))
    environment = gpuci.Step(name="environment", argv=(), timeout_s=1)
    assert gpuci.execute([environment, step], machine, out=tmp_path, total_timeout_s=60, require_gpu=True) == 1
    assert "no GPU test passed or failed" in capsys.readouterr().out


def test_a_step_past_its_limit_is_stopped_and_reported_timed_out(tmp_path):
    step = gpuci.Step(name="hang", argv=("sleep", "30"), timeout_s=0.5)
    assert gpuci._run(step, 0.5, None)[0] == "timed out"


def test_a_pytest_step_whose_shard_selects_nothing_passes_saying_so(tmp_path):
    step = gpuci.Step(name="t", argv=("sh", "-c", "exit 5"), timeout_s=30, junit=tmp_path / "t.xml")
    assert gpuci._run(step, 30, None) == ("passed", "no test selected")
    assert gpuci._run(gpuci.Step(name="t", argv=("sh", "-c", "exit 5"), timeout_s=30), 30, None)[0] == "failed"


def test_the_dry_run_lists_every_step_with_its_command(capsys, monkeypatch):
    monkeypatch.setattr(gpuci, "probe", lambda: NO_GPU)
    assert gpuci.main(["--dry-run", "--splits", "3", "--group", "2", "--out", "o"]) == 0
    out = capsys.readouterr().out
    names = [line.split(" ", 2)[1] for line in out.splitlines() if line[:1].isdigit()]
    assert names == ["environment", "jit", "gpu-tests", "graphs", "scenarios-cuda", "scenarios-tape", "agree"]
    assert "shard 2 of 3" in out and "--splits=3 --group=2" in out


def test_the_two_scenario_steps_select_the_same_runs_under_the_two_engines():
    steps = {s.name: s for s in ci_plan(Settings(out=Path("o"), gpus=("0", "1"), splits=4, group=3, keyword="x"))}
    cuda, tape = (list(steps[n].argv) for n in ("scenarios-cuda", "scenarios-tape"))
    differ = [(a, b) for a, b in zip(cuda, tape) if a != b]
    assert differ == [("--junitxml=o/scenarios-cuda.xml", "--junitxml=o/scenarios-tape.xml"),
                      ("--harness-engine=cuda", "--harness-engine=tape"),
                      ("--harness-report=o/scenarios-cuda", "--harness-report=o/scenarios-tape")]
    assert steps["scenarios-cuda"].env == {"HARNESS_WORKER_GPUS": "0,1"} and "-n" in cuda and "2" in cuda


def test_the_agreement_check_lists_each_disagreement_and_exits_1(tmp_path, capsys):
    cuda = _results(tmp_path / "c.json", "cuda", {"s[a-full-torch_native]": "diverge", "s[b-full-torch_native]": "match",
                                                  "s[c-full-torch_native]": "match"})
    tape = _results(tmp_path / "t.json", "tape", {"s[a-full-torch_native]": "match", "s[b-full-torch_native]": "match"})
    assert agree_main([str(cuda), str(tape)]) == 1
    assert capsys.readouterr().out.splitlines() == [
        "engines cuda and tape disagree on 2 of 3 runs:",
        "  s[a-full-torch_native]: cuda diverge, tape match",
        "  s[c-full-torch_native]: cuda match, tape missing"]


def test_the_agreement_check_passes_identical_verdicts(tmp_path):
    verdicts = {"s[a-full-torch_native]": "diverge", "s[b-eager-torch_native]": "match"}
    agreement = compare_engines(_results(tmp_path / "c.json", "cuda", verdicts),
                                _results(tmp_path / "t.json", "tape", verdicts))
    assert agreement.ok and agreement.lines() == ["engines cuda and tape agree on all 2 verdicts"]


@pytest.mark.parametrize("second,complete,problem", [("cuda", True, "both runs of the cuda engine"),
                                                     ("tape", False, "the run stopped early")])
def test_the_agreement_check_refuses_files_that_cannot_be_compared(tmp_path, capsys, second, complete, problem):
    a = _results(tmp_path / "a.json", "cuda", {"s[a-full-torch_native]": "match"})
    b = _results(tmp_path / "b.json", second, {"s[a-full-torch_native]": "match"}, complete=complete)
    assert agree_main([str(a), str(b)]) == 2
    assert problem in capsys.readouterr().err


def test_each_xdist_worker_is_pinned_to_its_own_gpu_round_robin():
    assert [worker_device(f"gw{i}", ["3", "5"]) for i in range(4)] == ["3", "5", "3", "5"]
    env = {"HARNESS_WORKER_GPUS": "GPU-a,GPU-b", "PYTEST_XDIST_WORKER": "gw1"}
    assert pin_worker(env) == "GPU-b" and env["CUDA_VISIBLE_DEVICES"] == "GPU-b"
    untouched = {"PYTEST_XDIST_WORKER": "gw1"}
    assert pin_worker(untouched) is None and "CUDA_VISIBLE_DEVICES" not in untouched


@pytest.mark.slow
def test_xdist_workers_see_only_their_gpu_in_cuda_visible_devices(pytester, monkeypatch):
    # a real xdist run: the hook must act in the worker process, before its tests (and their children) start
    monkeypatch.setenv("HARNESS_WORKER_GPUS", "7,9")
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    pytester.makepyfile(test_seen="""
        import os
        def test_seen():
            print("SEEN", os.environ["PYTEST_XDIST_WORKER"], os.environ["CUDA_VISIBLE_DEVICES"])
            assert os.environ["CUDA_VISIBLE_DEVICES"] == {"gw0": "7", "gw1": "9"}[os.environ["PYTEST_XDIST_WORKER"]]
    """)
    # one worker: the round robin is the pure function's claim above; this one is that the hook acts in the worker
    result = pytester.runpytest_subprocess("-p", "harness.plugin", "-n", "1", "-p", "xdist")
    result.assert_outcomes(passed=1)


def test_the_jit_builds_one_module_per_kind_kv_dtype_and_window_group_present():
    shapes = harness_kernel_shapes([("bfloat16", 64, True, True), ("bfloat16", 64, True, False),
                                    ("float16", 128, True, False)])
    assert len(shapes) == 8 + 4
    assert KernelShape(kind="prefill", q_dtype="float16", kv_dtype="fp8_e4m3", head_dim=128, swa=True) in shapes
    assert not any(s.q_dtype == "float16" and not s.swa for s in shapes)  # that model has no full layer


def test_the_example_gpu_workflow_runs_make_test_gpu_per_shard_and_uploads_the_reports():
    # no YAML parser is a dependency: the workflow is checked as text, line by line
    text = (ROOT / ".github/workflows/gpu.yml").read_text()
    lines = [line.strip() for line in text.splitlines()]
    assert "runs-on: [self-hosted, linux, gpu]" in lines
    shards = next(line for line in lines if line.startswith("shard: ["))
    assert f"SPLITS: {len(shards.split(','))}" in lines and "GROUP: ${{ matrix.shard }}" in lines
    run = next(line for line in lines if line.startswith("run: make test-gpu"))
    assert "SPLITS=$SPLITS GROUP=$GROUP" in run
    # the Makefile turns SPLITS/GROUP into the options harness.gpuci has
    makefile = (ROOT / "Makefile").read_text()
    assert "--splits $(SPLITS) $(if $(GROUP),--group $(GROUP))" in makefile
    options = gpuci.build_parser()._option_string_actions
    assert {"--splits", "--group", "--total-timeout"} <= options.keys()
    cached = lines[lines.index("uses: actions/cache@v4") + 2]
    assert cached == "path: .cache/gpu" and "FLASHINFER_WORKSPACE_BASE ?= $(CURDIR)/.cache/gpu" in makefile
    assert "uses: actions/upload-artifact@v4" in lines
    assert {"reports/gpu/*.xml", "reports/gpu/scenarios-cuda/", "reports/gpu/scenarios-tape/"} <= set(lines)


@pytest.mark.slow
def test_the_bare_machine_check_without_a_gpu_fails_with_the_reason_and_writes_its_table(tmp_path):
    import os
    import subprocess
    import sys

    done = subprocess.run(["bash", str(ROOT / "scripts/gpu_check.sh"), str(tmp_path)], capture_output=True, text=True,
                          env={**os.environ, "PYTHON": sys.executable}, timeout=300)
    if "no CUDA device visible" not in done.stdout:
        pytest.skip("this machine has a GPU")
    assert done.returncode == 1
    assert "FAILED: no CUDA device visible to torch: this check needs a GPU" in done.stdout
    assert "| machine | failed | 0 | no CUDA device |" in (tmp_path / "results.md").read_text()
    assert "torch " in (tmp_path / "gpu_check.log").read_text()  # the environment block came first


@pytest.mark.parametrize("argv, problem", [
    (["--step-timeout", "jti=5"], "unknown step 'jti' (did you mean 'jit'?); known steps: jit, gpu-tests"),
    (["--step-timeout", "jit"], "expected STEP=SECONDS, got 'jit'"),
    (["--step-timeout", "agree=nan"], "agree: expected a positive, finite number of seconds, got 'nan'"),
    (["--total-timeout", "-1"], "--total-timeout: expected a positive, finite number of seconds, got '-1'"),
    (["--total-timeout", "inf"], "expected a positive, finite number of seconds, got 'inf'"),
    (["--test-timeout", "nan"], "--test-timeout: expected a positive, finite number of seconds, got 'nan'"),
    (["--test-timeout", "ten"], "expected a number of seconds, got 'ten'"),
])
def test_gpu_ci_refuses_a_limit_that_never_applies_with_one_line_and_exit_2(argv, problem, capsys):
    with pytest.raises(SystemExit) as stop:
        gpuci.main(argv)
    assert stop.value.code == 2
    err = capsys.readouterr().err
    assert problem in err and "Traceback" not in err


@pytest.mark.parametrize("where", ["file", "below_file", "dev_full"])
def test_gpu_ci_refuses_an_out_it_cannot_write_before_any_step(where, tmp_path, capsys, monkeypatch):
    monkeypatch.setattr(gpuci, "probe", lambda: pytest.fail("probed the machine before checking --out"))
    a_file = tmp_path / "results"
    a_file.write_text("")
    out = {"file": a_file, "below_file": a_file / "gpu", "dev_full": Path("/dev/full")}[where]
    with pytest.raises(SystemExit) as stop:
        gpuci.main(["--out", str(out)])
    assert stop.value.code == 2
    err = capsys.readouterr().err.strip().splitlines()[-1]
    assert err.startswith(f"python -m harness.gpuci: error: --out {out}: ") and "not a folder" in err


def test_gpu_ci_refuses_an_out_on_a_full_disk(tmp_path):
    # a file-size limit below the probe's write stands in for a full disk: the write fails with EFBIG
    import os
    import resource
    import subprocess
    import sys

    def limit() -> None:
        resource.setrlimit(resource.RLIMIT_FSIZE, (1024, 1024))

    # no bytecode written under the limit: a .pyc cut short there would break every later import of the module
    env = {**os.environ, "PYTHONDONTWRITEBYTECODE": "1"}
    done = subprocess.run([sys.executable, "-m", "harness.gpuci", "--out", str(tmp_path / "gpu")], cwd=ROOT,
                          capture_output=True, text=True, preexec_fn=limit, timeout=120, env=env)
    assert done.returncode == 2, done.stderr
    assert f"--out {tmp_path / 'gpu'}: cannot write in {tmp_path / 'gpu'} (File too large)" in done.stderr
    assert "Traceback" not in done.stderr
