#!/usr/bin/env bash
# A separate virtualenv with PyPI's `ansible` package (community.libvirt inside) for the
# comparison benchmarks; kept apart from .venv so the collection's tests never see it.
set -euo pipefail
cd "$(dirname "$0")"
if [ ! -x .venv-ansible/bin/ansible-playbook ]; then
  python3 -m venv .venv-ansible
  .venv-ansible/bin/pip install -q --upgrade pip
  .venv-ansible/bin/pip install -q -r requirements-ansible.txt
fi
echo "$(pwd)/.venv-ansible"
