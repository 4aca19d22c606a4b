"""The command line that both delegated drivers' guest scripts take (libvirt_guest.py for the VM
scenarios, podman_guest.py for the container ones):

  SCRIPT create --state DIR --name NAME [the script's own create options]
  SCRIPT destroy --state DIR
"""
from __future__ import annotations

import argparse
from typing import Callable


def parse_args(description: str, create_options: Callable[[argparse.ArgumentParser], None] = lambda create: None
               ) -> argparse.Namespace:
    """The parsed command line; create_options adds the script's own options to create."""
    parser = argparse.ArgumentParser(description=description)
    sub = parser.add_subparsers(dest="cmd", required=True)
    create = sub.add_parser("create")
    create.add_argument("--state", required=True)
    create.add_argument("--name", required=True)
    create_options(create)
    destroy = sub.add_parser("destroy")
    destroy.add_argument("--state", required=True)
    return parser.parse_args()
