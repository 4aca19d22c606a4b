#!/usr/bin/env bash
# Domain benchmark entry point: prints JSON and a table, writes bench/results/domains.json.
#   bench/domains/run.sh [--domains 100] [--inventory-domains 500] [--repeat 3] [--noop-runs 3]
# Needs root, a running libvirtd (started here when missing), qemu-img, the collection's .venv
# (libvirt-python, lxml) and bench/.venv-ansible (created by bench/setup-ansible-venv.sh from
# bench/requirements-ansible.txt: PyPI's `ansible` package, which ships community.libvirt).
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
cd "$ROOT"
scripts/ensure-libvirtd.sh >/dev/null
exec "$ROOT/.venv/bin/python" "$ROOT/bench/domains/run.py" "$@"
