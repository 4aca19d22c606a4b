"""The Slurm cluster as data (_slurm/_conf.py): what slurmctld would reject is refused naming the
option, the value and the fix; the files rendered from one request; which changes need a restart."""
from __future__ import annotations

import copy

import pytest

from ansible_collections.mlinfra.kvm.plugins.module_utils._core._errors import InvalidInputError
from ansible_collections.mlinfra.kvm.plugins.module_utils._slurm import _conf, _config_runner

pytestmark = pytest.mark.unit

BASE = {
    "cluster_name": "lab", "controller": {"host": "tracking", "address": "192.168.130.10"},
    "slurmctld_port": 6817, "slurmd_port": 6818, "slurm_user": "slurm", "munge_socket": None,
    "accounting": {"host": "tracking", "port": 6819},
    "nodes": [{"name": "worker1", "address": "192.168.130.11", "cpus": 8, "memory_mb": 30000, "shards": 0,
               "features": [], "gpus": [{"file": "/dev/nvidia0", "type": "h200"}, {"file": "/dev/nvidia1", "type": "h200"}]},
              {"name": "worker2", "address": "192.168.130.12", "cpus": 8, "memory_mb": 30000, "shards": 4,
               "features": ["nvlink"], "gpus": [{"file": "/dev/nvidia0", "type": None}]}],
    "partitions": [{"name": "gpu", "nodes": None, "default": True, "max_time": "1-00:00:00"},
                   {"name": "big", "nodes": ["worker1"], "default": False, "max_time": None}],
    "proctrack": "cgroup", "cgroup_plugin": "autodetect",
    "paths": {"state_save": "/var/lib/slurm/slurmctld", "spool": "/var/lib/slurm/slurmd", "run": "/run/slurm",
              "log": "/var/log/slurm"},
    "extra": {}, "local_node": None,
}


def req(**over):
    r = copy.deepcopy(BASE)
    r.update(over)
    return r


def test_a_sound_cluster_renders_one_node_line_per_node_and_one_gres_line_per_gpu():
    _conf.check_cluster(req())
    files = _conf.render_all(req())
    conf = files["slurm.conf"].splitlines()
    assert "NodeName=worker1 NodeAddr=192.168.130.11 CPUs=8 RealMemory=30000 Gres=gpu:h200:2 State=UNKNOWN" in conf
    assert ("NodeName=worker2 NodeAddr=192.168.130.12 CPUs=8 RealMemory=30000 Gres=gpu:1,shard:4 Features=nvlink "
            "State=UNKNOWN") in conf
    assert "PartitionName=gpu Nodes=worker1,worker2 Default=YES MaxTime=1-00:00:00 State=UP" in conf
    assert "PartitionName=big Nodes=worker1 Default=NO MaxTime=INFINITE State=UP" in conf
    assert "GresTypes=gpu,shard" in conf and "SlurmctldHost=tracking(192.168.130.10)" in conf
    assert "SelectTypeParameters=CR_Core_Memory" in conf and "ProctrackType=proctrack/cgroup" in conf
    assert "AccountingStorageTRES=gres/gpu,gres/shard" in conf
    assert files["gres.conf"].splitlines()[1:] == [
        "NodeName=worker1 Name=gpu Type=h200 File=/dev/nvidia0",
        "NodeName=worker1 Name=gpu Type=h200 File=/dev/nvidia1",
        "NodeName=worker2 Name=gpu File=/dev/nvidia0",
        "NodeName=worker2 Name=shard Count=4"]
    assert "ConstrainDevices=yes" in files["cgroup.conf"]


# A node with two MIG devices of its first H200 (GPU instances 1 and 2, each with compute instance 0;
# their capability minors as tests/fixtures/mig/mig-minors gives them) and a whole second H200.
MIG_NODE = {"name": "worker3", "address": "192.168.130.13", "cpus": 8, "memory_mb": 30000, "shards": 0, "features": [],
            "gpus": [{"file": None, "type": "3g.71gb",
                      "files": ["/dev/nvidia0", "/dev/nvidia-caps/nvidia-cap12", "/dev/nvidia-caps/nvidia-cap13"]},
                     {"file": None, "type": "1g.18gb",
                      "files": ["/dev/nvidia0", "/dev/nvidia-caps/nvidia-cap21", "/dev/nvidia-caps/nvidia-cap22"]},
                     {"file": "/dev/nvidia1", "type": "nvidia_h200", "files": None}]}


def test_a_node_with_two_mig_devices_and_a_whole_gpu_renders_multiple_files_and_typed_counts():
    request = req(nodes=copy.deepcopy(BASE["nodes"]) + [copy.deepcopy(MIG_NODE)])
    _conf.check_cluster(request)
    files = _conf.render_all(request)
    assert ("NodeName=worker3 NodeAddr=192.168.130.13 CPUs=8 RealMemory=30000 Gres=gpu:3g.71gb:1,gpu:1g.18gb:1,gpu:nvidia_h200:1 "
            "State=UNKNOWN") in files["slurm.conf"].splitlines()
    assert [line for line in files["gres.conf"].splitlines() if line.startswith("NodeName=worker3")] == [
        "NodeName=worker3 Name=gpu Type=3g.71gb MultipleFiles=/dev/nvidia0,/dev/nvidia-caps/nvidia-cap12,/dev/nvidia-caps/nvidia-cap13",
        "NodeName=worker3 Name=gpu Type=1g.18gb MultipleFiles=/dev/nvidia0,/dev/nvidia-caps/nvidia-cap21,/dev/nvidia-caps/nvidia-cap22",
        "NodeName=worker3 Name=gpu Type=nvidia_h200 File=/dev/nvidia1"]


def mig_broken(gpu: int, **over):
    node = copy.deepcopy(MIG_NODE)
    node["gpus"][gpu].update(over)
    return req(nodes=[node])


@pytest.mark.parametrize("request_,option,words", [
    (mig_broken(0, file="/dev/nvidia0"), "nodes[0].gpus[0]", "gives both file and files"),
    (mig_broken(2, file=None), "nodes[0].gpus[2]", "gives neither file nor files"),
    (mig_broken(0, files=[]), "nodes[0].gpus[0].files", "is empty"),
    (mig_broken(0, files=["/dev/nvidia0", "nvidia-cap12"]), "nodes[0].gpus[0].files[1]", "not an absolute device path"),
    (mig_broken(0, files=["/dev/nvidia0", "/dev/nvidia-caps/nvidia-cap12,13"]), "nodes[0].gpus[0].files[1]", "separator"),
    (mig_broken(0, files=["/dev/nvidia0", "/dev/nvidia0"]), "nodes[0].gpus[0].files[1]", "listed twice"),
    (mig_broken(1, files=["/dev/nvidia0", "/dev/nvidia-caps/nvidia-cap12", "/dev/nvidia-caps/nvidia-cap22"]),
     "nodes[0].gpus[1].files[1]", "also gpus[0]'s device"),
    (mig_broken(2, file="/dev/nvidia0"), "nodes[0].gpus[2].file", "also gpus[0]'s device"),
    (mig_broken(2, type=None), "nodes[0].gpus", "mixes typed and untyped GPUs"),
])
def test_mig_devices_slurmctld_would_reject_are_refused_naming_the_option(request_, option, words):
    with pytest.raises(InvalidInputError) as err:
        _conf.check_cluster(request_)
    assert "option %s" % option in str(err.value.msg) and words in err.value.msg, err.value.msg


def test_without_systemd_the_cluster_tracks_processes_without_cgroups():
    conf = _conf.render_slurm_conf(req(proctrack="linuxproc"))
    assert "ProctrackType=proctrack/linuxproc" in conf and "TaskPlugin=task/none" in conf
    assert "ConstrainDevices" not in _conf.render_cgroup_conf(req(proctrack="linuxproc"))


def broken(path, value):
    r = req()
    target = r
    for key in path[:-1]:
        target = target[key]
    target[path[-1]] = value
    return r


@pytest.mark.parametrize("request_,option,words", [
    (broken(["partitions", 1, "nodes"], ["worker9"]), "partitions[1].nodes", "not a declared node"),
    (broken(["nodes", 1, "address"], "192.168.130.11"), "nodes[1].address", "also node worker1's address"),
    (broken(["nodes", 1, "name"], "worker1"), "nodes[1].name", "declared twice"),
    (broken(["nodes", 0, "gpus", 1, "file"], "nvidia1"), "nodes[0].gpus[1].file", "not an absolute device path"),
    (broken(["nodes", 0, "gpus", 1, "file"], "/dev/nvidia0"), "nodes[0].gpus[1].file", "also gpus[0]'s device"),
    (broken(["nodes", 0, "gpus", 0, "type"], "a:b"), "nodes[0].gpus[0].type", "not a GRES type"),
    (broken(["nodes", 0, "cpus"], 0), "nodes[0].cpus", "below 1"),
    (broken(["partitions", 1, "default"], True), "partitions", "more than one default"),
    (broken(["partitions", 0, "max_time"], "1 day"), "partitions[0].max_time", "space"),
    (broken(["cluster_name"], "my lab"), "cluster_name", "not a Slurm name"),
    (broken(["nodes"], []), "nodes", "is empty"),
    (broken(["partitions"], []), "partitions", "is empty"),
    (broken(["extra"], {"SlurmctldPort": "7000"}), "extra.SlurmctldPort", "set by this module"),
    (broken(["extra"], {"Bad-Key": "1"}), "extra", "not a slurm.conf key"),
    (broken(["extra"], {"MaxJobCount": "10 # x"}), "extra.MaxJobCount", "space"),
    (broken(["nodes", 0, "shards"], -1), "nodes[0].shards", "negative"),
])
def test_what_slurmctld_would_reject_is_refused_naming_the_option(request_, option, words):
    with pytest.raises(InvalidInputError) as err:
        _conf.check_cluster(request_)
    assert "option %s" % option in str(err.value.msg) and words in err.value.msg, err.value.msg


def test_a_new_partition_needs_only_a_reconfigure():
    before = _conf.render_all(req())
    after = _conf.render_all(req(partitions=BASE["partitions"] + [{"name": "debug", "nodes": ["worker2"],
                                                                   "default": False, "max_time": "30"}]))
    assert _conf.daemons_to_restart(before, after) == ([], True)


def test_a_new_node_a_gres_change_or_a_port_change_needs_every_daemon_restarted():
    before = _conf.render_all(req())
    more = copy.deepcopy(BASE["nodes"]) + [{"name": "worker3", "address": "192.168.130.13", "gpus": []}]
    assert _conf.daemons_to_restart(before, _conf.render_all(req(nodes=more)))[0] == ["slurmctld", "slurmd"]
    fewer_gpus = copy.deepcopy(BASE["nodes"])
    fewer_gpus[0]["gpus"] = fewer_gpus[0]["gpus"][:1]
    assert _conf.daemons_to_restart(before, _conf.render_all(req(nodes=fewer_gpus)))[0] == ["slurmctld", "slurmd"]
    assert _conf.daemons_to_restart(before, _conf.render_all(req(slurmd_port=7000)))[0] == ["slurmctld", "slurmd"]


def test_a_cgroup_change_restarts_slurmd_only_and_no_change_needs_nothing():
    before = _conf.render_all(req())
    assert _conf.daemons_to_restart(before, _conf.render_all(req(cgroup_plugin="cgroup/v2"))) == (["slurmd"], False)
    assert _conf.daemons_to_restart(before, _conf.render_all(req())) == ([], False)
    first = {name: None for name in before}
    assert _conf.daemons_to_restart(first, before)[0] == ["slurmctld", "slurmd"]


def test_the_config_service_writes_atomically_and_knows_a_device_from_a_file(tmp_path):
    files = _config_runner.SlurmConfigFiles(str(tmp_path / "etc"))
    assert files.read("slurm.conf") is None
    files.write("slurm.conf", "ClusterName=x\n")
    assert files.read("slurm.conf") == "ClusterName=x\n"
    assert oct((tmp_path / "etc" / "slurm.conf").stat().st_mode & 0o777) == "0o644"
    assert not files.is_char_device(str(tmp_path / "etc" / "slurm.conf")) and files.is_char_device("/dev/null")
    assert files.host_cpus() >= 1 and files.host_memory_mb() > 0
