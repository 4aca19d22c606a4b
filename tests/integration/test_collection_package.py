"""The collection as users get it: built with ansible-galaxy, installed into a temporary
collections path, and used from a playbook (module_defaults through the action group)."""
from __future__ import annotations

import json
import os
import subprocess
import tarfile
from pathlib import Path

import pytest

from conftest import ROOT

pytestmark = pytest.mark.integration
VENV_BIN = Path(ROOT) / ".venv" / "bin"


@pytest.fixture(scope="module")
def installed(tmp_path_factory):
    out = tmp_path_factory.mktemp("build")
    subprocess.run([str(VENV_BIN / "ansible-galaxy"), "collection", "build", "--force", "--output-path", str(out)],
                   cwd=ROOT, check=True, capture_output=True, text=True)
    tarballs = list(out.glob("mlinfra-kvm-*.tar.gz"))
    assert len(tarballs) == 1, tarballs
    dest = tmp_path_factory.mktemp("collections")
    # Away from the checkout's ansible.cfg, which maps mlinfra.kvm to the working tree
    # (galaxy would then report the collection as already installed).
    cfg = dest / "empty-ansible.cfg"
    cfg.write_text("[defaults]\n")
    subprocess.run([str(VENV_BIN / "ansible-galaxy"), "collection", "install", "--force", str(tarballs[0]),
                    "-p", str(dest)], check=True, capture_output=True, text=True, cwd=str(dest),
                   env=dict(os.environ, ANSIBLE_CONFIG=str(cfg)))
    assert (dest / "ansible_collections" / "mlinfra" / "kvm" / "meta" / "runtime.yml").is_file()
    return tarballs[0], dest


def test_tarball_holds_the_collection_and_nothing_private(installed):
    tarball, _unused = installed
    with tarfile.open(tarball) as tar:
        names = tar.getnames()
    assert "plugins/modules/pool.py" in names and "meta/runtime.yml" in names and "MANIFEST.json" in names
    assert "LICENSE" in names and "CHANGELOG.rst" in names and "changelogs/changelog.yaml" in names
    assert not [n for n in names if n.startswith((".venv", ".git/", "collections/", "lab/build"))]
    # galaxy.yml's build_ignore: the checkout's tests, benchmarks, Molecule scenarios, local lab,
    # tooling and changelog fragments are not the collection.
    assert not [n for n in names if n.split("/")[0] in (
        "tests", "bench", "molecule", "lab", "scripts", ".ci", ".cache", "Makefile", "ansible.cfg",
        "pytest.ini", "requirements.txt", ".ansible-lint", ".config")
        or n.startswith(("inventories/lab", "changelogs/fragments", "playbooks/lab_image.yml"))]


def test_installed_collection_runs_a_module_with_module_defaults(installed, libvirt_cleanup, tmp_path):
    _unused, dest = installed
    playbook = tmp_path / "play.yml"
    name = libvirt_cleanup + "pkg"
    playbook.write_text(json.dumps([{
        "hosts": "localhost", "gather_facts": False,
        # The environment points at a dead socket: only module_defaults can make this work.
        "module_defaults": {"group/mlinfra.kvm.libvirt": {"uri": "qemu:///system"}},
        "tasks": [
            {"name": "pool from the installed collection",
             "mlinfra.kvm.pool": {"name": name, "target": str(tmp_path / "pool")}, "register": "created"},
            {"name": "same again", "mlinfra.kvm.pool": {"name": name, "target": str(tmp_path / "pool")},
             "register": "again"},
            {"ansible.builtin.assert": {"that": ["created is changed", "again is not changed",
                                                 "created.pool.state == 'active'"]}},
        ]}]))
    cfg = tmp_path / "ansible.cfg"
    cfg.write_text("[defaults]\n")
    env = dict(os.environ, ANSIBLE_COLLECTIONS_PATH=str(dest), ANSIBLE_CONFIG=str(cfg),
               LIBVIRT_DEFAULT_URI="qemu+unix:///system?socket=/nonexistent/sock")
    env.pop("PYTHONPATH", None)
    proc = subprocess.run([str(VENV_BIN / "ansible-playbook"), "-i", "localhost,", "-c", "local", str(playbook),
                           "-e", "ansible_python_interpreter=" + str(VENV_BIN / "python")],
                          env=env, capture_output=True, text=True, cwd=str(tmp_path), check=False)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "ok=3" in proc.stdout and "changed=1" in proc.stdout
    doc = subprocess.run([str(VENV_BIN / "ansible-doc"), "mlinfra.kvm.pool"], env=env, capture_output=True,
                         text=True, cwd=str(tmp_path), check=False)
    assert str(dest) in doc.stdout, "the module must come from the installed copy"


@pytest.mark.parametrize("module", ["pool", "volume", "network"])
def test_ansible_doc_renders(module):
    env = dict(os.environ, ANSIBLE_COLLECTIONS_PATH=str(Path(ROOT) / "collections"))
    proc = subprocess.run([str(VENV_BIN / "ansible-doc"), "--json", "mlinfra.kvm." + module],
                          env=env, capture_output=True, text=True, check=False)
    assert proc.returncode == 0, proc.stderr
    doc = json.loads(proc.stdout)["mlinfra.kvm." + module]
    assert doc["doc"]["options"]["uri"]["type"] == "str", "the libvirt doc fragment must be applied"
    assert doc["examples"] and doc["return"]
