"""The execution environment's build context (issue 14): `ansible-builder create` on the
project's execution-environment.yml with the collection built as users get it, then the
dependency step the image build runs (the context's own introspect.py over the collection
installed from the context's requirements.yml), checked against this machine:

- the collection declares its Python and system packages (meta/execution-environment.yml),
  so any EE that installs it gets them, not only ours;
- every Python requirement is met by what the tests here ran with (.venv);
- bindep resolves the system list on this Debian machine (nothing missing) and parses the
  rpm entries the awx-ee base image uses.

No image is built: that needs the base image from a registry, which tests may not reach.
"""
from __future__ import annotations

import re
import subprocess
from pathlib import Path
from typing import Dict, List

import pytest
import yaml

from conftest import ROOT, checkout_shell_env

pytestmark = pytest.mark.gates
VENV_BIN = Path(ROOT) / ".venv" / "bin"


def _run(argv: List[str], cwd: Path, **env: str) -> subprocess.CompletedProcess:
    proc = subprocess.run(argv, cwd=str(cwd), env=dict(checkout_shell_env(), **env),
                          capture_output=True, text=True, timeout=300, check=False)
    assert proc.returncode == 0, "%s exited %d\n%s\n%s" % (argv, proc.returncode, proc.stdout, proc.stderr)
    return proc


@pytest.fixture(scope="module")
def context(tmp_path_factory: pytest.TempPathFactory) -> Dict[str, Path]:
    if not (VENV_BIN / "ansible-builder").is_file():
        pytest.skip("ansible-builder is not installed in .venv (requirements.txt pins it; run make venv)")
    work = tmp_path_factory.mktemp("ee")
    _run([str(VENV_BIN / "ansible-galaxy"), "collection", "build", "--force", "--output-path", str(work)], Path(ROOT))
    (work / "execution-environment.yml").write_bytes((Path(ROOT) / "execution-environment.yml").read_bytes())
    _run([str(VENV_BIN / "ansible-builder"), "create", "-f", "execution-environment.yml", "-c", "context"], work)
    build = work / "context" / "_build"
    # What the image's galaxy stage does, into a temporary collections path (and away from the
    # checkout's ansible.cfg, which maps mlinfra.kvm to the working tree).
    cfg = work / "empty-ansible.cfg"
    cfg.write_text("[defaults]\n")
    _run([str(VENV_BIN / "ansible-galaxy"), "collection", "install", "-r", "requirements.yml",
          "-p", str(work / "collections")], build, ANSIBLE_CONFIG=str(cfg))
    # What the image's builder stage does.
    out = work / "introspected"
    out.mkdir()
    user = ["--user-%s=%s" % (kind, build / name) for kind, name in (("pip", "requirements.txt"),
                                                                     ("bindep", "bindep.txt"))
            if (build / name).is_file()]   # only when the EE file adds packages of its own
    _run([str(VENV_BIN / "python"), str(build / "scripts" / "introspect.py"), "introspect", *user,
          "--write-pip=%s" % (out / "requirements.txt"), "--write-bindep=%s" % (out / "bindep.txt"),
          str(work / "collections")], work)
    return {"work": work, "build": build, "out": out}


def test_context_installs_the_collection_of_this_version(context: Dict[str, Path]) -> None:
    galaxy = yaml.safe_load((Path(ROOT) / "galaxy.yml").read_text())
    tarball = "mlinfra-kvm-%s.tar.gz" % galaxy["version"]
    assert (context["build"] / tarball).is_file(), "execution-environment.yml names another version than galaxy.yml"
    reqs = yaml.safe_load((context["build"] / "requirements.yml").read_text())
    assert reqs["collections"] == [{"name": "mlinfra.kvm", "source": "./" + tarball, "type": "file"}]
    containerfile = (context["work"] / "context" / "Containerfile").read_text()
    assert 'ARG EE_BASE_IMAGE="ansible/awx-ee:latest"' in containerfile
    assert "introspect.py introspect" in containerfile


def test_the_collection_declares_its_python_packages_and_this_venv_meets_them(context: Dict[str, Path]) -> None:
    from importlib.metadata import PackageNotFoundError, version
    from packaging.requirements import Requirement
    from packaging.utils import canonicalize_name

    lines = [ln for ln in (context["out"] / "requirements.txt").read_text().splitlines() if ln.strip()]
    # introspect writes "name==version  # from collection mlinfra.kvm"
    declared = {canonicalize_name(Requirement(ln.split("#")[0]).name): ln for ln in lines}
    assert {"libvirt-python", "lxml"} <= set(declared), lines
    assert all("mlinfra.kvm" in declared[n] for n in ("libvirt-python", "lxml")), lines
    unmet = []
    for line in lines:
        req = Requirement(line.split("#")[0].strip())
        try:
            have = version(req.name)
        except PackageNotFoundError:
            have = None
        if have is None or not req.specifier.contains(have, prereleases=True):
            unmet.append("%s (this venv has %s)" % (req, have))
    assert not unmet, "the EE would install versions the tests never ran with: %s" % unmet


def test_bindep_resolves_the_system_packages(context: Dict[str, Path]) -> None:
    bindep = context["out"] / "bindep.txt"
    text = bindep.read_text()
    rpm = {m.group(1) for m in re.finditer(r"^(\S+) \[[^]]*platform:rpm[^]]*\]", text, re.M)}
    assert {"libvirt-devel", "gcc", "python3-devel", "genisoimage"} <= rpm, text
    # bindep on this Debian machine: the dpkg entries, checked against what is installed
    # (`make setup` installs them). -b lists what is missing; it exits 1 when anything is.
    proc = subprocess.run([str(VENV_BIN / "bindep"), "-b", "-f", str(bindep)], capture_output=True, text=True,
                          timeout=120, check=False)
    assert proc.returncode == 0 and not proc.stdout.strip(), (
        "bindep found missing packages on this machine:\n%s%s" % (proc.stdout, proc.stderr))
    proc = subprocess.run([str(VENV_BIN / "bindep"), "-b", "-f", str(bindep), "compile"], capture_output=True,
                          text=True, timeout=120, check=False)
    assert proc.returncode == 0 and not proc.stdout.strip(), (
        "bindep found missing compile packages on this machine:\n%s%s" % (proc.stdout, proc.stderr))


def _bindep_list(bindep: Path, *profiles: str) -> List[str]:
    return subprocess.run([str(VENV_BIN / "bindep"), "-l", "newline", "-f", str(bindep), *profiles],
                          capture_output=True, text=True, timeout=120, check=True).stdout.split()


BUILD_ONLY = {"libvirt-dev", "gcc", "python3-dev", "pkg-config"}


def test_the_toolchain_is_in_the_builder_stage_only(context: Dict[str, Path]) -> None:
    """ansible-builder installs `bindep -l newline` (the default profile) in the final image and
    `bindep -b compile` in the builder stage only: gcc, the headers and pkg-config build
    libvirt-python's wheel there and stay out of the image, which keeps libvirt's library."""
    bindep = context["out"] / "bindep.txt"
    final = set(_bindep_list(bindep))
    assert {"libvirt0", "genisoimage", "openssh-client"} <= final, final
    assert not final & BUILD_ONLY, "build-only packages in the final image: %s" % sorted(final & BUILD_ONLY)
    assert BUILD_ONLY <= set(_bindep_list(bindep, "compile")), _bindep_list(bindep, "compile")


def test_python_requirements_are_ranges(context: Dict[str, Path]) -> None:
    """The collection gives ranges, so an EE can resolve them beside other collections' needs (the
    project's own venv keeps exact pins in requirements.txt)."""
    from packaging.requirements import Requirement

    lines = [ln.split("#")[0].strip() for ln in (context["out"] / "requirements.txt").read_text().splitlines()]
    pinned = [ln for ln in lines if ln and any(spec.operator in ("==", "===") for spec in Requirement(ln).specifier)]
    assert not pinned, "exact pins in the collection's EE requirements: %s" % pinned
