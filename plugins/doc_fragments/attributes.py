# -*- coding: utf-8 -*-
# Copyright: mlinfra.kvm contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
from __future__ import annotations


class ModuleDocFragment:
    # How far a module supports the attributes of ansible.builtin.action_common_attributes, which
    # the module extends too, for their descriptions. ansible-core merges a module's own entry
    # over the fragment's (the module's keys win), so a module that differs states only that.
    # Every module of this collection runs on POSIX hosts.

    # A module that changes something: check mode predicts what a real run would change, and
    # diff mode shows it.
    DOCUMENTATION = r'''
attributes:
  check_mode:
    support: full
  diff_mode:
    support: full
  platform:
    platforms: posix
'''

    # A module that only reads (the *_info modules and the like).
    INFO = r'''
attributes:
  check_mode:
    support: full
    details: Changes nothing, so it runs the same in check mode.
  diff_mode:
    support: N/A
    details: Reads only; there is nothing to show a difference of.
  platform:
    platforms: posix
'''

    # The platform alone, for a module that states its own check mode and diff mode support.
    POSIX = r'''
attributes:
  platform:
    platforms: posix
'''
