"""Writing results/: JSON + Markdown side by side, atomically, with provenance.

Every table records the command, model, data and machine that produced it, so
results/ stays honest when the code moves on.
"""

from __future__ import annotations

import json
import os
import platform
import shlex
import subprocess
import sys
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from qcal.fsio import atomic_write_text


def machine_info() -> dict[str, Any]:
    import torch

    cpu = platform.processor() or platform.machine()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    info: dict[str, Any] = {
        "cpu": cpu, "cores": os.cpu_count(), "torch_threads": torch.get_num_threads(),
        "python": platform.python_version(), "torch": torch.__version__,
        "cuda": torch.cuda.get_device_name(0) if torch.cuda.is_available() else None,
        "load_average": [round(x, 2) for x in os.getloadavg()],
    }
    try:
        import transformers

        info["transformers"] = transformers.__version__
    except ImportError:
        pass
    return info


def git_commit() -> str | None:
    try:
        out = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True,
                             text=True, check=True, cwd=Path(__file__).resolve().parent)
        return out.stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return None


def provenance(command: str | None = None, **extra: Any) -> dict[str, Any]:
    """What produced a result: command line, time, git commit, machine, plus `extra`."""
    return {
        "command": command or " ".join(shlex.quote(a) for a in sys.argv),
        "date": datetime.now(timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
        "git_commit": git_commit(),
        "machine": machine_info(),
        **extra,
    }


TIME_V_FIELDS = {
    "wall_seconds": r"Elapsed \(wall clock\) time \(h:mm:ss or m:ss\): ([\d:.]+)",
    "max_rss_kib": r"Maximum resident set size \(kbytes\): (\d+)",
    "user_seconds": r"User time \(seconds\): ([\d.]+)",
    "system_seconds": r"System time \(seconds\): ([\d.]+)",
    "cpu_percent": r"Percent of CPU this job got: (\d+)%",
    "fs_output_blocks": r"File system outputs: (\d+)",  # 512-byte blocks
}


def parse_time_v(text: str) -> dict[str, Any]:
    """The fields of GNU `time -v`'s report in `text` (None where absent): wall, user and
    system seconds, CPU percent, file-system output blocks, and peak RSS in MiB. The one
    parser of `time -v` output for every benchmark script."""
    import re

    out: dict[str, Any] = {}
    for key, pattern in TIME_V_FIELDS.items():
        found = re.search(pattern, text)
        if not found:
            out[key] = None
        elif key == "wall_seconds":
            seconds = 0.0
            for part in found.group(1).split(":"):
                seconds = seconds * 60 + float(part)
            out[key] = round(seconds, 1)
        else:
            out[key] = float(found.group(1))
    kib = out.pop("max_rss_kib")
    out["max_rss_mib"] = round(kib / 1024, 1) if kib is not None else None
    return out


def timed_command(cmd: list[str], env: dict[str, str] | None = None, cwd: Path | None = None,
                  stdout: Any = None) -> dict[str, Any]:
    """Run `cmd` under GNU `/usr/bin/time -v`: exit code, `parse_time_v`'s fields, the load
    average before and after, and the stderr tail when it failed."""
    before = os.getloadavg()
    proc = subprocess.run(["/usr/bin/time", "-v", *cmd], env={**os.environ, **(env or {})},
                          cwd=cwd, stdout=stdout if stdout is not None else subprocess.PIPE,
                          stderr=subprocess.PIPE, text=True)
    out: dict[str, Any] = {"returncode": proc.returncode,
                           "load_before": [round(x, 2) for x in before],
                           "load_after": [round(x, 2) for x in os.getloadavg()],
                           **parse_time_v(proc.stderr)}
    if proc.returncode != 0:
        out["error_tail"] = ((proc.stdout or "") + proc.stderr)[-4000:]
    return out


def provenance_markdown(prov: dict[str, Any]) -> str:
    m = prov.get("machine", {})
    lines = [
        f"- Command: `{prov.get('command')}`",
        f"- Date: {prov.get('date')}, git commit {prov.get('git_commit')}",
        f"- Machine: {m.get('cpu')}, {m.get('cores')} cores, torch {m.get('torch')}"
        + (f", GPU {m['cuda']}" if m.get("cuda") else ", no GPU")
        + (f", load average {m['load_average']}" if m.get("load_average") else ""),
    ]
    for key, value in prov.items():
        if key not in {"command", "date", "git_commit", "machine"}:
            lines.append(f"- {key.replace('_', ' ').capitalize()}: {value}")
    return "\n".join(lines)


def markdown_table(headers: list[str], rows: list[list[Any]], floatfmt: str = ".3f") -> str:
    def fmt(v: Any) -> str:
        return format(v, floatfmt) if isinstance(v, float) else str(v)

    out = ["| " + " | ".join(headers) + " |", "|" + "|".join("---" for _ in headers) + "|"]
    out += ["| " + " | ".join(fmt(v) for v in row) + " |" for row in rows]
    return "\n".join(out)


def write_results(stem: Path | str, data: dict[str, Any], markdown: str) -> tuple[Path, Path]:
    """Write `<stem>.json` and `<stem>.md` atomically; returns both paths."""
    stem = Path(stem)
    json_path, md_path = stem.with_suffix(".json"), stem.with_suffix(".md")
    atomic_write_text(json_path, json.dumps(data, indent=2, default=str) + "\n")
    atomic_write_text(md_path, markdown.rstrip() + "\n")
    return json_path, md_path
