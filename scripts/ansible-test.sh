#!/usr/bin/env bash
# Run `ansible-test sanity` or `ansible-test units` on the working tree (tracked files plus
# untracked files that git does not ignore), as the collection mlinfra.kvm for Python 3.11.
#
# ansible-test needs the collection under .../ansible_collections/<namespace>/<name>/ and refuses to
# follow the checkout's own collections/ansible_collections/mlinfra/kvm symlink (it points back at
# the checkout, a loop), so the files are copied to $TMPDIR/mlinfra-kvm-<command>-<checkout hash>/
# ansible_collections/mlinfra/kvm: outside the checkout, since inside it ansible-test would list
# the files through the checkout's git, which ignores the copy.
# The sanity tools run from virtual environments that ansible-test builds from PyPI (--venv) under
# ~/.ansible/test/venv; the first run builds them (a few minutes), later runs reuse them. The pip
# bootstrap script ansible-test fetches for them comes from a host out of reach here, so
# scripts/sanity_get_pip.py stands in for it (with the pip wheel of the version it asks for, from PyPI).
# The unit tests run --local, in the project's venv: they drive ansible-playbook, libvirt-python
# and lxml from it (built by make setup), which a venv of ansible-test's own would build again.
# tests/conftest.py skips the tiers other than unit there, each with the make target that runs it.
#
# Usage: scripts/ansible-test.sh sanity [extra ansible-test sanity arguments, e.g. --test pylint]
#        scripts/ansible-test.sh units [extra ansible-test units arguments, e.g. tests/unit/test_foo.py]
# Exits non-zero on any sanity error or failed test; they are printed.
set -euo pipefail

command=${1:-}
case $command in
    sanity|units) shift ;;
    *) echo "usage: $0 sanity|units [ansible-test arguments]" >&2; exit 2 ;;
esac

root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
venv=${VENV:-$root/.venv}
ansible_test=$venv/bin/ansible-test
python_version=${SANITY_PYTHON:-3.11}
root_hash=$(printf '%s' "$root" | sha256sum | cut -c1-12)
dest=${TMPDIR:-/tmp}/mlinfra-kvm-$command-$root_hash/ansible_collections/mlinfra/kvm

if [[ ! -x $ansible_test ]]; then
    echo "$command: $ansible_test not found (run make venv)" >&2
    exit 127
fi

# One run at a time per checkout: they share the copy and ansible-test's environments.
mkdir -p "${dest%/ansible_collections/*}"
exec 9>"${dest%/ansible_collections/*}/lock"
flock 9

# The pip bootstrap for ansible-test's virtual environments (see scripts/sanity_get_pip.py);
# only sanity builds them (--venv), units run in the project venv (--local).
if [[ $command == sanity ]]; then
    pip_version=$("$venv/bin/python" -c 'from types import SimpleNamespace
from ansible_test._internal.python_requirements import get_venv_packages
print(get_venv_packages(SimpleNamespace(version="'"$python_version"'"))["pip"])')
    pip_cache=$HOME/.ansible/test/cache
    get_pip=$pip_cache/get_pip_${pip_version//./_}.py
    if [[ ! -f $pip_cache/pip-$pip_version-py3-none-any.whl ]]; then
        mkdir -p "$pip_cache"
        "$venv/bin/python" -m pip download --quiet --disable-pip-version-check --no-deps \
            --only-binary :all: --dest "$pip_cache" "pip==$pip_version"
    fi
    if ! cmp -s "$root/scripts/sanity_get_pip.py" "$get_pip"; then
        cp "$root/scripts/sanity_get_pip.py" "$get_pip"
    fi
fi

# A fresh copy each run, so files deleted or renamed in the checkout do not linger; only
# tests/output is kept, where ansible-test keeps the virtual environment it delegates to.
output_keep=$dest.output
rm -rf "$output_keep"
if [[ -d $dest/tests/output ]]; then
    mv "$dest/tests/output" "$output_keep"
fi
rm -rf "$dest"
mkdir -p "$dest/tests"
if [[ -d $output_keep ]]; then
    mv "$output_keep" "$dest/tests/output"
fi
cd "$root"
# The collections/ symlink farm (a link back to the checkout) is left out; files deleted from the
# work tree but still in the index are skipped.
git ls-files -z --cached --others --exclude-standard \
    | while IFS= read -r -d '' f; do
        if [[ $f != collections/* && -e $f && ! -d $f ]]; then
            printf '%s\0' "$f"
        fi
    done \
    | rsync -a --from0 --files-from=- ./ "$dest/"

cd "$dest"
# ansible-test puts its own venvs' bin first; the project venv's bin supplies ansible-test itself.
export PATH="$venv/bin:$PATH"
# ansible-test sets the configuration of the ansible commands it runs; none from the caller
# (the Makefile exports the checkout's ansible.cfg).
unset ANSIBLE_CONFIG ANSIBLE_COLLECTIONS_PATH ANSIBLE_COLLECTIONS_PATHS
if [[ $command == units ]]; then
    # Build outputs of make setup that git ignores and the role tests read: the dashboard's
    # vendored chart library (the monitoring role's preflight checks for it first).
    vendor=roles/monitoring/files/dashboard/vendor
    if [[ -d $root/$vendor ]]; then
        mkdir -p "$dest/$vendor"
        rsync -a "$root/$vendor/" "$dest/$vendor/"
    fi
    # The recorded fixtures the tests read from ../shared beside the checkout (ansible-test passes
    # no variable of ours through to pytest, so the copy gets the same neighbour).
    if [[ -d $root/../shared ]]; then
        ln -sfn "$(cd "$root/.." && pwd)/shared" "${dest%/kvm}/shared"
    fi
    exec "$ansible_test" units --local --python "$python_version" --color no "$@"
fi
exec "$ansible_test" sanity --venv --python "$python_version" --color no "$@"
