"""Run one benchmark playbook with the benchmark's ansible-playbook and time it (shared by the
benchmarks under bench/)."""
from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def play(venv: Path, playbook: Path, extra: dict, noop: bool = False) -> float:
    """Wall time of ``ansible-playbook playbook`` against localhost, start-up included; exits
    when it fails, and, with ``noop``, when it changed anything (then it is not the no-op run
    the caller times)."""
    env = dict(os.environ)
    env["ANSIBLE_COLLECTIONS_PATH"] = str(ROOT / "collections")
    env["ANSIBLE_CONFIG"] = str(ROOT / "ansible.cfg")
    env.pop("PYTHONPATH", None)
    # The variables go in a file: lists of hundreds of objects are long for a command line.
    with tempfile.NamedTemporaryFile("w", suffix=".json", prefix="mlkvm-bench-vars-") as evars:
        json.dump(dict(extra, ansible_python_interpreter=str(venv / "bin" / "python")), evars)
        evars.flush()
        cmd = [str(venv / "bin" / "ansible-playbook"), "-i", "localhost,", "-c", "local", str(playbook),
               "-e", "@" + evars.name]
        start = time.monotonic()
        proc = subprocess.run(cmd, env=env, capture_output=True, text=True, cwd=str(playbook.parent), check=False)
        elapsed = time.monotonic() - start
    if proc.returncode != 0:
        sys.stderr.write(proc.stdout[-5000:] + proc.stderr[-3000:])
        raise SystemExit("%s failed (rc=%d)" % (playbook.name, proc.returncode))
    recap = [line for line in proc.stdout.splitlines() if line.startswith("localhost")]
    print("  %-14s %6.1f s  %s" % (playbook.name, elapsed, recap[-1].split(":", 1)[1].strip() if recap else ""),
          flush=True)
    if noop and not (recap and " changed=0 " in recap[-1]):
        raise SystemExit("%s: the re-run changed something: %s" % (playbook.name, recap[-1] if recap else proc.stdout[-2000:]))
    return elapsed
