#!/usr/bin/python
# -*- coding: utf-8 -*-
# Copyright: mlinfra.kvm contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
from __future__ import annotations

DOCUMENTATION = r'''
module: config_files
short_description: Directories and whole files (content, mode, owner, group) in one module run, each file checked before it replaces the old one
extends_documentation_fragment:
  - ansible.builtin.action_common_attributes
  - mlinfra.kvm.attributes
version_added: "0.3.0"
description:
  - Makes each directory of I(directories) exist with I(mode), I(owner) and I(group), then each file
    of I(files) hold exactly I(content) with its I(mode), I(owner) and I(group). A path whose content,
    mode, owner and group already match is left alone, untouched.
  - A new content goes to a temporary file beside the target. It gets its owner, group and mode
    there, then I(validate) runs on it, and only a file that passes is renamed over the target. A
    reader sees the old file or the new one, never half of one. A file that fails validation changes
    nothing, and the module fails naming it, after it has written the files before it
    (reported in C(changed_paths)).
  - One module run for many files, because each C(template) or C(copy) task that finds nothing to do
    still starts Python on the host twice (stat, then file). On a software-emulated guest that is
    8-9 seconds per file; a role's ten configuration files cost a minute and a half per play.
  - Renders nothing itself. Give the content from the controller, for example
    C(lookup('ansible.builtin.template', 'x.j2')) or C(lookup('ansible.builtin.file', 'x', rstrip=false)).
  - Handlers are notified per task, not per file. Give each file a I(tag) (for example the handler
    topic its change needs); C(changed_tags) says which tags had a change, for handlers' C(when).
options:
  directories:
    description:
      - Directories to create or correct first, in the order given (a parent before its children). An
        existing directory keeps its content; only its mode, owner and group are set.
    type: list
    elements: dict
    default: []
    suboptions:
      path:
        description: Absolute path. Its parent must exist, or be an earlier entry.
        type: path
        required: true
      mode:
        description:
          - Permission bits, read as M(ansible.builtin.copy) reads its C(mode). Either a quoted string of
            octal digits (C("0750")), a symbolic mode (C("u=rwx,g=rx,o=")), or an unquoted YAML
            number, which YAML reads as an integer (C(0750) is 488, that is 0o750).
          - A symbolic mode applies to the directory's current mode (to 0777 less the umask for a new one).
        type: raw
        required: true
      owner:
        description: User name that owns the directory.
        type: str
        default: root
      group:
        description: Group name of the directory.
        type: str
        default: root
      tag:
        description: A label returned in C(changed_tags) when this directory is created or corrected.
        type: str
  files:
    description: The files, written after the directories.
    type: list
    elements: dict
    default: []
    suboptions:
      path:
        description: Absolute path of the file. Its directory must exist or be in I(directories) (in check mode, it may be predicted by an earlier task).
        type: path
        required: true
      content:
        description: The whole content (text, written as UTF-8).
        type: str
        required: true
      mode:
        description:
          - Permission bits, read as M(ansible.builtin.copy) reads its C(mode). Either a quoted string of
            octal digits (C("0644")), a symbolic mode (C("u=rw,g=r,o=")), or an unquoted YAML
            number, which YAML reads as an integer (C(0644) is 420, that is 0o644).
          - A symbolic mode applies to the file's current mode (to 0666 less the umask for a new one).
        type: raw
        required: true
      owner:
        description: User name that owns the file.
        type: str
        default: root
      group:
        description: Group name of the file.
        type: str
        default: root
      validate:
        description:
          - Command (an argv list, no shell) run on the new content before it replaces the file;
            one element must be C(%s), the temporary file's path. A non-zero exit fails the task
            and leaves the file as it was, and so does a command that does not exist or runs past
            I(command_timeout).
          - Skipped in check mode, like M(ansible.builtin.template)'s C(validate).
        type: list
        elements: str
      tag:
        description: A label returned in C(changed_tags) when this file changes (handler topics, service names).
        type: str
  command_timeout:
    description:
      - Seconds each I(validate) command may run. One that runs longer is killed (with its child
        processes) and the task fails naming it; the file is left as it was.
    type: int
    default: 300
notes:
  - Supports check mode and diff mode (one diff per changed file).
  - The content is a module argument, so set C(no_log) on a task that writes a secret.
seealso:
  - module: ansible.builtin.template
  - module: ansible.builtin.copy
author:
  - mlinfra.kvm contributors (@mlinfra)
'''

EXAMPLES = r'''
- name: Prometheus configuration in one module run
  mlinfra.kvm.config_files:
    files:
      - path: /etc/prometheus/prometheus.yml
        content: "{{ lookup('ansible.builtin.template', 'prometheus.yml.j2') }}"
        mode: "0644"
        validate: [promtool, check, config, --syntax-only, "%s"]
        tag: prometheus reload
      - path: /etc/default/prometheus
        content: "{{ lookup('ansible.builtin.template', 'prometheus.default.j2') }}"
        mode: "0644"
        tag: prometheus restart
  register: prometheus_files
  notify: [prometheus reload, prometheus restart]

# In the handlers: act only for the files that changed.
- name: Restart Prometheus
  ansible.builtin.service:
    name: prometheus
    state: restarted
  listen: prometheus restart
  when: "'prometheus restart' in prometheus_files.changed_tags"
'''

RETURN = r'''
directories:
  description: One entry per directory, in the order given (C(changes) is C([created]) for a new one).
  returned: always
  type: list
  elements: dict
  sample: [{path: /etc/mlflow, changed: true, changes: [created], tag: null}]
files:
  description: One entry per file, in the order given.
  returned: always
  type: list
  elements: dict
  sample: [{path: /etc/default/prometheus, changed: true, changes: [content], tag: prometheus restart}]
changed_paths:
  description: Paths that changed (in check mode, that would change), directories first.
  returned: always
  type: list
  elements: str
changed_tags:
  description: The tags of the files that changed, each once, sorted.
  returned: always
  type: list
  elements: str
'''

from ansible.module_utils.basic import AnsibleModule

from ansible_collections.mlinfra.kvm.plugins.module_utils._core._config_files import config_files_spec, run_config_files
from ansible_collections.mlinfra.kvm.plugins.module_utils._core._module import new_module, run


def main() -> None:
    module = new_module(AnsibleModule, argument_spec=config_files_spec(), supports_check_mode=True)
    run(module, lambda: run_config_files(module))


if __name__ == "__main__":
    main()
