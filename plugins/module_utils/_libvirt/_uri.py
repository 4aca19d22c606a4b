# -*- coding: utf-8 -*-
# Copyright: mlinfra.kvm contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Facts about a libvirt URI that decide which checks a module can make itself."""
from __future__ import annotations

from urllib.parse import urlparse


def is_local(uri: str) -> bool:
    """True when libvirt runs on the machine this module runs on (no host in the URI).

    Only then may a module look at paths itself (is a pool target a regular file, does a
    backing image exist); for remote URIs it leaves such checks to libvirt.
    """
    parsed = urlparse(uri)
    return not parsed.hostname or parsed.hostname in ("localhost", "127.0.0.1", "::1")
