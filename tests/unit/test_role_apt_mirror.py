"""The Debian mirror of the nvidia_driver and cuda roles, derived from the host's own apt sources.

Both roles write the same deb822 file (contrib, non-free, non-free-firmware) through the shared
role mlinfra.kvm.nvidia_apt_source, and take its mirrors from <role>_debian_mirror /
<role>_debian_security_mirror, or, when those are empty, from the first apt source of the host
whose suite is <release> / <release>-security (each role's tasks/apt_mirror.yml hands its
variables to nvidia_apt_source's mirror step).

One ansible-playbook run per role, against localhost with connection local and --check: every
case is an inventory host with its own fixture directory standing in for /etc/apt (the role's
__<role>_apt_sources_dir, passed as an include parameter so it beats vars/main.yml) and its own
release (set as a cached fact). For each host the play runs the role's apt_mirror.yml, then
writes the resolved mirrors and the role's template rendered with them into the output folder.
"""
from __future__ import annotations

import json
import re
import subprocess
from pathlib import Path

import pytest
import yaml

from conftest import ROOT
from test_roles_static import run_playbook

pytestmark = pytest.mark.unit

ROLES = ["nvidia_driver", "cuda"]
KEY_BLOCK = (" -----BEGIN PGP PUBLIC KEY BLOCK-----\n"
             " .\n"
             " mDMEZFixtureOnlyNotAKeyAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA\n"
             " -----END PGP PUBLIC KEY BLOCK-----\n")

# Each case: files under the fixture directory (relative path -> text), the release, the role
# variables set by the user (without the role prefix), and what the role must make of it:
# (mirror, security mirror) or the failure message it must print.
CASES = {
    # One-line format: comments, deb-src and other suites are skipped; the options in brackets
    # are not the URI; sources.list comes before sources.list.d.
    "oneline": {
        "release": "bookworm",
        "files": {
            "sources.list": (
                "# deb http://commented.example.invalid/debian bookworm main\n"
                "deb-src http://src.example.invalid/debian bookworm main\n"
                "deb http://trixie.example.invalid/debian trixie main\n"
                "deb http://updates.example.invalid/debian bookworm-updates main\n"
                "  deb [arch=amd64 signed-by=/usr/share/keyrings/fixture.gpg] http://one.example.invalid/debian bookworm main\n"
                "deb [ arch=amd64 ] http://two.example.invalid/debian bookworm main\n"),
            "sources.list.d/00-security.list": "deb http://sec-one.example.invalid/debian-security bookworm-security main\n",
            "sources.list.d/01-later.sources": (
                "Types: deb\nURIs: http://later.example.invalid/debian\n"
                "Suites: bookworm bookworm-security\nComponents: main\n"),
        },
        "expect": ("http://one.example.invalid/debian", "http://sec-one.example.invalid/debian-security"),
    },
    # deb822 only (no sources.list, as on a Debian 12 cloud image): deb-src and disabled stanzas
    # are skipped, a stanza with two suites matches on its second one, a comment line and an
    # embedded key (continuation lines, " ." among them) do not split a stanza, field names are
    # case-insensitive.
    "deb822": {
        "release": "bookworm",
        "files": {
            "sources.list.d/debian.sources": (
                "# Fixture of a deb822 file\n"
                "Types: deb-src\nURIs: http://src.example.invalid/debian\nSuites: bookworm\nComponents: main\n"
                "\n"
                "Enabled: no\nTypes: deb\nURIs: http://disabled.example.invalid/debian\nSuites: bookworm\n"
                "Components: main\n"
                "\n\n"
                "Types: deb deb-src\n"
                "# a comment inside the stanza\n"
                "URIs: http://822.example.invalid/debian http://822-second.example.invalid/debian\n"
                "Suites: bookworm-updates bookworm\n"
                "Components: main\n"
                "Signed-By:\n" + KEY_BLOCK +
                "\n"
                "types: deb\nuris: http://822-sec.example.invalid/debian-security\nsuites: bookworm-security\n"
                "components: main\n"),
        },
        "expect": ("http://822.example.invalid/debian", "http://822-sec.example.invalid/debian-security"),
    },
    # sources.list.d in name order, .list and .sources together; names apt ignores are ignored.
    "order": {
        "release": "bookworm",
        "files": {
            "sources.list.d/00-old.list.disabled": "deb http://disabled-file.example.invalid/debian bookworm main\n",
            "sources.list.d/10-ten.sources": (
                "Types: deb\nURIs: http://ten.example.invalid/debian\nSuites: bookworm-security\n"),
            "sources.list.d/20-twenty.list": (
                "deb http://twenty.example.invalid/debian bookworm main\n"
                "deb http://twenty.example.invalid/debian-security bookworm-security main\n"),
        },
        "expect": ("http://twenty.example.invalid/debian", "http://ten.example.invalid/debian"),
    },
    # The file the role writes is not read back; no security source on the host: no security stanza.
    "own_file_and_no_security": {
        "release": "bookworm",
        "files": {
            "sources.list": "deb http://debootstrap.example.invalid/debian bookworm main\n",
            "sources.list.d/mlinfra-nvidia.sources": (
                "Types: deb\nURIs: http://stale.example.invalid/debian\n"
                "Suites: bookworm bookworm-updates\nComponents: contrib\n\n"
                "Types: deb\nURIs: http://stale.example.invalid/debian-security\n"
                "Suites: bookworm-security\nComponents: contrib\n"),
        },
        "expect": ("http://debootstrap.example.invalid/debian", ""),
    },
    # The release comes from the facts, not from a hard-coded name.
    "other_release": {
        "release": "trixie",
        "files": {
            "sources.list": (
                "deb http://bookworm.example.invalid/debian bookworm main\n"
                "deb http://trixie.example.invalid/debian trixie main\n"
                "deb http://trixie.example.invalid/debian-security trixie-security main\n"),
        },
        "expect": ("http://trixie.example.invalid/debian", "http://trixie.example.invalid/debian-security"),
    },
    # Variables that are set win over the host's sources, each on its own.
    "both_set": {
        "release": "bookworm",
        "files": {"sources.list": "deb http://host.example.invalid/debian bookworm main\n"
                                  "deb http://host.example.invalid/debian-security bookworm-security main\n"},
        "set": {"debian_mirror": "http://set.example.invalid/debian",
                "debian_security_mirror": "http://set.example.invalid/debian-security"},
        "expect": ("http://set.example.invalid/debian", "http://set.example.invalid/debian-security"),
    },
    "main_set": {
        "release": "bookworm",
        "files": {"sources.list": "deb http://host.example.invalid/debian bookworm main\n"
                                  "deb http://host.example.invalid/debian-security bookworm-security main\n"},
        "set": {"debian_mirror": "http://set.example.invalid/debian"},
        "expect": ("http://set.example.invalid/debian", "http://host.example.invalid/debian-security"),
    },
    # Both set: the sources are not read at all (the directory does not exist).
    "both_set_nothing_read": {
        "release": "bookworm",
        "files": None,
        "set": {"debian_mirror": "http://set.example.invalid/debian",
                "debian_security_mirror": "http://set.example.invalid/debian-security"},
        "expect": ("http://set.example.invalid/debian", "http://set.example.invalid/debian-security"),
    },
    # No source for the release: fail, naming the variable and the fix, before anything is written.
    "no_match": {
        "release": "bookworm",
        "files": {
            "sources.list": ("deb http://trixie.example.invalid/debian trixie main\n"
                             "#deb http://commented.example.invalid/debian bookworm main\n"
                             "deb-src http://src.example.invalid/debian bookworm main\n"),
            "sources.list.d/debian.sources": (
                "Types: deb\nURIs: http://sec.example.invalid/debian-security\nSuites: bookworm-security\n"),
        },
        "fail": ["{role}_debian_mirror is empty", "suite bookworm",
                 "set {role}_debian_mirror to your Debian mirror", "sources.list, "],
    },
    "no_files": {
        "release": "bookworm",
        "files": {},
        "fail": ["{role}_debian_mirror is empty", "no source files under",
                 "set {role}_debian_mirror to your Debian mirror"],
    },
}


def write_fixtures(base: Path, files) -> Path:
    base.mkdir(parents=True)
    if files is None:
        return base / "absent"
    apt = base / "apt"
    (apt / "sources.list.d").mkdir(parents=True)
    for rel, text in files.items():
        (apt / rel).write_text(text)
    return apt


def run_cases(tmp: Path, role: str) -> tuple:
    out = tmp / "out"
    out.mkdir()
    hosts = {}
    for name, case in CASES.items():
        host_vars = {
            "ansible_connection": "local",
            "fixture_dir": str(write_fixtures(tmp / "fixtures" / name, case["files"])),
            "fixture_release": case["release"],
        }
        host_vars.update({"%s_%s" % (role, key): value for key, value in case.get("set", {}).items()})
        hosts[name] = host_vars
    inventory = tmp / "inventory.yml"
    inventory.write_text(yaml.safe_dump({"all": {"hosts": hosts}}))
    template = ROOT / "roles" / "nvidia_apt_source" / "templates" / "nvidia.sources.j2"
    playbook = tmp / "play.yml"
    playbook.write_text(yaml.safe_dump([{
        "name": "apt mirror of %s" % role,
        "hosts": "all",
        "gather_facts": False,
        "tasks": [
            {"name": "Facts of a Debian host",
             "ansible.builtin.set_fact": {"distribution": "Debian", "distribution_release": "{{ fixture_release }}",
                                          "cacheable": True}},
            {"name": "Mirror step of the role",
             "ansible.builtin.include_role": {"name": "mlinfra.kvm.%s" % role, "tasks_from": "apt_mirror"},
             "vars": {"__%s_apt_sources_dir" % role: "{{ fixture_dir }}"}},
            {"name": "Record the mirrors",
             "ansible.builtin.copy": {
                 "content": "{{ [nvidia_apt_source_mirror, nvidia_apt_source_security_mirror] | to_json }}",
                 "dest": "%s/{{ inventory_hostname }}.json" % out, "mode": "0644"},
             "check_mode": False},
            {"name": "Render the role's template",
             "ansible.builtin.template": {"src": str(template), "dest": "%s/{{ inventory_hostname }}.sources" % out,
                                          "mode": "0644"},
             "check_mode": False},
        ],
    }], sort_keys=False))
    # run_playbook's own "-i localhost," is read too: --limit keeps the play to the cases.
    proc = run_playbook(playbook, "-i", str(inventory), "--check", "--limit", ",".join(CASES))
    return proc, out


@pytest.fixture(scope="module", params=ROLES)
def role_run(request, tmp_path_factory):
    role = request.param
    proc, out = run_cases(tmp_path_factory.mktemp("apt-mirror-%s" % role), role)
    return role, proc, out


def host_failures(proc: subprocess.CompletedProcess) -> dict:
    """host -> (task name, msg) of its failed task, from the default callback's output."""
    found, task = {}, None
    for line in proc.stdout.splitlines():
        if line.startswith("TASK ["):
            task = line[len("TASK ["):line.rindex("]")]
        match = re.match(r"^fatal: \[([^\]]+)\]: FAILED! => (.*)$", line)
        if match:
            found[match.group(1)] = (task, str(json.loads(match.group(2)).get("msg")))
    return found


def stanzas(text: str) -> list:
    """deb822 stanzas of the rendered file as dicts (comments skipped)."""
    lines = [line for line in text.splitlines() if not line.startswith("#")]
    result = []
    for block in "\n".join(lines).split("\n\n"):
        fields = dict(line.split(": ", 1) for line in block.strip().splitlines() if line)
        if fields:
            result.append(fields)
    return result


@pytest.mark.parametrize("case", [name for name in CASES if "expect" in CASES[name]])
def test_mirror_derivation(role_run, case):
    role, proc, out = role_run
    assert case not in host_failures(proc), (host_failures(proc)[case], proc.stdout[-3000:], proc.stderr[-2000:])
    mirror, security = CASES[case]["expect"]
    assert json.loads((out / ("%s.json" % case)).read_text()) == [mirror, security]
    release = CASES[case]["release"]
    rendered = stanzas((out / ("%s.sources" % case)).read_text())
    expected = [{"Types": "deb", "URIs": mirror, "Suites": "%s %s-updates" % (release, release),
                 "Components": "contrib non-free non-free-firmware",
                 "Signed-By": "/usr/share/keyrings/debian-archive-keyring.gpg"}]
    if security:
        expected.append({"Types": "deb", "URIs": security, "Suites": "%s-security" % release,
                         "Components": "contrib non-free non-free-firmware",
                         "Signed-By": "/usr/share/keyrings/debian-archive-keyring.gpg"})
    assert rendered == expected


@pytest.mark.parametrize("case", [name for name in CASES if "fail" in CASES[name]])
def test_no_mirror_fails_with_the_fix(role_run, case):
    role, proc, out = role_run
    assert proc.returncode != 0
    failed = host_failures(proc)
    assert case in failed, (sorted(failed), proc.stdout[-3000:])
    task, msg = failed[case]
    assert task.endswith("Assert the Debian mirror is known"), failed[case]
    for needle in CASES[case]["fail"]:
        assert needle.format(role=role) in msg, (needle, msg)
    # Nothing after the assertion ran for that host.
    assert not (out / ("%s.json" % case)).exists()
    assert not (out / ("%s.sources" % case)).exists()


@pytest.mark.parametrize("role", ROLES)
def test_mirror_step_comes_before_the_first_change(role):
    """tasks/main.yml: preflight, then the mirror step, then the step that writes the apt file."""
    imports = [task["ansible.builtin.import_tasks"]
               for task in yaml.safe_load((ROOT / "roles" / role / "tasks" / "main.yml").read_text())]
    writer = "sources.yml" if role == "nvidia_driver" else "install.yml"
    assert imports.index("preflight.yml") < imports.index("apt_mirror.yml") < imports.index(writer), imports


@pytest.mark.parametrize("role", ROLES)
def test_defaults_name_no_mirror_host(role):
    base = ROOT / "roles" / role
    defaults = yaml.safe_load((base / "defaults" / "main.yml").read_text())
    spec = yaml.safe_load((base / "meta" / "argument_specs.yml").read_text())["argument_specs"]["main"]["options"]
    for name in ("%s_debian_mirror" % role, "%s_debian_security_mirror" % role):
        assert defaults[name] == "" and spec[name]["default"] == "", name
    for path in list(base.rglob("*")) + list((ROOT / "roles" / "nvidia_apt_source").rglob("*")):
        if path.is_file():
            assert "debian.org" not in path.read_text(errors="replace"), path
