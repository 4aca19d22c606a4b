#!/usr/bin/python
# -*- coding: utf-8 -*-
# Copyright: mlinfra.kvm contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
from __future__ import annotations

DOCUMENTATION = r'''
module: mlflow_user
short_description: An MLflow tracking server's basic-auth user and its experiment permissions
extends_documentation_fragment:
  - ansible.builtin.action_common_attributes
  - mlinfra.kvm.attributes
version_added: "0.2.0"
description:
  - Keeps one user of an MLflow tracking server that runs MLflow's basic-auth app
    (C(mlflow server --app-name basic-auth), as the role C(mlinfra.kvm.mlflow_server) sets it up) as
    declared. It logs in as the server's admin; the user's password is never read back. It is
    compared by asking the server, as the user, who the user is.
  - The reason for it is least privilege. A pipeline's stages then log their runs as a user that
    can edit only the pipeline's experiment, not as the admin account.
  - Direct grants only. A user's experiment permissions sit on a role of the user's own. Grants
    through other MLflow roles are not read or changed. MLflow cannot update a grant in place,
    so a changed permission is revoked and granted again, and between the two calls the user has
    the server's default permission on that experiment.
  - Check mode reads the server and predicts every action; nothing is written. Diff mode shows
    the user's admin flag and experiment permissions before and after; a password change
    shows only that the password changes.
  - After a failure midway, the result says which actions were done (C(actions)), which one
    failed (C(failed_action)) and which were not done (C(actions_left)), as every module of the
    collection reports a partial change. C(changed) is true when any was done. A re-run completes
    the rest.
options:
  tracking_uri:
    description: URL of the tracking server, e.g. C(http://mlflow.lab:5000).
    type: str
    required: true
  admin_username:
    description: The server's admin user (C(admin_username) of its basic-auth ini).
    type: str
    required: true
  admin_password:
    description: The admin's password.
    type: str
    required: true
  name:
    description:
      - The user to manage. It cannot be the admin account itself, and it cannot contain C(:),
        because basic auth sends C(user:password).
    type: str
    required: true
  password:
    description:
      - The user's password, at least 12 characters (MLflow's own minimum). Required with
        O(state=present).
    type: str
  update_password:
    description:
      - V(always) sets the password whenever the server does not accept it for the user.
        V(on_create) sets it only when the user is created.
    type: str
    choices: [always, on_create]
    default: always
  state:
    description: V(present) creates or updates the user; V(absent) deletes it with its grants.
    type: str
    choices: [present, absent]
    default: present
  is_admin:
    description: Whether the user is an MLflow admin (all permissions everywhere).
    type: bool
    default: false
  experiment_permissions:
    description:
      - Permissions of the user on experiments, by experiment name. A grant that differs is
        changed; grants on experiments that are not listed stay, unless
        O(purge_experiment_permissions) is set.
    type: list
    elements: dict
    default: []
    suboptions:
      experiment:
        description: Experiment name.
        type: str
        required: true
      permission:
        description:
          - V(EDIT) lets the user create and update runs, log metrics and upload artifacts;
            V(READ) only read; V(MANAGE) also grant permissions to others; V(USE), V(DENY)
            and V(NO_PERMISSIONS) are MLflow's other levels.
        type: str
        choices: [READ, USE, EDIT, MANAGE, NO_PERMISSIONS, DENY]
        default: EDIT
  create_experiments:
    description:
      - Create a listed experiment that does not exist yet (as the admin), then grant on it.
        With V(false), a missing experiment is an error, before anything changes.
    type: bool
    default: true
  purge_experiment_permissions:
    description:
      - Revoke the user's direct grants on experiments that O(experiment_permissions) does not
        list. The grant MLflow gives a user on an experiment it created itself (V(MANAGE)) is
        such a grant too.
    type: bool
    default: false
  timeout:
    description: Seconds for each REST call (1 to 3600).
    type: float
    default: 30
  validate_certs:
    description: Verify the server's TLS certificate (https URLs).
    type: bool
    default: true
  ca_path:
    description:
      - A PEM file of CA certificates on the host the module runs on, e.g. the private CA that
        signed an C(https://) tracking server's certificate. The server's certificate must chain
        to one of them; the system's CAs are not used then. Every call uses it, as the admin and
        as the user when the password is compared.
      - An absolute path to a readable regular file holding at least one certificate. This is
        checked before any call, whatever the URL's scheme. With an C(http://) O(tracking_uri)
        it is not used (a site may switch to https later).
      - Ignored when O(validate_certs=false).
    type: path
    version_added: 0.3.0
notes:
  - Needs MLflow 3's auth API (C(/api/3.0/mlflow/users/permissions/*)); MLflow 3.17 was tested.
  - "Runs wherever the tracking server can be reached: on the tracking VM itself, as
    the role C(mlinfra.kvm.mlflow_server) runs it, or on the controller (C(delegate_to: localhost)). It
    needs no mlflow package."
author:
  - mlinfra.kvm contributors (@mlinfra)
'''

EXAMPLES = r'''
- name: A pipeline's own user, allowed to edit its experiment only
  mlinfra.kvm.mlflow_user:
    tracking_uri: http://192.168.150.10:5000
    admin_username: admin
    admin_password: "{{ mlflow_admin_password }}"
    name: pipeline-nightly
    password: "{{ lookup('ansible.builtin.password', '.secrets/pipeline-nightly', length=32) }}"
    experiment_permissions:
      - experiment: nightly
        permission: EDIT
    purge_experiment_permissions: true
  delegate_to: localhost
  no_log: true

- name: The same user on a tracking server that serves https with a certificate of a private CA
  mlinfra.kvm.mlflow_user:
    tracking_uri: https://mlflow.lab:5443
    ca_path: /etc/mlinfra/mlflow-ca.pem
    admin_username: admin
    admin_password: "{{ mlflow_admin_password }}"
    name: pipeline-nightly
    password: "{{ lookup('ansible.builtin.password', '.secrets/pipeline-nightly', length=32) }}"
    experiment_permissions:
      - experiment: nightly
        permission: EDIT
  no_log: true

- name: Remove a user that is no longer needed
  mlinfra.kvm.mlflow_user:
    tracking_uri: http://192.168.150.10:5000
    admin_username: admin
    admin_password: "{{ mlflow_admin_password }}"
    name: pipeline-old
    state: absent
  delegate_to: localhost
'''

RETURN = r'''
user:
  description: The user as it is after the run (as it would be, in check mode).
  returned: always
  type: dict
  contains:
    name:
      description: User name.
      type: str
    exists:
      description: Whether the user exists.
      type: bool
    is_admin:
      description: Whether the user is an MLflow admin (only when it exists).
      type: bool
    experiment_permissions:
      description: Experiment name to permission, direct grants only (only when it exists).
      type: dict
  sample: {name: pipeline-nightly, exists: true, is_admin: false, experiment_permissions: {nightly: EDIT}}
actions:
  description:
    - What the module did (or, in check mode, would do), in order.
    - After a failure midway, the actions that were done before it.
  returned: always, and on a failure after a change
  type: list
  elements: str
  sample: ["create user pipeline-nightly", "grant EDIT on experiment nightly to user pipeline-nightly"]
failed_action:
  description: After a failure of a write, the action that failed.
  returned: failure
  type: str
actions_left:
  description: After a failure of a write, the action that failed and those after it.
  returned: failure
  type: list
  elements: str
'''

from ansible.module_utils.basic import AnsibleModule

from ansible_collections.mlinfra.kvm.plugins.module_utils._core._module import new_module, run
from ansible_collections.mlinfra.kvm.plugins.module_utils._ml._mlflow_user import REQUIRED_IF, argument_spec, run_mlflow_user


def main() -> None:
    module = new_module(AnsibleModule, argument_spec=argument_spec(), supports_check_mode=True, required_if=REQUIRED_IF)
    run(module, lambda: run_mlflow_user(module))


if __name__ == "__main__":
    main()
