"""Records the Slurm outputs that tests/unit/test_slurm_state_collector.py parses, from the real
test cluster (tests/slurm_cluster.py): one GPU job finished, one running (team-a), one pending
for Resources (team-b), node 1 drained. Run as root from tests/:
``../.venv/bin/python unit/monitoring/slurm/record_outputs.py unit/monitoring/slurm``.
Each file holds the stdout of the command the collector runs (same argv)."""
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[3]))
from slurm_cluster import Cluster  # noqa: E402


def main(out: Path) -> None:
    cluster = Cluster(Path(tempfile.mkdtemp(prefix="slurm-record-"))).start()
    try:
        first, second = cluster.node_names
        cluster.slurm("sbatch", "-A", "team-a", "--gres=gpu:1", "-o", "/dev/null", "-w", second, "--wrap", "sleep 3")
        time.sleep(6)
        cluster.slurm("scontrol", "update", "nodename=" + first, "state=drain", "reason=gpu 0 fell off the bus")
        cluster.slurm("sbatch", "-A", "team-a", "--gres=gpu:1", "-o", "/dev/null", "--wrap", "sleep 600")
        time.sleep(2)
        cluster.slurm("sbatch", "-A", "team-b", "--gres=gpu:1", "-o", "/dev/null", "--wrap", "sleep 600")
        time.sleep(4)
        (out / "recorded_at.txt").write_text("%d\n" % time.time())
        commands = {
            "scontrol_ping.txt": (["scontrol", "ping"], {}),
            "squeue.json": (["squeue", "--all", "--json"], {}),
            "sinfo.json": (["sinfo", "--json"], {}),
            "sacctmgr_cluster.txt": (["sacctmgr", "--noheader", "--parsable2", "show", "cluster", "format=Cluster"], {}),
            "sacct.txt": (["sacct", "--allocations", "--allusers", "--parsable2", "--noheader", "--starttime", "now-7days",
                           "--endtime", "now", "--format", "JobID,Account,Start,End,AllocTRES"], {"SLURM_TIME_FORMAT": "%s"}),
        }
        for name, (argv, env) in commands.items():
            proc = subprocess.run(argv, capture_output=True, text=True, timeout=60, check=True, env=dict(cluster.env, **env))
            (out / name).write_text(proc.stdout)
    finally:
        cluster.stop()


if __name__ == "__main__":
    main(Path(sys.argv[1]))
