# -*- coding: utf-8 -*-
# Copyright: mlinfra.kvm contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
from __future__ import annotations


class ModuleDocFragment:
    # Where a host module finds the host's pseudo file systems and /etc. Each is paired with its
    # argument spec entry in module_utils/_host/_sysfs.py (roots_argspec); a unit test holds the
    # two together. Tests point them at captured or synthetic trees.
    SYSFS_ROOT = r'''
options:
  sysfs_root:
    description:
      - Where sysfs is mounted. The module reads the host's devices, drivers and IOMMU groups below it.
      - A test seam; leave it unset on a host.
    type: path
    default: /sys
'''

    PROC_ROOT = r'''
options:
  proc_root:
    description:
      - Where procfs is mounted. The module reads the host's state below it (see the notes for which files).
      - A test seam; leave it unset on a host.
    type: path
    default: /proc
'''

    ETC_ROOT = r'''
options:
  etc_root:
    description:
      - Where the host's C(/etc) is. The module reads and writes its configuration files below it.
      - A test seam; leave it unset on a host.
    type: path
    default: /etc
'''
