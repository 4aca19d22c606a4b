#!/usr/bin/env bash
# ansible-test sanity on the working tree (scripts/ansible-test.sh says how and why).
exec "$(dirname "${BASH_SOURCE[0]}")/ansible-test.sh" sanity "$@"
