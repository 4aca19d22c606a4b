#!/usr/bin/python
# -*- coding: utf-8 -*-
# Copyright: mlinfra.kvm contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
from __future__ import annotations

DOCUMENTATION = r'''
module: slurm_job
extends_documentation_fragment:
  - ansible.builtin.action_common_attributes
  - mlinfra.kvm.attributes.posix
short_description: Hold a Slurm allocation for one stage run, found again by its name, and account for it
attributes:
  check_mode:
    support: full
  diff_mode:
    support: none
version_added: 0.5.0
description:
  - A stage that runs under Slurm holds its nodes as one job (every node at once or none), starts its
    processes as steps of that job (C(srun --jobid=JOB --overlap)), then releases the job. This module
    does the holding and the releasing; the stage's own idempotence (M(mlinfra.kvm.ml_stage)) decides
    first, so a stage that skips submits nothing.
  - The job's O(name) is its identity. V(running) finds a queued or running job of that name and waits
    for it (naming its id, never submitting a second one that would write the same outputs), or submits
    one. A re-run after an interrupted play therefore attaches to the job the first run left.
  - Before a job is submitted, the request is checked against the cluster, in check mode too - the
    controller answers (else its host and port are named), the partition, account and QOS exist, the
    listed nodes belong to the partition, and the partition has enough nodes and GPUs in total (a job
    that could never start is refused rather than left pending).
  - While it waits, each change of the job's state (state, reason, position in its partition's queue) is
    a line of RV(progress) and of the host's log.
  - V(completed) and V(failed) release a running job so that slurmdbd records how the stage ended
    (C(COMPLETED) or C(FAILED)), or cancel a job that is still pending; then they return the job's
    accounting from C(sacct) - elapsed time, nodes, GPU- and CPU-hours - and, with O(mlflow), log it on
    the stage's MLflow run. V(absent) cancels the job.
options:
  name:
    description: The job's name (a stage's key, e.g. C(train-1a2b3c4d5e6f)); 1 to 128 letters, digits, C(.), C(_), C(:), C(-).
    type: str
    required: true
  state:
    description:
      - V(running) - the job is running (submitted when no job of this name is queued or running; waited for).
      - V(completed) or V(failed) - the job is released, recorded as that outcome, and its accounting returned.
      - V(absent) - no job of this name is queued or running.
    type: str
    choices: [running, completed, failed, absent]
    default: running
  partition:
    description: The partition to run in (required with O(state=running)).
    type: str
  account:
    description: The Slurm account charged (default, the user's default account).
    type: str
  qos:
    description: The QOS (default, the association's).
    type: str
  nodes:
    description: How many nodes the job holds.
    type: int
    default: 1
  nodelist:
    description: Exactly these nodes (as many as O(nodes)); default, any of the partition's.
    type: list
    elements: str
    default: []
  gpus_per_node:
    description: GPUs (C(gpu) GRES) per node; 0 for none.
    type: int
    default: 0
  cpus_per_node:
    description: CPUs per node (default, Slurm's one per task).
    type: int
  time_limit:
    description: The job's time limit in Slurm's form (C(MM), C(HH:MM:SS), C(D-HH)); default, the partition's.
    type: str
  comment:
    description: A comment stored with the job (shown by squeue and sacct).
    type: str
  wait_timeout:
    description:
      - Seconds to wait for the job to run. Past it the task fails and the job stays queued (a re-run
        waits for it again). 0 returns at once with the job's state.
    type: int
    default: 3600
  poll_interval:
    description: Seconds between reads of the queue while waiting.
    type: float
    default: 5.0
  mlflow:
    description: With O(state=completed) or O(state=failed), the MLflow run that gets the job's accounting
      (tags C(slurm.job_id), C(slurm.account), C(slurm.nodes), C(slurm.state); metrics C(slurm_gpu_hours),
      C(slurm_cpu_hours), C(slurm_elapsed_s)).
    type: dict
    suboptions:
      tracking_uri:
        description: The tracking server.
        type: str
        required: true
      run_id:
        description: The run; nothing is logged when it is empty.
        type: str
      username:
        description: Basic-auth user.
        type: str
      password:
        description: Basic-auth password.
        type: str
      token:
        description: Bearer token.
        type: str
      ca_path:
        description: CA bundle the server's certificate is checked against.
        type: path
  conf:
    description: slurm.conf to use (C(SLURM_CONF)); default, Slurm's own (C(/etc/slurm/slurm.conf)).
    type: path
  command_timeout:
    description: Seconds each Slurm command may take before it is killed and the task fails naming it.
    type: int
    default: 60
author:
  - mlinfra.kvm contributors (@mlinfra)
'''

EXAMPLES = r'''
- name: Hold both workers for the train stage (one GPU each)
  mlinfra.kvm.slurm_job:
    name: "train-{{ plan.key[:12] }}"
    partition: gpu
    account: team-a
    nodes: 2
    nodelist: [worker1, worker2]
    gpus_per_node: 1
    time_limit: "02:00:00"
  register: allocation

- name: Release it and log its GPU-hours on the stage's MLflow run
  mlinfra.kvm.slurm_job:
    name: "train-{{ plan.key[:12] }}"
    state: completed
    mlflow:
      tracking_uri: https://tracking:5000
      run_id: "{{ train.mlflow_run_id }}"
'''

RETURN = r'''
job_id:
  description: The job's id (null in check mode before a submission, or when there is none).
  type: str
  returned: always
state:
  description: The job's state (V(running)) or its final state in the accounting (V(completed), V(failed)).
  type: str
  returned: when a job exists
reason:
  description: Slurm's reason while it is pending (C(Resources), C(Priority), ...).
  type: str
  returned: with state=running
nodes:
  description: The job's nodes, expanded.
  type: list
  elements: str
  returned: when a job exists
account:
  description: The account charged.
  type: str
  returned: when a job exists
partition:
  description: The job's partition.
  type: str
  returned: with state=running
attached:
  description: True when the job was already queued or running under this name (not submitted by this run).
  type: bool
  returned: when it was
predecessor:
  description: The last job of this name when it did not complete (C(job_id), C(state)), reported when a new one is submitted.
  type: dict
  returned: when there is one
elapsed_s:
  description: The job's elapsed seconds, from sacct.
  type: int
  returned: with state=completed or state=failed
gpus:
  description: GPUs the job held (its C(gres/gpu) TRES).
  type: int
  returned: with state=completed or state=failed
gpu_hours:
  description: GPUs held times elapsed hours, from sacct.
  type: float
  returned: with state=completed or state=failed
cpu_hours:
  description: CPUs held times elapsed hours, from sacct.
  type: float
  returned: with state=completed or state=failed
exit_code:
  description: The job's exit code from sacct (C(0:0) for a stage released as completed).
  type: str
  returned: with state=completed or state=failed
progress:
  description: One line per change of the job's state while the task waited.
  type: list
  elements: str
  returned: always
actions:
  description: What was done (submit, release, cancel, log).
  type: list
  elements: str
  returned: always
'''

from ansible.module_utils.basic import AnsibleModule

from ansible_collections.mlinfra.kvm.plugins.module_utils._core._module import new_module, run
from ansible_collections.mlinfra.kvm.plugins.module_utils._slurm._job_runner import run_slurm_job
from ansible_collections.mlinfra.kvm.plugins.module_utils._slurm._spec import slurm_job_spec


def main() -> None:
    module = new_module(AnsibleModule, argument_spec=slurm_job_spec(), supports_check_mode=True,
                        required_if=[("state", "running", ["partition"])])
    run(module, lambda: run_slurm_job(module))


if __name__ == "__main__":
    main()
