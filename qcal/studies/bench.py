"""The one harness of the benchmark scripts (scripts/bench_*.py): cached steps, timed
subprocesses, the load average, provenance.

- `Steps`: a benchmark's finished steps in qcal's step cache (`qcal.cache.JsonSteps`) under
  its work folder, keyed by the setting they share, so an interrupted run resumes, a failed
  subprocess step is run again, and a work folder of another setting is refused.
- `timed`: one command under GNU `/usr/bin/time -v` (`qcal.results.timed_command`: wall,
  user and system seconds, peak RSS, load average before and after), echoed as it starts.
- `watched`: one long command under `time -v` with its output in a log file, stopped at a
  deadline (SIGINT: qcal keeps finished layers for --resume) or, at once, when its processes
  hold more memory than a limit (this machine has no swap).
- `load_average`: the 1/5/15-minute load, rounded, for in-process timings; `clock`: one
  in-process call's result and wall seconds; `time_round_robin`: several in-process calls
  timed interleaved, so load drifts hit them alike.
- `provenance`, `provenance_markdown`, `markdown_table`, `write_results`: what every results/
  table carries (command, date, git commit, machine with its load average, torch).
"""

from __future__ import annotations

import json
import os
import shlex
import shutil
import signal
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from qcal.cache import JsonSteps, StepCache
from qcal.results import (
    markdown_table,
    parse_time_v,
    provenance,
    provenance_markdown,
    timed_command,
    write_results,
)

__all__ = ["Steps", "clock", "load_average", "markdown_table", "provenance", "provenance_markdown",
           "time_round_robin", "timed", "watched", "write_results"]


def load_average() -> list[float] | None:
    """The 1, 5 and 15-minute load average (None where the OS has none)."""
    return [round(x, 2) for x in os.getloadavg()] if hasattr(os, "getloadavg") else None


def time_round_robin(fns: dict[str, Callable[[], Any]], repeats: int,
                     sample_s: float = 0.25) -> dict[str, dict[str, float]]:
    """Median/min seconds per call of each fn; samples interleave fns so load drifts hit all alike."""
    iters = {}
    for name, fn in fns.items():
        fn()
        start = time.perf_counter()
        fn()
        iters[name] = max(1, int(sample_s / max(time.perf_counter() - start, 1e-6)))
    samples: dict[str, list[float]] = {name: [] for name in fns}
    for _ in range(repeats):
        for name, fn in fns.items():
            start = time.perf_counter()
            for _ in range(iters[name]):
                fn()
            samples[name].append((time.perf_counter() - start) / iters[name])
    return {name: {"median_ms": 1e3 * statistics.median(s), "min_ms": 1e3 * min(s),
                   "max_ms": 1e3 * max(s), "iters": iters[name]} for name, s in samples.items()}


def clock(fn: Callable[[], Any]) -> tuple[Any, float]:
    """`fn()` and the wall seconds it took (perf_counter)."""
    started = time.perf_counter()
    out = fn()
    return out, time.perf_counter() - started


def timed(cmd: list[str], env: dict[str, str] | None = None,
          cwd: Path | str | None = None) -> dict[str, Any]:
    """Run `cmd` under `/usr/bin/time -v`, echoing it first and its error tail if it fails."""
    print("$", shlex.join(str(c) for c in cmd), flush=True)
    run = timed_command([str(c) for c in cmd], env=env, cwd=Path(cwd) if cwd else None)
    if run["returncode"] != 0:
        print(run.get("error_tail", ""), file=sys.stderr)
    return run


def watched(cmd: list[str], log: Path, env: dict[str, str] | None = None,
            cwd: Path | str | None = None, deadline: float | None = None,
            rss_limit_gib: float | None = None) -> dict[str, Any]:
    """Run `cmd` under `/usr/bin/time -v`, its output in `log`; stop it at `deadline` (epoch
    seconds) or when its processes hold more than `rss_limit_gib` resident. Returns
    `parse_time_v`'s fields, `returncode`, and `stopped` (why it was stopped, or None)."""
    with log.open("w") as sink:
        proc = subprocess.Popen(["/usr/bin/time", "-v", *map(str, cmd)], stdout=sink,
                                stderr=subprocess.STDOUT, text=True, env=env, cwd=cwd)
        stopped = _watch(proc, deadline, rss_limit_gib)
    return {"returncode": proc.returncode, "stopped": stopped, **parse_time_v(log.read_text())}


def _watch(proc: subprocess.Popen, deadline: float | None,
           rss_limit_gib: float | None) -> str | None:
    import psutil

    try:
        while proc.poll() is None:
            try:
                children = psutil.Process(proc.pid).children(recursive=True)
            except psutil.NoSuchProcess:
                break
            rss = sum(_rss(c) for c in children) / 2**30
            if rss_limit_gib is not None and rss > rss_limit_gib:
                for child in children:  # no grace period: it is still growing
                    child.kill()
                proc.wait()
                return f"stopped (RSS over {rss_limit_gib:g} GiB)"
            if deadline is not None and time.time() > deadline:
                _interrupt(proc)
                return "stopped (time limit)"
            time.sleep(1)
    except KeyboardInterrupt:
        # An interrupted driver stops its command as a deadline would (a signal sent to the
        # driver alone would leave the command running, and resume state half written).
        _interrupt(proc)
        raise
    return None


def _interrupt(proc: subprocess.Popen) -> None:
    """SIGINT to the command (it finishes its layer and saves its state), killed after 120 s.
    The command, not /usr/bin/time: time still reports its peak and CPU time."""
    import psutil

    try:
        children = psutil.Process(proc.pid).children(recursive=True)
    except psutil.NoSuchProcess:
        return
    for child in children:
        child.send_signal(signal.SIGINT)
    try:
        proc.wait(timeout=120)
    except subprocess.TimeoutExpired:
        for child in children:
            child.kill()
        proc.wait()


def _rss(process: Any) -> int:
    try:
        return int(process.memory_info().rss)
    except Exception:  # gone between the listing and the read
        return 0


def benchmark_json(study: str, stem: str, script: str, grids: list[Path],
                   out: Path | None) -> tuple[Path, Any]:
    """For `qcal report --study STUDY` of a benchmark: the results stem (`out`, else
    results/STEM) and the JSON the benchmark `script` wrote there. Refused in one line when
    grids are given (a benchmark's page reads none) or the JSON is missing."""
    from qcal.errors import ConfigError
    from qcal.paths import results_dir

    if grids:
        raise ConfigError(f"--study {study} reads no grid: it re-renders the JSON that "
                          f"{script} wrote (--out names it)")
    out = out or results_dir() / stem
    source = out.with_suffix(".json")
    if not source.is_file():
        raise ConfigError(f"{source} does not exist; run {script} first")
    return out, json.loads(source.read_text())


def failed(saved: Any) -> bool:
    """A saved subprocess step that exited non-zero: run it again rather than keep it."""
    return isinstance(saved, dict) and saved.get("returncode", 0) != 0


class Steps:
    """The steps of one benchmark run, cached in `work` under the fingerprint of `setting`.

    `fresh` discards the folder first; `only` (names before any "/") limits which steps
    run, the others answering from the cache or None."""

    def __init__(self, work: Path, setting: Any, fresh: bool = False,
                 only: list[str] | None = None) -> None:
        if fresh:
            shutil.rmtree(work, ignore_errors=True)
        work.mkdir(parents=True, exist_ok=True)
        self.work, self.only = work, only
        self.cache = JsonSteps(StepCache(work), "steps", setting)
        if self.cache.other_settings():
            raise SystemExit(f"{work} holds a run with other settings; pass --fresh")

    @property
    def results(self) -> dict[str, Any]:
        return self.cache.results

    def get(self, key: str) -> Any | None:
        return self.cache.get(key)

    def run(self, key: str, compute: Callable[[], Any]) -> Any:
        """The step's cached result, else `compute()`'s (announced, then cached)."""
        if self.only is not None and key.split("/")[0] not in self.only:
            return self.cache.get(key)

        def announced() -> Any:
            print(f"== {key}", flush=True)
            return compute()

        return self.cache.run(key, announced, failed)
