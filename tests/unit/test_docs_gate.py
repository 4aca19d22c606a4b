"""The docs gate (issue 14): scripts/docs.sh builds the HTML docs with antsibull-docs and Sphinx
(-W: any warning fails), after antsibull-docs' lint of every module's, plugin's and role's
documentation. The link rewriting between pages is tested on its own first."""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from conftest import ROOT, checkout_shell_env

pytestmark = pytest.mark.gates
VENV_BIN = Path(ROOT) / ".venv" / "bin"
sys.path.insert(0, str(Path(ROOT) / "scripts"))
import docs_prepare  # noqa: E402  pylint: disable=wrong-import-position


def test_links_between_pages_become_checked_references() -> None:
    pages = {"domain_module", "index"}
    missing: list = []
    text = docs_prepare.relink("* `mlinfra.kvm.domain <domain_module.rst>`__\n"
                               "* `ansible.builtin.copy <copy_module.rst>`__\n"
                               "* `mlinfra.kvm.gone <gone_module.rst>`__\n", pages, missing)
    assert ":doc:`mlinfra.kvm.domain <domain_module>`" in text
    assert "ansible/builtin/copy_module.html" in text
    assert missing == ["mlinfra.kvm.gone -> gone_module.rst"]   # a page of ours that is not there


def test_docs_build_without_warnings(tmp_path: Path) -> None:
    if not (VENV_BIN / "antsibull-docs").is_file():
        pytest.skip("antsibull-docs is not installed in .venv (requirements.txt pins it; run make venv)")
    proc = subprocess.run(["bash", str(Path(ROOT) / "scripts" / "docs.sh"), str(tmp_path)], cwd=ROOT,
                          env=checkout_shell_env(), capture_output=True, text=True, timeout=600, check=False)
    assert proc.returncode == 0, "scripts/docs.sh exited %d\n--- stdout\n%s\n--- stderr\n%s" % (
        proc.returncode, proc.stdout, proc.stderr)
    html = tmp_path / "html"
    modules = sorted(p.stem for p in (Path(ROOT) / "plugins" / "modules").glob("*.py") if p.stem != "__init__")
    roles = sorted(p.parent.parent.name for p in (Path(ROOT) / "roles").glob("*/meta/argument_specs.yml"))
    for name in modules:
        assert (html / ("%s_module.html" % name)).is_file(), name
    for name in roles:
        assert (html / ("%s_role.html" % name)).is_file(), name
    assert (html / "libvirt_inventory.html").is_file()
    index = (html / "index.html").read_text()
    assert all(('href="%s_module.html"' % name) in index for name in modules)
    # an option added this stop shows with its description
    assert "signing_key" in (html / "ml_stage_module.html").read_text()
