"""slurm_config as a module process on a temporary directory (no daemon): four ways, diff,
refusals that write nothing, and the checks only the node's own host can make (its GPUs are
character devices there; its CPUs and memory against the host's)."""
from __future__ import annotations

import os
from pathlib import Path

import pytest

from conftest import four_ways, run_module_process

pytestmark = pytest.mark.unit


def gpu_device(tmp_path: Path, index: int) -> str:
    path = tmp_path / ("nvidia%d" % index)
    os.mknod(str(path), 0o600 | 0o020000, os.makedev(195, index))
    return str(path)


def args(tmp_path: Path, **over):
    a = {"config_dir": str(tmp_path / "etc"), "cluster_name": "lab", "controller": {"host": "head"},
         "nodes": [{"name": "w1", "cpus": 1, "gpus": [{"file": gpu_device(tmp_path, 0) if not (tmp_path / "nvidia0").exists()
                                                       else str(tmp_path / "nvidia0"), "type": "h200"}]},
                   {"name": "w2", "cpus": 1}],
         "partitions": [{"name": "gpu", "default": True}], "local_node": "w1", "proctrack": "linuxproc"}
    a.update(over)
    return a


def test_four_ways_then_a_partition_change_asks_for_a_reconfigure(tmp_path):
    predicted = run_module_process("slurm_config", args(tmp_path), check=True)
    assert predicted["changed"] and not (tmp_path / "etc").exists()
    runs = four_ways("slurm_config", args(tmp_path))
    assert runs["check"]["changed"] and runs["check"]["files"] == predicted["files"]
    assert runs["apply"]["changed"] and runs["apply"]["restart_required"] == ["slurmctld", "slurmd"]
    assert sorted(p.name for p in (tmp_path / "etc").iterdir()) == ["cgroup.conf", "gres.conf", "slurm.conf"]
    assert not runs["check_again"]["changed"] and not runs["apply_again"]["changed"]
    assert runs["apply_again"]["files"] == [] and runs["apply_again"]["local_mismatch"] == []
    more = args(tmp_path, partitions=[{"name": "gpu", "default": True}, {"name": "small", "nodes": ["w2"]}])
    diffed = run_module_process("slurm_config", more, check=True, diff=True)
    assert diffed["changed"] and diffed["reconfigure_required"] and diffed["restart_required"] == []
    assert "PartitionName=small Nodes=w2" in diffed["diff"][0]["after"]
    assert "PartitionName=small" not in (tmp_path / "etc" / "slurm.conf").read_text()


def test_a_gpu_this_host_does_not_have_is_refused_and_nothing_is_written(tmp_path):
    bad = args(tmp_path)
    bad["nodes"][0]["gpus"].append({"file": str(tmp_path / "nvidia7"), "type": "h200"})
    for check in (True, False):
        res = run_module_process("slurm_config", bad, check=check)
        assert res["failed"] and "nodes[0].gpus[1].file" in res["msg"] and "does not have this GPU" in res["msg"], res
    assert not (tmp_path / "etc").exists()


def test_more_cpus_than_the_host_has_is_a_mismatch_to_drain_not_an_error(tmp_path):
    many = args(tmp_path)
    many["nodes"][0]["cpus"] = 4096
    res = run_module_process("slurm_config", many)
    assert not res["failed"] and res["local_mismatch"] and "declared 4096 CPUs" in res["local_mismatch"][0], res


def test_an_unknown_local_node_is_refused(tmp_path):
    res = run_module_process("slurm_config", args(tmp_path, local_node="w9"))
    assert res["failed"] and "local_node" in res["msg"] and "w1, w2" in res["msg"]


def cap_device(tmp_path: Path, minor: int) -> str:
    """A stand-in for /dev/nvidia-caps/nvidia-capN (a character device, as the driver makes it)."""
    path = tmp_path / ("nvidia-cap%d" % minor)
    os.mknod(str(path), 0o400 | 0o020000, os.makedev(237, minor))
    return str(path)


def mig_args(tmp_path: Path, ci_cap: str):
    parent = gpu_device(tmp_path, 0)
    return args(tmp_path, nodes=[{"name": "w1", "cpus": 1, "gpus": [
        {"type": "3g.71gb", "files": [parent, cap_device(tmp_path, 12), ci_cap]}]}])


def test_a_mig_device_whose_capability_file_this_host_lacks_is_refused_and_nothing_is_written(tmp_path):
    missing = str(tmp_path / "nvidia-cap13")
    for check in (True, False):
        (tmp_path / str(check)).mkdir()
        res = run_module_process("slurm_config", mig_args(tmp_path / str(check), missing), check=check)
        assert res["failed"] and "option nodes[0].gpus[0].files[2]" in res["msg"], res
        assert "does not have this MIG device" in res["msg"] and missing in res["msg"], res
        assert not (tmp_path / str(check) / "etc").exists()


def test_a_mig_device_this_host_has_is_written_as_multiple_files(tmp_path):
    request = mig_args(tmp_path, cap_device(tmp_path, 13))
    res = run_module_process("slurm_config", request)
    assert not res["failed"] and res["changed"], res
    line = "NodeName=w1 Name=gpu Type=3g.71gb MultipleFiles=%s" % ",".join(request["nodes"][0]["gpus"][0]["files"])
    assert line in (tmp_path / "etc" / "gres.conf").read_text().splitlines()
    assert "Gres=gpu:3g.71gb:1" in (tmp_path / "etc" / "slurm.conf").read_text()


@pytest.mark.parametrize("gpu,words", [
    ({"file": "/dev/nvidia0", "files": ["/dev/nvidia0"]}, "gives both file and files"),
    ({"type": "h200"}, "gives neither file nor files"),
])
def test_a_gpu_with_both_file_and_files_or_neither_is_refused_naming_it(tmp_path, gpu, words):
    res = run_module_process("slurm_config", args(tmp_path, nodes=[{"name": "w1", "gpus": [gpu]}], local_node=None))
    assert res["failed"] and "option nodes[0].gpus[0]" in res["msg"] and words in res["msg"], res
    assert not (tmp_path / "etc").exists()
