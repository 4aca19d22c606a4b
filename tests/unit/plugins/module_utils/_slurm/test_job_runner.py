"""What slurm_job reads from Slurm's output (_slurm/_job_runner.py, _slurm/_cli.py): TRES counts,
a node's GPUs from its Gres, squeue/sacct tables and scontrol records. The job's whole life runs
against real daemons in tests/integration/test_slurm_job.py."""
from __future__ import annotations

import pytest

from ansible_collections.mlinfra.kvm.plugins.module_utils._slurm import _cli, _job_runner, _spec

pytestmark = pytest.mark.unit


@pytest.mark.parametrize("tres,key,count", [
    ("billing=2,cpu=2,gres/gpu=2,node=2", "gres/gpu", 2),
    ("billing=2,cpu=2,gres/gpu=2,node=2", "cpu", 2),
    ("billing=1,cpu=1,node=1", "gres/gpu", 0),
    ("", "gres/gpu", 0),
    ("cpu=x", "cpu", 0),
])
def test_tres_count(tres, key, count):
    assert _job_runner.tres_count(tres, key) == count


@pytest.mark.parametrize("gres,gpus", [
    ("gpu:h200:2,shard:4", 2), ("gpu:1", 1), ("gpu:1g.18gb:3,gpu:h200:1", 4), ("(null)", 0), ("", 0),
    ("gpu:h200:2(S:0-1)", 2),
])
def test_gres_gpus(gres, gpus):
    assert _job_runner.gres_gpus(gres) == gpus


def test_squeue_rows_and_scontrol_records_are_parsed():
    rows = _cli.parse_pipe_table("7|train-a|PENDING|Resources||team-b|gpu|root\n\n", _cli.SlurmCli.SQUEUE_FIELDS)
    assert rows == [{"id": "7", "name": "train-a", "state": "PENDING", "reason": "Resources", "nodes": "",
                     "account": "team-b", "partition": "gpu", "user": "root"}]
    record = _cli.parse_key_values("NodeName=w1 Arch=x86_64 Gres=gpu:1 State=IDLE+DRAIN Reason=gpu count 0 of 1 "
                                   "[root@2026-12-05T10:00:00]")
    assert record["NodeName"] == "w1" and record["Gres"] == "gpu:1" and record["State"] == "IDLE+DRAIN"
    assert record["Reason"] == "gpu count 0 of 1 [root@2026-12-05T10:00:00]"


def test_the_controller_is_named_from_slurm_conf_itself(tmp_path):
    conf = tmp_path / "slurm.conf"
    conf.write_text("ClusterName=x\nSlurmctldHost=head(10.0.0.1)\nSlurmctldHost=backup\nSlurmctldPort=7817 # ours\n")
    assert _cli.SlurmCli(str(conf)).controller_address() == "head(10.0.0.1) port 7817"
    assert "unreadable" in _cli.SlurmCli(str(tmp_path / "missing.conf")).controller_address()


def test_the_job_spec_requires_a_name_and_knows_its_states():
    spec = _spec.slurm_job_spec()
    assert spec["name"]["required"] and spec["state"]["choices"] == ["running", "completed", "failed", "absent"]
    assert spec["mlflow"]["options"]["password"]["no_log"] and spec["mlflow"]["options"]["token"]["no_log"]


class RecordedCli(_cli.SlurmCli):
    """A SlurmCli whose commands answer with recorded Slurm output (by the command's first word)."""

    def __init__(self, answers):
        super().__init__(conf=None)
        self.answers = answers
        self.calls = []

    def run(self, argv, check=True, timeout_s=None):
        self.calls.append(list(argv))
        if argv[:3] == ["scontrol", "show", "hostnames"]:
            return 0, {"sl1cn[1-2]": "sl1cn1\nsl1cn2\n", "sl1cn1": "sl1cn1\n"}[argv[3]], ""
        return 0, self.answers.get(argv[0], ""), ""


class Module:
    check_mode = False

    def __init__(self, **params):
        self.params = dict({"name": "train-x", "state": "failed", "mlflow": None, "poll_interval": 1,
                            "wait_timeout": 60}, **params)

    def log(self, line):
        pass


# sacct --allocations output of a released two-node job whose NodeList names the first node alone,
# as slurmdbd was seen recording it under load, with a step row that a fuller query would add.
SACCT_PARTIAL = ("5|train-x|team-a|FAILED|3|billing=2,cpu=2,gres/gpu=2,node=2|sl1cn1|1:0|2026-12-07T10:00:00|"
                 "2026-12-07T10:00:03\n"
                 "5.batch|batch||FAILED|3|cpu=1,gres/gpu=1,node=1|sl1cn1|1:0|2026-12-07T10:00:00|2026-12-07T10:00:03\n")


def test_accounting_keeps_the_job_row_and_never_a_step_row():
    cli = RecordedCli({"sacct": SACCT_PARTIAL.split("\n", 1)[1]})  # only the step's row
    assert cli.accounting("5") is None
    cli = RecordedCli({"sacct": SACCT_PARTIAL})
    assert cli.accounting("5")["jobid"] == "5" and cli.accounting("5")["state"] == "FAILED"


def test_a_released_job_reports_the_nodes_the_queue_saw_it_hold():
    cli = RecordedCli({"sacct": SACCT_PARTIAL})
    runner = _job_runner.SlurmJobRunner(Module(), cli, sleep=lambda s: None)
    running = {"id": "5", "name": "train-x", "state": "RUNNING", "reason": "None", "nodes": "sl1cn[1-2]",
               "account": "team-a", "partition": "gpu", "user": "root"}
    result = runner._released(running, "failed")  # pylint: disable=protected-access
    assert result["changed"] and result["nodes"] == ["sl1cn1", "sl1cn2"], result
    assert result["state"] == "FAILED" and result["gpus"] == 2 and result["exit_code"] == "1:0"
    assert ["scancel", "--batch", "--signal", "USR2", "5"] in cli.calls
    assert any("held sl1cn[1-2]; its accounting lists sl1cn1" in line for line in runner.progress), runner.progress


def test_a_job_released_earlier_reports_the_nodes_of_its_accounting():
    cli = RecordedCli({"sacct": SACCT_PARTIAL.split("\n", maxsplit=1)[0] + "\n"})
    runner = _job_runner.SlurmJobRunner(Module(), cli, sleep=lambda s: None)
    result = runner._released(None, "failed")  # pylint: disable=protected-access
    assert not result["changed"] and result["nodes"] == ["sl1cn1"] and result["job_id"] == "5", result
    assert runner.progress == []
