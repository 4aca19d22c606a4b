#!/usr/bin/python
# -*- coding: utf-8 -*-
# Copyright: mlinfra.kvm contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
from __future__ import annotations

DOCUMENTATION = r'''
module: slurm_accounts
extends_documentation_fragment:
  - ansible.builtin.action_common_attributes
  - mlinfra.kvm.attributes
short_description: Slurm accounts, QOS and users in slurmdbd, declared per cluster
version_added: 0.5.0
description:
  - Makes slurmdbd's accounting for one cluster match a declaration in three lists - O(qos), O(accounts)
    and O(users) - each item with its own O(accounts[].state). Reads everything with C(sacctmgr show ...
    --parsable2) first and sends only the difference, in an order slurmdbd accepts (QOS, then parents before
    children, then users; removals the other way round). Check mode takes the same decisions from the same reads.
  - Only what an item declares is managed; an option left out is left as it is. Items not listed are never touched.
  - Refuses, before anything changes, a name slurmdbd would not keep as given (it stores names in lower case),
    a parent, QOS or account that is neither declared present nor in slurmdbd, an account removed while
    accounts still hang under it, and a cluster slurmdbd does not know. When slurmdbd does not answer, the
    error names its host and port from slurm.conf.
  - Descriptions and organizations are stored in lower case by slurmdbd and compared without case.
options:
  cluster:
    description: The cluster the associations belong to (slurm.conf's ClusterName, registered in slurmdbd).
    type: str
    required: true
  qos:
    description: Quality-of-service levels; an account's jobs may use those listed in its O(accounts[].qos).
    type: list
    elements: dict
    default: []
    suboptions:
      name:
        description: QOS name (lower case).
        type: str
        required: true
      max_gpus:
        description: GPUs all jobs under this QOS may hold at once (C(GrpTRES=gres/gpu=N)).
        type: int
      max_wall:
        description: A job's longest run time (MaxWall), in whole minutes - C(MM), C(HH:MM:00), C(D-HH:MM:00) - or C(UNLIMITED).
        type: str
      priority:
        description: The QOS priority factor.
        type: int
      state:
        description: Whether the QOS exists.
        type: str
        choices: [present, absent]
        default: present
  accounts:
    description: Accounts of the cluster, each an association under its parent.
    type: list
    elements: dict
    default: []
    suboptions:
      name:
        description: Account name (lower case; C(root) is slurmdbd's own).
        type: str
        required: true
      description:
        description: Its description.
        type: str
      organization:
        description: Its organization.
        type: str
      parent:
        description: The account it hangs under.
        type: str
        default: root
      qos:
        description: The QOS its jobs may use (the association's QOS list, replacing the inherited one).
        type: list
        elements: str
      state:
        description: Whether the account has an association in O(cluster); V(absent) removes it with its users' associations.
        type: str
        choices: [present, absent]
        default: present
  users:
    description: Users and the accounts they submit under.
    type: list
    elements: dict
    default: []
    suboptions:
      name:
        description: The user's login name.
        type: str
        required: true
      accounts:
        description: The user's accounts in O(cluster); associations with other accounts there are removed.
        type: list
        elements: str
        default: []
      default_account:
        description: The account a job uses when it names none (default, the first of O(users[].accounts)).
        type: str
      state:
        description: Whether the user has associations in O(cluster).
        type: str
        choices: [present, absent]
        default: present
  conf:
    description: slurm.conf to use (C(SLURM_CONF)); default, C(/etc/slurm/slurm.conf).
    type: path
  command_timeout:
    description: Seconds each C(sacctmgr) call may take.
    type: int
    default: 30
author:
  - mlinfra.kvm contributors (@mlinfra)
'''

EXAMPLES = r'''
- name: Two teams, each limited to 4 GPUs at once
  mlinfra.kvm.slurm_accounts:
    cluster: lab
    qos:
      - {name: team-a-gpus, max_gpus: 4, max_wall: "1-00:00:00"}
      - {name: team-b-gpus, max_gpus: 4, priority: 10}
    accounts:
      - {name: team-a, description: Vision team, qos: [normal, team-a-gpus]}
      - {name: team-b, description: Speech team, qos: [normal, team-b-gpus]}
    users:
      - {name: alice, accounts: [team-a]}
      - {name: bob, accounts: [team-a, team-b], default_account: team-b}

- name: A team leaves
  mlinfra.kvm.slurm_accounts:
    cluster: lab
    users:
      - {name: bob, state: absent}
    accounts:
      - {name: team-b, state: absent}
    qos:
      - {name: team-b-gpus, state: absent}
'''

RETURN = r'''
actions:
  description: What was done (or would be, in check mode), in order.
  type: list
  elements: str
  returned: always
cluster:
  description: The cluster the associations belong to.
  type: str
  returned: always
'''

from ansible.module_utils.basic import AnsibleModule

from ansible_collections.mlinfra.kvm.plugins.module_utils._core._module import new_module, run
from ansible_collections.mlinfra.kvm.plugins.module_utils._slurm._accounts_runner import run_slurm_accounts
from ansible_collections.mlinfra.kvm.plugins.module_utils._slurm._spec import slurm_accounts_spec


def main() -> None:
    module = new_module(AnsibleModule, argument_spec=slurm_accounts_spec(), supports_check_mode=True)
    run(module, lambda: run_slurm_accounts(module))


if __name__ == "__main__":
    main()
