"""``python -m harness.fuzz.campaign_run``: one HypoFuzz campaign on ``campaign.py`` for a time budget
(``make fuzz-campaign``).

HypoFuzz runs until it is stopped, or until every test it fuzzes has failed. At the budget the whole process
group (the hub and its workers) gets the interrupt a ctrl-C sends, then has ``GRACE_S`` to end before it is
killed. The campaign succeeds (exit 0) when it ends at its budget or on a failure of the property, which
HypoFuzz has then shrunk and saved in the example database for ``python -m harness fuzz`` to replay. It fails
(exit 2) when HypoFuzz itself breaks: it ends for another reason, or a traceback other than the ones its own
shutdown prints (a worker whose pipe to the hub closed first) shows in its output.
"""

from __future__ import annotations

import argparse
import os
import re
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from .target import FuzzTarget

TARGET_VARIABLE = "HARNESS_FUZZ_TARGET"
CAMPAIGN = Path(__file__).with_name("campaign.py")
GRACE_S = 30.0
ALL_FAILED = "Found a failing input for every test!"
"""what HypoFuzz prints when it stops on its own because every test it fuzzes has failed"""
SHUTDOWN_ERRORS = ("BrokenPipeError", "ConnectionResetError", "EOFError", "KeyboardInterrupt")
"""how a traceback printed while HypoFuzz stops ends: its worker processes lose the hub's pipe or are interrupted"""


@dataclass(frozen=True, slots=True, kw_only=True)
class CampaignResult:
    stopped: str
    """"budget", "failure" (every test failed) or "crash\""""
    returncode: int
    elapsed_s: float
    crashes: tuple[str, ...]
    """the last line of each traceback HypoFuzz printed that its shutdown does not explain"""

    @property
    def ok(self) -> bool:
        return self.stopped != "crash" and not self.crashes


def crashes(output: str) -> tuple[str, ...]:
    """The last line of every traceback in ``output`` that does not end in one of ``SHUTDOWN_ERRORS``.

    The hub and its workers write to one pipe, so two tracebacks printed at once interleave line by line: a
    traceback's header may be followed by another's before its own frames. Each exception line (unindented,
    ``Name`` or ``Name: message``) ends the earliest traceback still open, whichever process printed it: which
    one it ends does not change which exceptions were raised. Other unindented lines (another traceback's
    header, multiprocessing's ``Process Process-1:`` banner, chained tracebacks' "During handling ...") end
    none; a traceback the output stops inside ends in nothing, and counts."""
    found = []
    open_ = 0
    for line in output.splitlines():
        if line.startswith(_HEADER):
            open_ += 1
        elif open_ and _EXCEPTION_LINE.match(line):
            open_ -= 1
            if not line.startswith(SHUTDOWN_ERRORS):
                found.append(line)
    return tuple(found) + ("",) * open_


_HEADER = "Traceback (most recent call last):"
_EXCEPTION_LINE = re.compile(r"[A-Za-z_][\w.]*(?::(?: .*)?)?$")
"""how Python's traceback ends: the exception's (dotted) class name, then its message after a colon"""


def run_campaign(command: Sequence[str], *, budget_s: float, env: dict[str, str] | None = None,
                 grace_s: float = GRACE_S) -> CampaignResult:
    """Run ``command`` (HypoFuzz) for at most ``budget_s`` seconds, its output passed through to ours."""
    start = time.monotonic()
    proc = subprocess.Popen(command, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            start_new_session=True,  # its own process group: the workers are stopped with the hub
                            preexec_fn=_interruptible)
    output: list[str] = []

    def relay() -> None:
        assert proc.stdout is not None
        for line in proc.stdout:
            output.append(line)
            sys.stdout.write(line)
            sys.stdout.flush()

    reader = threading.Thread(target=relay, daemon=True)
    reader.start()
    interrupted = False
    try:
        proc.wait(timeout=budget_s)
    except subprocess.TimeoutExpired:
        interrupted = True
        _signal_group(proc, signal.SIGINT)
        try:
            proc.wait(timeout=grace_s)
        except subprocess.TimeoutExpired:
            _signal_group(proc, signal.SIGKILL)
            proc.wait()
    except KeyboardInterrupt:  # ctrl-C at the terminal reached the group too: let it end as at the budget
        interrupted = True
        proc.wait()
    reader.join(timeout=5)
    text = "".join(output)
    if interrupted:
        stopped = "budget"
    elif ALL_FAILED in text:
        stopped = "failure"
    else:
        stopped = "crash"
    return CampaignResult(stopped=stopped, returncode=proc.returncode, elapsed_s=time.monotonic() - start,
                          crashes=crashes(text))


def _interruptible() -> None:
    """In the child, before it runs HypoFuzz: SIGINT back to its default. A command started in the background
    by a shell without job control (``cmd &`` in a script, in CI) inherits SIGINT ignored, and an interpreter
    that inherits it ignored never raises KeyboardInterrupt: the budget's interrupt would do nothing, and the
    grace period would end in SIGKILL, leaving HypoFuzz no chance to end its workers."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def _signal_group(proc: subprocess.Popen, sig: signal.Signals) -> None:
    try:
        os.killpg(proc.pid, sig)
    except ProcessLookupError:
        pass


def hypofuzz_command(*, procs: int, pytest_args: Sequence[str] = ()) -> list[str]:
    """``hypothesis fuzz`` of this interpreter's environment on ``campaign.py``, without the dashboard."""
    hypothesis = Path(sys.executable).with_name("hypothesis")
    return [str(hypothesis), "fuzz", "-n", str(procs), "--no-dashboard", "--", str(CAMPAIGN.relative_to(Path.cwd())
            if CAMPAIGN.is_relative_to(Path.cwd()) else CAMPAIGN), "-p", "no:randomly", *pytest_args]


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m harness.fuzz.campaign_run", description=__doc__.split("\n\n")[0])
    parser.add_argument("--seconds", type=float, required=True, help="the campaign's budget")
    parser.add_argument("--procs", type=int, default=1, help="HypoFuzz's worker processes (default 1)")
    args = parser.parse_args(argv)
    if args.seconds <= 0 or args.procs < 1:
        parser.error("--seconds must be positive and --procs at least 1")
    text = os.environ.get(TARGET_VARIABLE, "forward_batch:full")
    try:
        target = FuzzTarget.parse(text)
    except ValueError as e:
        print(f"{TARGET_VARIABLE}: {e}", file=sys.stderr)
        return 2
    if not Path(sys.executable).with_name("hypothesis").exists():
        print(f"no hypothesis command beside {sys.executable}: HypoFuzz is not installed here (make fuzz-venv)",
              file=sys.stderr)
        return 2
    print(f"campaign {target.label}: HypoFuzz on {args.procs} process{'es' if args.procs != 1 else ''} "
          f"for {args.seconds:g}s", flush=True)
    result = run_campaign(hypofuzz_command(procs=args.procs), budget_s=args.seconds,
                          env={**os.environ, TARGET_VARIABLE: text})
    how = {"budget": "stopped at its budget", "failure": "ended on a failure, saved for the replay",
           "crash": f"HypoFuzz ended by itself (exit {result.returncode})"}[result.stopped]
    if result.crashes:
        how = "HypoFuzz broke: " + "; ".join(result.crashes)
    print(f"campaign {target.label}: {how} after {result.elapsed_s:.0f}s", file=sys.stdout if result.ok else sys.stderr)
    return 0 if result.ok else 2


if __name__ == "__main__":
    sys.exit(main())
