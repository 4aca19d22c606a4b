# Copyright: mlinfra.kvm contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""ml_stage against DVC on the same data, in the same run (issue 5).

Measured:
  hash      throughput of one 1 GiB file in the page cache: ml_stage's hash_file for each
            algorithm it can use, and DVC's own file_md5 (dvc_data) run in DVC's venv.
  first     first-time check of that 1 GiB file end to end: ml_stage in check mode with an
            empty state dir vs `dvc status` with an empty DVC state (fresh site cache dir).
  noop a/b  the no-op check with warm caches: (a) a 1 GiB file + 10,000 small files and
            (b) 100,000 small files. ml_stage runs as Ansible runs it (a fresh Python
            process, arguments as JSON on stdin); DVC as `dvc status`, and `dvc status`
            through ansible.builtin.command (how a playbook would run it: then both sides
            pay Ansible's module start-up). Both report "up to date".

Run it through bench/stage/run.sh, which provides DVC. Data lives under --workdir
(default /tmp/mlstage-bench) and is reused by later runs; results go to
bench/results/stage/summary.json (gitignored) and a table on stdout. Wall and CPU
(user+sys) times are both reported: on a shared host CPU time is the steadier figure.
The exit status is 0 unless --strict is given and a goal of issue 5 is missed.
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import random
import resource
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, Dict, List, Tuple

ROOT = Path(__file__).resolve().parents[2]
COLLECTIONS = ROOT / "collections"
sys.path.insert(0, str(COLLECTIONS))

from ansible_collections.mlinfra.kvm.plugins.module_utils._ml import _stage_hash as H  # noqa: E402

GiB = 1 << 30
MODULE = "ansible_collections.mlinfra.kvm.plugins.modules.ml_stage"
SCENARIOS = {
    "a": {"big": GiB, "small": 10_000, "per_dir": 100},
    "b": {"big": 0, "small": 100_000, "per_dir": 100},
}
STAGE_CMD = [sys.executable, "-c", "open('out_ml.txt', 'w').write('x')"]
DVC_YAML = """stages:
  bench:
    cmd: {py} -c "open('out_dvc.txt', 'w').write('x')"
    deps: [data]
    outs: [out_dvc.txt]
  bench_big:
    cmd: {py} -c "open('out_dvc_big.txt', 'w').write('x')"
    deps: [data/big.bin]
    outs: [out_dvc_big.txt]
"""


def log(msg: str) -> None:
    print("[bench] " + msg, file=sys.stderr, flush=True)


# -- data -------------------------------------------------------------------------------
def generate(root: Path, spec: Dict[str, int]) -> Dict[str, int]:
    marker = root / ".generated.json"
    if marker.exists() and json.loads(marker.read_text()) == spec:
        log("reusing data in %s" % root)
    else:
        shutil.rmtree(root, ignore_errors=True)
        data = root / "data"
        data.mkdir(parents=True)
        t = time.monotonic()
        if spec["big"]:
            with open(data / "big.bin", "wb") as f:
                left = spec["big"]
                while left:
                    chunk = os.urandom(min(left, 16 << 20))
                    f.write(chunk)
                    left -= len(chunk)
        rnd = random.Random(5)
        for i in range(spec["small"]):
            d = data / ("small" if spec["big"] else "") / ("d%04d" % (i // spec["per_dir"]))
            if i % spec["per_dir"] == 0:
                d.mkdir(parents=True, exist_ok=True)
            (d / ("f%06d.bin" % i)).write_bytes(rnd.randbytes(rnd.randint(256, 4096)))
        marker.write_text(json.dumps(spec))
        log("generated %s in %.1f s" % (root, time.monotonic() - t))
    files, size = 0, 0
    for dirpath, _dirs, names in os.walk(root / "data"):
        for n in names:
            files += 1
            size += os.path.getsize(os.path.join(dirpath, n))
    return {"files": files, "bytes": size}


# -- ml_stage -----------------------------------------------------------------------------
def module_env() -> Dict[str, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(COLLECTIONS), env.get("PYTHONPATH")]))
    return env


def child_cpu() -> float:
    ru = resource.getrusage(resource.RUSAGE_CHILDREN)
    return ru.ru_utime + ru.ru_stime


def timed(argv: List[str], **kwargs: Any) -> Tuple[float, float, "subprocess.CompletedProcess[str]"]:
    """(wall seconds, CPU seconds of the child, the finished process)."""
    cpu, t = child_cpu(), time.perf_counter()
    proc = subprocess.run(argv, capture_output=True, text=True, **kwargs, check=False)
    return time.perf_counter() - t, child_cpu() - cpu, proc


def ml_stage(args: Dict[str, Any], check: bool = False) -> Tuple[float, float, Dict[str, Any]]:
    payload = dict(args, _ansible_check_mode=check)
    wall, cpu, proc = timed([sys.executable, "-m", MODULE], env=module_env(), cwd=str(ROOT),
                            input=json.dumps({"ANSIBLE_MODULE_ARGS": payload}))
    out = proc.stdout
    result = json.loads(out[out.index("{"):])
    if result.get("failed"):
        raise SystemExit("ml_stage failed: %s" % result.get("msg"))
    return wall, cpu, result


# -- DVC ------------------------------------------------------------------------------------
class Dvc:
    def __init__(self, venv: Path) -> None:
        self.bin = str(venv / "bin" / "dvc")
        self.python = str(venv / "bin" / "python")
        self.env = dict(os.environ, DVC_NO_ANALYTICS="1", DVC_STUDIO_OFFLINE="1",
                        DVC_UPDATER_ENDPOINT="http://127.0.0.1:9/", DVC_IGNORE_ISATTY="1")

    def version(self) -> str:
        return subprocess.run([self.bin, "--version"], capture_output=True, text=True,
                              env=self.env, check=True).stdout.strip()

    def __call__(self, cwd: Path, *args: str, site: str = "") -> Tuple[float, float, str]:
        env = dict(self.env)
        env["DVC_SITE_CACHE_DIR"] = site or str(cwd / ".dvc-site")
        wall, cpu, proc = timed([self.bin] + list(args), cwd=str(cwd), env=env)
        if proc.returncode != 0:
            raise SystemExit("dvc %s failed (%s): %s %s" % (" ".join(args), proc.returncode,
                                                            proc.stdout, proc.stderr))
        return wall, cpu, proc.stdout + proc.stderr

    def as_task(self, cwd: Path, *args: str) -> Tuple[float, float, str]:
        """`dvc ARGS` the way a playbook runs it: through ansible.builtin.command, a module
        process like ml_stage's (so both sides pay Ansible's own module start-up)."""
        env = dict(self.env, DVC_SITE_CACHE_DIR=str(cwd / ".dvc-site"))
        env.pop("PYTHONPATH", None)
        payload = {"ANSIBLE_MODULE_ARGS": {"argv": [self.bin] + list(args), "chdir": str(cwd)}}
        wall, cpu, proc = timed([sys.executable, "-m", "ansible.modules.command"], env=env,
                                input=json.dumps(payload))
        out = proc.stdout
        result = json.loads(out[out.index("{"):])
        if result.get("rc") != 0:
            raise SystemExit("dvc %s through ansible.builtin.command failed: %s" % (" ".join(args), result))
        return wall, cpu, result["stdout"] + result["stderr"]

    def setup(self, cwd: Path) -> None:
        for name in (".dvc", ".dvc-site", "dvc.yaml", "dvc.lock", "out_dvc.txt", "out_dvc_big.txt"):
            p = cwd / name
            shutil.rmtree(p, ignore_errors=True) if p.is_dir() else p.unlink(missing_ok=True)
        self(cwd, "init", "--no-scm", "-q")
        self(cwd, "config", "core.analytics", "false")
        self(cwd, "config", "core.check_update", "false")
        (cwd / "dvc.yaml").write_text(DVC_YAML.format(py=sys.executable))

    def md5_throughput(self, path: Path, repeat: int) -> float:
        code = ("import sys,time\nfrom dvc_data.hashfile.hash import file_md5\nbest=1e9\n"
                "for _ in range(%d):\n t=time.perf_counter(); file_md5(sys.argv[1]); "
                "best=min(best,time.perf_counter()-t)\nprint(best)\n" % repeat)
        out = subprocess.run([self.python, "-c", code, str(path)], capture_output=True, text=True,
                             env=self.env, check=True).stdout
        return path.stat().st_size / float(out.strip()) / 1e6


# -- measurements ---------------------------------------------------------------------------
def stats(values: List[float]) -> Dict[str, Any]:
    return {"median": round(statistics.median(values), 4), "min": round(min(values), 4),
            "max": round(max(values), 4), "runs": [round(v, 4) for v in values]}


def hash_throughput(path: Path, repeat: int) -> Dict[str, float]:
    size = path.stat().st_size
    out = {}
    for algo in H.SUPPORTED:
        if not H.available(algo):
            continue
        best = 1e9
        for _unused in range(repeat):
            t = time.perf_counter()
            H.hash_file(str(path), algo, size)
            best = min(best, time.perf_counter() - t)
        out[algo] = round(size / best / 1e6, 1)
    return out


def stage_args(cwd: Path, name: str, deps: List[str], out: str, state_dir: str = ".ml_stage") -> Dict[str, Any]:
    return {"name": name, "chdir": str(cwd), "deps": deps, "outs": [out], "state_dir": state_dir,
            "cmd": [sys.executable, "-c", "open(%r, 'w').write('x')" % out]}


def first_time(cwd: Path, dvc: Dvc, repeat: int) -> Dict[str, Any]:
    """1 GiB file, no stat cache / DVC state: the cost of hashing it end to end."""
    size = (cwd / "data" / "big.bin").stat().st_size
    ours, ours_cpu = [], []
    for _unused in range(repeat):
        state = ".ml_stage_first"
        shutil.rmtree(cwd / state, ignore_errors=True)
        wall, cpu, res = ml_stage(stage_args(cwd, "first", ["data/big.bin"], "out_first.txt", state),
                                  check=True)
        assert res["hashing"]["bytes_hashed"] == size, res["hashing"]
        ours.append(wall)
        ours_cpu.append(cpu)
    shutil.rmtree(cwd / ".ml_stage_first", ignore_errors=True)
    dvc(cwd, "repro", "-q", "bench_big")
    theirs, theirs_cpu = [], []
    for i in range(repeat):
        site = str(cwd / (".dvc-site-first-%d" % i))
        wall, cpu, out = dvc(cwd, "status", "bench_big", site=site)
        assert "up to date" in out, out
        theirs.append(wall)
        theirs_cpu.append(cpu)
        shutil.rmtree(site, ignore_errors=True)
    return {"bytes": size, "ml_stage_check_s": stats(ours), "dvc_status_s": stats(theirs),
            "ml_stage_cpu_s": stats(ours_cpu), "dvc_cpu_s": stats(theirs_cpu),
            "ml_stage_MBps": round(size / min(ours) / 1e6, 1),
            "dvc_MBps": round(size / min(theirs) / 1e6, 1)}


def noop(cwd: Path, dvc: Dvc, repeat: int) -> Dict[str, Any]:
    for name in (".ml_stage", "out_ml.txt"):
        p = cwd / name
        shutil.rmtree(p, ignore_errors=True) if p.is_dir() else p.unlink(missing_ok=True)
    args = stage_args(cwd, "bench", ["data"], "out_ml.txt")
    first_ml, _cpu, res = ml_stage(args)
    assert res["ran"], res
    time.sleep(2.1)  # let the newest files age past the racy window, as real data has
    ml_stage(args)   # warm the stat cache (what a first no-op run on real data does)
    ours, ours_cpu, inside = [], [], []
    for _unused in range(repeat):
        wall, cpu, res = ml_stage(args)
        assert res["changed"] is False and not res["reasons"], res
        ours.append(wall)
        ours_cpu.append(cpu)
        inside.append(res["hashing"]["seconds"])
    first_dvc, _cpu, _out = dvc(cwd, "repro", "-q", "bench")
    dvc(cwd, "status")  # warm
    theirs, theirs_cpu, task, task_cpu = [], [], [], []
    for _unused in range(repeat):  # interleaved, so that load changes hit both alike
        wall, cpu, out = dvc(cwd, "status", "bench")
        assert "up to date" in out, out
        theirs.append(wall)
        theirs_cpu.append(cpu)
        wall, cpu, out = dvc.as_task(cwd, "status", "bench")
        assert "up to date" in out, out
        task.append(wall)
        task_cpu.append(cpu)
    med = statistics.median
    return {"ml_stage_noop_s": stats(ours), "ml_stage_cpu_s": stats(ours_cpu),
            "ml_stage_check_in_module_s": stats(inside),
            "dvc_status_s": stats(theirs), "dvc_cpu_s": stats(theirs_cpu),
            "dvc_status_as_ansible_task_s": stats(task), "dvc_as_ansible_task_cpu_s": stats(task_cpu),
            "speedup": round(med(theirs) / med(ours), 1),
            "speedup_cpu": round(med(theirs_cpu) / med(ours_cpu), 1),
            "speedup_as_ansible_tasks": round(med(task) / med(ours), 1),
            "speedup_as_ansible_tasks_cpu": round(med(task_cpu) / med(ours_cpu), 1),
            "first_run": {"ml_stage_s": round(first_ml, 2), "dvc_repro_s": round(first_dvc, 2)}}


def cpu_model() -> str:
    try:
        for line in open("/proc/cpuinfo"):
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor()


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--dvc-venv", required=True, type=Path)
    ap.add_argument("--workdir", type=Path, default=Path("/tmp/mlstage-bench"))
    ap.add_argument("--results", type=Path, default=ROOT / "bench" / "results" / "stage")
    ap.add_argument("--repeat", type=int, default=5)
    ap.add_argument("--scenarios", default="a,b")
    ap.add_argument("--quick", action="store_true", help="repeat 3, a smaller (b): a smoke run")
    ap.add_argument("--strict", action="store_true", help="exit 1 when a goal of issue 5 is missed")
    args = ap.parse_args()
    if args.quick:
        args.repeat = 3
        SCENARIOS["b"] = dict(SCENARIOS["b"], small=20_000)
    dvc = Dvc(args.dvc_venv)
    summary: Dict[str, Any] = {
        "machine": {"cpu": cpu_model(), "cores": os.cpu_count(), "python": platform.python_version(),
                    "kernel": platform.release()},
        "dvc": dvc.version(),
        "algorithms_available": H.available_algorithms(),
        "auto_algorithm": H.choose_algorithm("auto", None),
        "repeat": args.repeat,
        "scenarios": {},
    }
    for name in args.scenarios.split(","):
        cwd = args.workdir / name
        summary["scenarios"][name] = generate(cwd, SCENARIOS[name])
    if "a" in summary["scenarios"]:
        cwd = args.workdir / "a"
        big = cwd / "data" / "big.bin"
        big.read_bytes() if big.stat().st_size <= 2 * GiB else None  # page cache
        log("hash throughput")
        thr = hash_throughput(big, 3)
        thr["dvc_md5"] = round(dvc.md5_throughput(big, 3), 1)
        summary["hash_MBps"] = thr
        dvc.setup(cwd)
        log("first-time check of the 1 GiB file")
        summary["first_time_1GiB"] = first_time(cwd, dvc, 3)
    for name in args.scenarios.split(","):
        cwd = args.workdir / name
        if name != "a":
            dvc.setup(cwd)
        log("no-op check, scenario %s" % name)
        summary["scenarios"][name].update(noop(cwd, dvc, args.repeat))
    goals = {}
    for name, sc in summary["scenarios"].items():
        goals["noop_%s_at_least_5x_vs_dvc_cli" % name] = sc["speedup"] >= 5
        goals["noop_%s_at_least_5x_both_as_ansible_tasks" % name] = sc["speedup_as_ansible_tasks"] >= 5
    if "hash_MBps" in summary:
        best = summary["hash_MBps"][summary["auto_algorithm"]]
        summary["hash_speedup_vs_dvc_md5"] = round(best / summary["hash_MBps"]["dvc_md5"], 1)
        goals["hash_at_least_2x_dvc_md5"] = summary["hash_speedup_vs_dvc_md5"] >= 2
        ft = summary["first_time_1GiB"]
        goals["first_time_at_least_2x_dvc"] = ft["ml_stage_MBps"] >= 2 * ft["dvc_MBps"]
    summary["goals"] = goals
    summary["loadavg"] = " ".join(open("/proc/loadavg").read().split()[:3]) if os.path.exists("/proc/loadavg") else None
    args.results.mkdir(parents=True, exist_ok=True)
    (args.results / "summary.json").write_text(json.dumps(summary, indent=2) + "\n")
    print(json.dumps(summary, indent=2))
    print(table(summary))
    return 0 if all(goals.values()) or not args.strict else 1


def table(s: Dict[str, Any]) -> str:
    rows = ["", "ml_stage vs %s on %s (%s cores), median of %d" % (
        s["dvc"], s["machine"]["cpu"], s["machine"]["cores"], s["repeat"]),
        "%-38s %12s %12s %8s" % ("measure (wall time unless said)", "ml_stage", "DVC", "ratio")]
    for name, sc in s["scenarios"].items():
        label = "no-op %s: %d files, %.2f GiB" % (name, sc["files"], sc["bytes"] / GiB)
        rows.append("%-38s %11.3fs %11.3fs %7.1fx" % (label, sc["ml_stage_noop_s"]["median"],
                                                      sc["dvc_status_s"]["median"], sc["speedup"]))
        rows.append("%-38s %11.3fs %11.3fs %7.1fx" % ("  CPU time (user+sys)", sc["ml_stage_cpu_s"]["median"],
                                                      sc["dvc_cpu_s"]["median"], sc["speedup_cpu"]))
        rows.append("%-38s %11.3fs %11.3fs %7.1fx" % ("  both as Ansible tasks (dvc: command)",
                                                      sc["ml_stage_noop_s"]["median"],
                                                      sc["dvc_status_as_ansible_task_s"]["median"],
                                                      sc["speedup_as_ansible_tasks"]))
        rows.append("%-38s %11.3fs %11.3fs %7.1fx" % ("    CPU time (user+sys)", sc["ml_stage_cpu_s"]["median"],
                                                      sc["dvc_as_ansible_task_cpu_s"]["median"],
                                                      sc["speedup_as_ansible_tasks_cpu"]))
        rows.append("%-38s %11.3fs" % ("  (check inside the module)", sc["ml_stage_check_in_module_s"]["median"]))
        rows.append("%-38s %11.1fs %11.1fs" % ("  first run / dvc repro", sc["first_run"]["ml_stage_s"],
                                               sc["first_run"]["dvc_repro_s"]))
    if "hash_MBps" in s:
        h = s["hash_MBps"]
        for algo in H.SUPPORTED:
            if algo in h:
                rows.append("%-38s %9.0f MB/s %9.0f MB/s %7.1fx" % ("hash 1 GiB, %s%s" % (
                    algo, " (auto)" if algo == s["auto_algorithm"] else ""), h[algo], h["dvc_md5"],
                    h[algo] / h["dvc_md5"]))
        ft = s["first_time_1GiB"]
        rows.append("%-38s %9.0f MB/s %9.0f MB/s %7.1fx" % ("first-time check of 1 GiB (end to end)",
                                                            ft["ml_stage_MBps"], ft["dvc_MBps"],
                                                            ft["ml_stage_MBps"] / ft["dvc_MBps"]))
    rows.append("load average at the end: %s" % s.get("loadavg"))
    rows.append("goals: " + ", ".join("%s=%s" % kv for kv in s["goals"].items()))
    return "\n".join(rows)


if __name__ == "__main__":
    sys.exit(main())
