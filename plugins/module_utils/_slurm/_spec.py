# -*- coding: utf-8 -*-
# Copyright: mlinfra.kvm contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The Slurm modules' argument specs, beside their runners (the docs in each module say the same)."""
from __future__ import annotations

from typing import Any, Dict


def slurm_config_spec() -> Dict[str, Any]:
    # Exactly one of file (a whole GPU) and files (a MIG device): _conf.gpu_files says which is
    # missing or doubled, naming the node and the GPU, which Ansible's own check would not.
    gpu = dict(file=dict(type="path"), files=dict(type="list", elements="path"), type=dict(type="str"))
    node = dict(name=dict(type="str", required=True), address=dict(type="str"), cpus=dict(type="int"),
                memory_mb=dict(type="int"),
                gpus=dict(type="list", elements="dict", default=[], options=gpu),
                shards=dict(type="int", default=0), features=dict(type="list", elements="str", default=[]))
    partition = dict(name=dict(type="str", required=True), nodes=dict(type="list", elements="str"),
                     default=dict(type="bool", default=False), max_time=dict(type="str"))
    paths = dict(state_save=dict(type="path", default="/var/lib/slurm/slurmctld"),
                 spool=dict(type="path", default="/var/lib/slurm/slurmd"),
                 run=dict(type="path", default="/run/slurm"), log=dict(type="path", default="/var/log/slurm"))
    return dict(
        config_dir=dict(type="path", default="/etc/slurm"),
        cluster_name=dict(type="str", required=True),
        controller=dict(type="dict", required=True, options=dict(host=dict(type="str", required=True),
                                                                 address=dict(type="str"))),
        slurmctld_port=dict(type="int", default=6817),
        slurmd_port=dict(type="int", default=6818),
        slurm_user=dict(type="str", default="slurm"),
        munge_socket=dict(type="path"),
        accounting=dict(type="dict", options=dict(host=dict(type="str", required=True), port=dict(type="int", default=6819))),
        nodes=dict(type="list", elements="dict", required=True, options=node),
        partitions=dict(type="list", elements="dict", required=True, options=partition),
        proctrack=dict(type="str", choices=["cgroup", "linuxproc"], default="cgroup"),
        cgroup_plugin=dict(type="str", choices=["autodetect", "cgroup/v1", "cgroup/v2"], default="autodetect"),
        paths=dict(type="dict", default={}, options=paths),
        extra=dict(type="dict", default={}),
        local_node=dict(type="str"),
    )


def slurm_job_spec() -> Dict[str, Any]:
    mlflow = dict(tracking_uri=dict(type="str", required=True), run_id=dict(type="str"),
                  username=dict(type="str"), password=dict(type="str", no_log=True),
                  token=dict(type="str", no_log=True), ca_path=dict(type="path"))
    return dict(
        name=dict(type="str", required=True),
        state=dict(type="str", choices=["running", "completed", "failed", "absent"], default="running"),
        partition=dict(type="str"),
        account=dict(type="str"),
        qos=dict(type="str"),
        nodes=dict(type="int", default=1),
        nodelist=dict(type="list", elements="str", default=[]),
        gpus_per_node=dict(type="int", default=0),
        cpus_per_node=dict(type="int"),
        time_limit=dict(type="str"),
        comment=dict(type="str"),
        wait_timeout=dict(type="int", default=3600),
        poll_interval=dict(type="float", default=5.0),
        mlflow=dict(type="dict", options=mlflow),
        conf=dict(type="path"),
        command_timeout=dict(type="int", default=60),
    )


def slurm_accounts_spec() -> Dict[str, Any]:
    state = dict(type="str", choices=["present", "absent"], default="present")
    qos = dict(name=dict(type="str", required=True), max_gpus=dict(type="int"), max_wall=dict(type="str"),
               priority=dict(type="int"), state=state)
    account = dict(name=dict(type="str", required=True), description=dict(type="str"),
                   organization=dict(type="str"), parent=dict(type="str", default="root"),
                   qos=dict(type="list", elements="str"), state=state)
    user = dict(name=dict(type="str", required=True), accounts=dict(type="list", elements="str", default=[]),
                default_account=dict(type="str"), state=state)
    return dict(
        cluster=dict(type="str", required=True),
        qos=dict(type="list", elements="dict", default=[], options=qos),
        accounts=dict(type="list", elements="dict", default=[], options=account),
        users=dict(type="list", elements="dict", default=[], options=user),
        conf=dict(type="path"),
        command_timeout=dict(type="int", default=30),
    )
