"""The processes a command starts, by kind: how many, their CPU seconds, how many imported torch.

    python benchmarks/suite_processes.py [--every 0.1] -- python -m pytest -q -n 0 tests/FILE.py

Samples ``/proc`` every ``--every`` seconds (Linux). A process is the command's when it descends
from it or its initial environment carries the marker this script adds (``KERNELAB_SUITE_PROBE``:
processes that left the tree, ``setsid`` and re-parented, still count). For each: the command line,
its CPU seconds (``utime + stime`` at the last sample: a process's last tenth of a second is
missed, and one that lives under one sample is not seen), and whether ``libtorch`` was mapped
(``/proc/PID/maps``: it imported torch, or was forked from a process that had: the fork
server's children carry the server's command line). Prints one line per kind of process (the command line
with paths and numbers cut: ``kernelab.runners.cli serve``, ``kernelab.runners.measure cells``, ...)
and the totals; the command's own exit status is this script's. For counts and CPU before and
after a change (``docs/testing.md``), not for wall time.
"""

from __future__ import annotations

import argparse
import os
import re
import secrets
import subprocess
import sys
import time
from dataclasses import dataclass

MARK = "KERNELAB_SUITE_PROBE"
HZ = os.sysconf("SC_CLK_TCK")


@dataclass
class Seen:
    cmd: str
    cpu_s: float = 0.0
    torch: bool = False


def _stat(pid: str) -> tuple[int, float] | None:
    try:
        with open(f"/proc/{pid}/stat", encoding="ascii", errors="replace") as f:
            fields = f.read().rsplit(")", 1)[1].split()
    except OSError:
        return None
    return int(fields[1]), (int(fields[11]) + int(fields[12])) / HZ


def kind(cmd: str) -> str:
    """A process's kind: its command line without the interpreter's path, options' values and
    numbers (``python -m kernelab.runners.cli runner --server ... -> kernelab.runners.cli runner``)."""
    words = cmd.split()
    if not words:
        return "?"
    if "python" in os.path.basename(words[0]):
        words = [w for w in words[1:] if w not in ("-m", "-P", "-I", "-u", "-c")]
    else:
        words[0] = os.path.basename(words[0])
    head = [w for w in words[:4] if not w.startswith("-") and "/" not in w and "=" not in w]
    return re.sub(r"\d+", "N", " ".join(head[:2]) or os.path.basename(words[0]))[:60]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--every", type=float, default=0.1, help="seconds between samples")
    parser.add_argument("command", nargs=argparse.REMAINDER)
    args = parser.parse_args(argv)
    command = args.command[1:] if args.command[:1] == ["--"] else args.command
    marker = f"{MARK}={secrets.token_hex(8)}".encode()
    root = subprocess.Popen(command, env={**os.environ, MARK: marker.decode().split("=", 1)[1]})
    seen: dict[int, Seen] = {}
    ours: set[int] = {root.pid}
    while root.poll() is None:
        parents: dict[int, int] = {}
        cpu: dict[int, float] = {}
        for name in os.listdir("/proc"):
            if name.isdigit() and (st := _stat(name)) is not None:
                parents[int(name)], cpu[int(name)] = st
        for pid in sorted(cpu):  # parents (lower pids, mostly) first; the rest next sample
            if pid not in ours:
                mine = parents.get(pid) in ours
                if not mine:
                    try:
                        with open(f"/proc/{pid}/environ", "rb") as f:
                            mine = marker in f.read().split(b"\0")
                    except OSError:
                        continue
                if not mine:
                    continue
                ours.add(pid)
            try:  # read again each time: a process that execs (``jobns`` into its command) changes it
                with open(f"/proc/{pid}/cmdline", "rb") as f:
                    cmd = f.read().replace(b"\0", b" ").decode(errors="replace")
            except OSError:
                continue
            entry = seen.setdefault(pid, Seen(cmd))
            entry.cmd = cmd or entry.cmd
            entry.cpu_s = max(entry.cpu_s, cpu[pid])
            if not entry.torch and entry.cpu_s > 0.3:
                try:
                    with open(f"/proc/{pid}/maps", "rb") as f:
                        entry.torch = b"libtorch_cpu" in f.read()
                except OSError:
                    pass
        time.sleep(args.every)
    by_kind: dict[str, list[Seen]] = {}
    for pid, entry in seen.items():
        if pid != root.pid:
            by_kind.setdefault(kind(entry.cmd), []).append(entry)
    print(f"\n{'processes':>9} {'CPU-s':>8} {'torch':>5}  kind", file=sys.stderr)
    for name, entries in sorted(by_kind.items(), key=lambda kv: -sum(e.cpu_s for e in kv[1])):
        total = sum(e.cpu_s for e in entries)
        print(f"{len(entries):>9} {total:>8.1f} {sum(e.torch for e in entries):>5}  {name}", file=sys.stderr)
    all_seen = [e for pid, e in seen.items() if pid != root.pid]
    print(f"{len(all_seen):>9} {sum(e.cpu_s for e in all_seen):>8.1f} {sum(e.torch for e in all_seen):>5}  "
          f"all (the command itself: {seen[root.pid].cpu_s if root.pid in seen else 0:.1f} CPU-s)",
          file=sys.stderr)  # fmt: skip
    return root.returncode


if __name__ == "__main__":
    sys.exit(main())
