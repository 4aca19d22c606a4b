# -*- coding: utf-8 -*-
# Copyright: mlinfra.kvm contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
from __future__ import annotations


class ModuleDocFragment:
    # The list options every resource-list module (networks, pools, volumes, domains) shares:
    # the states of Ansible's network resource modules and the scope that overridden needs.
    DOCUMENTATION = r'''
options:
  state:
    description:
      - V(merged) creates or updates the listed objects and leaves every other one alone.
      - V(replaced) makes each listed object exactly as declared (see O(config) for what an unset
        option means).
      - V(overridden) is V(replaced) for the listed objects, and removes every object that is not
        listed and whose key (its name; C(POOL/NAME) for a volume) starts with O(scope.name_prefix),
        with the same guards as a single removal. Refused without O(scope).
      - V(deleted) removes the listed objects (only their key counts); with an empty O(config),
        every object in O(scope).
      - V(gathered) returns the objects on the host in this module's input format (RV(gathered));
        fed back as O(config), it changes nothing. Changes nothing.
      - V(rendered) returns the libvirt XML each item defines (RV(rendered)) without contacting libvirt.
    type: str
    choices: [merged, replaced, overridden, deleted, gathered, rendered]
    default: merged
  scope:
    description:
      - The objects this list owns, for O(state=overridden) (required there) and O(state=deleted)
        with an empty O(config); also narrows O(state=gathered).
      - With O(state=merged), O(state=replaced) or O(state=overridden), every item must be in scope.
    type: dict
    suboptions:
      name_prefix:
        description:
          - The prefix of the key of the objects in scope (their name; C(POOL/NAME) for a volume,
            so that C(mlinfra-lab/) keeps a call to one pool). Never empty.
        type: str
        required: true
notes:
  - The whole list is first run in check mode; a bad item, or a refusal a run would meet, fails
    the call before anything changes, naming the item (C(config[N] (KEY))) and its option. A
    failure that only a real run can meet (libvirt refusing a call) reports C(changed=true) and
    what was done before it.
  - Items are applied in order, one after another, on one libvirt connection and in one module
    process (a loop over the single-object module starts one process per item).
  - Ordering between kinds is the play's, as with the single-object modules (pools before volumes,
    both and networks before the domains that use them).
'''
