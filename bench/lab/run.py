"""The lab as a person feels it: the first `make lab` and a `make lab` with nothing to change.

Runs playbooks/lab_image.yml, then playbooks/site.yml twice against inventories/lab (two workers,
as the lab test), each with the lab_profile callback, and prints:
  - the wall time of each part, and of the re-run;
  - per host: the module executions (tasks that reached the host), their wall time, and what
    changed; the machine-independent figure behind the re-run's time;
  - the re-run's slowest tasks per host, to say where its time goes.
Results: bench/results/lab.json. `--rerun-only` times a re-run of a lab that is already up.

Exits non-zero when a run fails or the re-run changes anything (then it is not the no-op run
this measures)."""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from collections import defaultdict
from pathlib import Path
from typing import Any, Dict, List

ROOT = Path(__file__).resolve().parents[2]
BIN = ROOT / ".venv" / "bin"
EXTRA = ["-e", "mlinfra_worker_count=2"]
# Where a task delegated to the controller says it ran (its delegated ansible_host).
CONTROLLER = ("localhost", "127.0.0.1")


def lab_fact_cache() -> Dict[str, str]:
    """The lab's fact cache settings, as make lab sets them (lab/fact-cache.env)."""
    lines = (ROOT / "lab" / "fact-cache.env").read_text(encoding="utf-8").splitlines()
    return dict(line.split("=", 1) for line in lines if line.strip() and not line.startswith("#"))


def playbook(name: str, log_dir: Path) -> Dict[str, Any]:
    """Run one playbook of the lab with the profile callback; its wall time and profile."""
    profile = log_dir / ("%s.profile.json" % name)
    env = dict(os.environ, **lab_fact_cache(), MLKVM_LAB_PROFILE=str(profile),
               ANSIBLE_CALLBACK_PLUGINS=str(ROOT / "bench" / "lab" / "callback_plugins"),
               ANSIBLE_CALLBACKS_ENABLED="lab_profile")
    cmd = [str(BIN / "ansible-playbook"), "-i", "inventories/lab", "playbooks/%s.yml" % name.split("-")[0]] + EXTRA
    log = log_dir / ("%s.log" % name)
    began = time.monotonic()
    with open(log, "w", encoding="utf-8") as out:
        proc = subprocess.run(cmd, cwd=ROOT, env=env, stdout=out, stderr=subprocess.STDOUT, check=False)
    wall = round(time.monotonic() - began, 1)
    if proc.returncode != 0:
        sys.stderr.write(log.read_text(encoding="utf-8")[-6000:])
        raise SystemExit("%s failed (rc=%d); its log: %s" % (name, proc.returncode, log))
    results = json.loads(profile.read_text(encoding="utf-8"))["results"] if profile.exists() else []
    print("  %-16s %7.1f s" % (name, wall), flush=True)
    return {"wall_s": wall, "results": results, "log": str(log)}


def per_host(results: List[Dict[str, Any]]) -> Dict[str, Dict[str, Any]]:
    """Per inventory host: module runs on the host itself (executions) and those of its tasks
    delegated to the controller (on_controller), their wall time, changes and tasks."""
    hosts: Dict[str, Dict[str, Any]] = defaultdict(
        lambda: {"executions": 0, "on_controller": 0, "seconds": 0.0, "changed": 0, "tasks": 0})
    for item in results:
        row = hosts[item["host"]]
        row["tasks"] += 1
        row["changed"] += int(item["changed"])
        if item["module_executions"]:
            on_controller = item["host"] != "localhost" and item.get("delegated_to") in CONTROLLER
            row["on_controller" if on_controller else "executions"] += item["module_executions"]
            row["seconds"] = round(row["seconds"] + (item["seconds"] or 0.0), 1)
    return dict(sorted(hosts.items()))


def slowest(results: List[Dict[str, Any]], host: str, count: int = 8) -> List[Dict[str, Any]]:
    mine = [r for r in results if r["host"] == host and r["seconds"] is not None]
    return sorted(mine, key=lambda r: -r["seconds"])[:count]


def print_hosts(title: str, hosts: Dict[str, Dict[str, Any]]) -> None:
    header = ("host", "executions", "on controller", "their time", "changed")
    print("\n%s\n  %-18s %10s %14s %12s %8s" % ((title,) + header))
    for host, row in hosts.items():
        values = (host, row["executions"], row["on_controller"], row["seconds"], row["changed"])
        print("  %-18s %10d %14d %10.1f s %8d" % values)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--rerun-only", action="store_true", help="time a re-run of a lab that is already up")
    args = parser.parse_args()
    log_dir = Path(tempfile.mkdtemp(prefix="mlkvm-bench-lab-"))
    print("== lab (logs and profiles in %s)" % log_dir, flush=True)
    report: Dict[str, Any] = {"machine": {"cores": os.cpu_count(), "uname": os.uname().release},
                              "when": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}
    if not args.rerun_only:
        image = playbook("lab_image", log_dir)
        first = playbook("site-first", log_dir)
        report["first"] = {"lab_image_s": image["wall_s"], "site_s": first["wall_s"],
                           "total_s": round(image["wall_s"] + first["wall_s"], 1), "hosts": per_host(first["results"])}
    rerun = playbook("site-rerun", log_dir)
    hosts = per_host(rerun["results"])
    report["rerun"] = {"site_s": rerun["wall_s"], "hosts": hosts,
                       "slowest": {host: slowest(rerun["results"], host) for host in hosts}}
    if "first" in report:
        print_hosts("first run: %.1f s (lab image %.1f s, site.yml %.1f s)" % (
            report["first"]["total_s"], report["first"]["lab_image_s"], report["first"]["site_s"]), report["first"]["hosts"])
    print_hosts("re-run with nothing to change: %.1f s" % rerun["wall_s"], hosts)
    for host, items in report["rerun"]["slowest"].items():
        print("\n  slowest on %s:" % host)
        for item in items:
            print("    %6.1f s  %s%s" % (item["seconds"], (item["role"] + " : ") if item["role"] else "", item["task"]))
    out = ROOT / "bench" / "results" / "lab.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(report, indent=1) + "\n", encoding="utf-8")
    changed = {host: row["changed"] for host, row in hosts.items() if row["changed"]}
    if changed:
        raise SystemExit("the re-run changed something (%s): not a no-op run; see %s" % (changed, rerun["log"]))


if __name__ == "__main__":
    main()
