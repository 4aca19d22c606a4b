#!/usr/bin/env bash
# make docs: the collection's HTML docs from the same DOCUMENTATION, RETURN and argument_specs
# that ansible-doc shows, checked on the way:
#   1. antsibull-docs lint-collection-docs: markup, references (M(), P(), O(), RV()), role specs;
#   2. antsibull-docs collection: one page per module, plugin and role (simplified RST);
#   3. scripts/docs_prepare.py: links between pages become Sphinx :doc: references;
#   4. sphinx-build -W: any warning (a broken reference, bad RST) fails the build.
# Output: .cache/docs/html/index.html (or DEST/html with scripts/docs.sh DEST).
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT="$PWD"
BIN="$ROOT/.venv/bin"
DEST="${1:-$ROOT/.cache/docs}"
for tool in antsibull-docs sphinx-build; do
  if [ ! -x "$BIN/$tool" ]; then
    echo "docs: $BIN/$tool is missing; run make venv (requirements.txt pins it)" >&2
    exit 2
  fi
done
# collections/ansible_collections/mlinfra/kvm is this checkout (ansible.cfg's collections_path).
export ANSIBLE_CONFIG="$ROOT/ansible.cfg" ANSIBLE_COLLECTIONS_PATH="$ROOT/collections"
export PATH="$BIN:$PATH"  # antsibull-docs runs ansible-doc and ansible-galaxy from PATH
rm -rf "$DEST/rst" "$DEST/html"
mkdir -p "$DEST/rst"
# No RST files of its own ship in docs/docsite, so rstcheck has nothing to read.
"$BIN/antsibull-docs" lint-collection-docs --plugin-docs --skip-rstcheck \
  "$ROOT/collections/ansible_collections/mlinfra/kvm"
"$BIN/antsibull-docs" collection --use-current --output-format simplified-rst --squash-hierarchy \
  --dest-dir "$DEST/rst" mlinfra.kvm
"$BIN/python" "$ROOT/scripts/docs_prepare.py" "$DEST/rst"
"$BIN/sphinx-build" -q -b html -W --keep-going -c "$ROOT/docs/site" "$DEST/rst" "$DEST/html"
echo "docs: $DEST/html/index.html ($(find "$DEST/rst" -mindepth 1 -maxdepth 1 | wc -l) pages)"
