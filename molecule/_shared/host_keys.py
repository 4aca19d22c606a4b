"""The scenario's known_hosts: the one file the pinned SSH options name for all its guests.

.config/molecule/config.yml (the base every scenario merges over) points ssh at
${MOLECULE_EPHEMERAL_DIRECTORY}/guests/known_hosts, the state directory the create and destroy
playbooks hand to podman_guest.py and libvirt_guest.py (--state). Each guest's line is keyed by the
address Ansible and testinfra connect to ("10.x.y.10" or "[127.0.0.1]:PORT"), so one file serves
every platform of a scenario and the base config need not name any of them.
"""
from __future__ import annotations

import os
from pathlib import Path

FILE = "known_hosts"


def pin(state_dir: Path, host: str, public_key: str) -> Path:
    """Pin ``public_key`` ("ssh-ed25519 AAAA... [comment]") for ``host``; return the file's path.

    A line already there for the same host (a guest of an earlier run on the same address or
    port) is replaced; the other guests' lines stay.
    """
    path = state_dir / FILE
    lines = path.read_text().splitlines() if path.exists() else []
    lines = [line for line in lines if line.split(" ", 1)[0] != host]
    lines.append("%s %s" % (host, " ".join(public_key.split()[:2])))
    tmp = state_dir / (FILE + ".tmp")
    tmp.write_text("\n".join(lines) + "\n")
    os.chmod(tmp, 0o600)
    tmp.replace(path)
    return path


def forget(state_dir: Path) -> None:
    """Remove the file (destroy): the next create pins fresh keys."""
    (state_dir / FILE).unlink(missing_ok=True)
