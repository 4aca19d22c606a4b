#!/usr/bin/env bash
# Galaxy's own import check on the collection as it would be published: builds the tarball
# (ansible-galaxy collection build, galaxy.yml's build_ignore) into a temporary directory and runs
# galaxy-importer on it, the code Galaxy runs on every upload (role READMEs, galaxy.yml, docs
# through ansible-doc, changelog). Its ansible-test and ansible-lint steps are off: the sanity and
# lint gates run those on the checkout already.
#
# galaxy-importer runs from its own venv, .cache/galaxy-importer-venv (built from PyPI on first
# use, a few seconds; rebuilt when GALAXY_IMPORTER_VERSION changes): its pins (ansible-core,
# ansible-lint) are not the project's. Its ansible-doc must come first on PATH, else it skips the
# docs with only a warning.
#
# Exits non-zero when the import fails or reports any ERROR or WARNING line.
set -euo pipefail
GALAXY_IMPORTER_VERSION=0.4.44
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
VENV="$ROOT/.cache/galaxy-importer-venv"
STAMP="galaxy-importer==$GALAXY_IMPORTER_VERSION"

if [ "$(cat "$VENV/.stamp" 2>/dev/null)" != "$STAMP" ]; then
  rm -rf "$VENV"
  python3 -m venv "$VENV"
  "$VENV/bin/pip" install -q --disable-pip-version-check "$STAMP"
  echo "$STAMP" > "$VENV/.stamp"
fi

work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
"$ROOT/.venv/bin/ansible-galaxy" collection build --force --output-path "$work" "$ROOT" >/dev/null
tarball="$(ls "$work"/*.tar.gz)"
printf '[galaxy-importer]\nRUN_ANSIBLE_TEST = False\nRUN_ANSIBLE_LINT = False\n' > "$work/galaxy-importer.cfg"
cd "$work"   # the importer writes importer_result.json into the working directory
set +e
PATH="$VENV/bin:$PATH" GALAXY_IMPORTER_CONFIG="$work/galaxy-importer.cfg" \
  "$VENV/bin/python" -m galaxy_importer.main "$tarball" > import.log 2>&1
rc=$?
set -e
grep -v '^Loading ' import.log || true
if [ "$rc" != 0 ] || grep -qE '^(ERROR|WARNING):' import.log; then
  echo "galaxy-import: FAILED (exit $rc) for $(basename "$tarball")" >&2
  exit 1
fi
# Every module's docs loaded: ansible-doc answered for each (an unparsable DOCUMENTATION leaves them empty).
"$VENV/bin/python" - importer_result.json <<'PY'
import json, sys
blob = json.load(open(sys.argv[1]))["docs_blob"]["contents"]
missing = sorted(c["content_name"] for c in blob if c["content_type"] == "module" and not c.get("doc_strings"))
if missing:
    sys.exit("galaxy-import: no docs loaded for modules: %s" % ", ".join(missing))
print("galaxy-import: %d modules' docs loaded" % sum(c["content_type"] == "module" for c in blob))
PY
echo "galaxy-import: $(basename "$tarball") imports cleanly"
