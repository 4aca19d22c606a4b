#!/usr/bin/env bash
# make lint: ansible-lint with the production profile over the whole checkout, offline, with the
# project's configuration (.ansible-lint). Exits non-zero on any violation.
#   scripts/lint.sh            every file ansible-lint finds (git's tracked and untracked files)
#   scripts/lint.sh PATH...    only those files or directories
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT="$PWD"
LINT="$ROOT/.venv/bin/ansible-lint"
if [ ! -x "$LINT" ]; then
  echo "lint: $LINT is missing; run make venv (requirements.txt pins ansible-lint)" >&2
  exit 2
fi
# The checkout's ansible.cfg (collections_path ./collections maps mlinfra.kvm to this tree), and
# the venv's ansible-playbook for syntax-check.
export ANSIBLE_CONFIG="$ROOT/ansible.cfg"
export PATH="$ROOT/.venv/bin:$PATH"
exec "$LINT" --config-file "$ROOT/.ansible-lint" --profile production --offline --strict "$@"
