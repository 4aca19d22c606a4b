"""module_utils/_host/_apt_sources.py: the one parser for the mirror a host's apt uses (the apt_mirror
filter on targets, lab/image/build.sh on the controller, which runs it as a script)."""
from __future__ import annotations

import subprocess
import sys

import pytest

from ansible_collections.mlinfra.kvm.plugins.module_utils._host import _apt_sources
from conftest import ROOT

pytestmark = pytest.mark.unit

SCRIPT = ROOT / "plugins" / "module_utils" / "_host" / "_apt_sources.py"


@pytest.fixture
def apt_dir(tmp_path):
    (tmp_path / "sources.list.d").mkdir()
    # Read first (sources.list), but it has only a deb-src line and another suite.
    (tmp_path / "sources.list").write_text(
        "# comment\ndeb-src http://src.example.invalid/debian bookworm main\n"
        "deb http://old.example.invalid/debian bullseye main\n")
    # deb822, read in name order: a disabled stanza and a deb-src stanza come before the match.
    (tmp_path / "sources.list.d" / "a.sources").write_text(
        "Types: deb\nURIs: http://disabled.example.invalid/debian\nSuites: bookworm\nEnabled: no\n\n"
        "Types: deb-src\nURIs: http://source.example.invalid/debian\nSuites: bookworm\n\n"
        "Types: deb\nURIs: http://main.example.invalid/debian\nSuites: bookworm\n  bookworm-updates\n")
    (tmp_path / "sources.list.d" / "b.list").write_text(
        "deb [arch=amd64 signed-by=/k.gpg] http://later.example.invalid/debian bookworm main\n"
        "deb http://sec.example.invalid/debian-security bookworm-security main\n")
    # apt ignores this name; so does the parser.
    (tmp_path / "sources.list.d" / "c.list.disabled").write_text("deb http://ignored.example.invalid/x bookworm-backports main\n")
    return tmp_path


def test_files_come_in_apts_order(apt_dir):
    assert [p.rsplit("/", 1)[-1] for p, _unused in _apt_sources.files_in(str(apt_dir))] == ["sources.list", "a.sources", "b.list"]


@pytest.mark.parametrize("suite,uri", [
    ("bookworm", "http://main.example.invalid/debian"),
    ("bookworm-updates", "http://main.example.invalid/debian"),   # a folded Suites line
    ("bookworm-security", "http://sec.example.invalid/debian-security"),
    ("bullseye", "http://old.example.invalid/debian"),
    ("bookworm-backports", ""),                                    # only in a file apt ignores
    ("trixie", ""),
])
def test_first_enabled_binary_source_of_the_suite(apt_dir, suite, uri):
    assert _apt_sources.mirror_for(_apt_sources.files_in(str(apt_dir)), suite) == uri


def test_script_prints_what_the_function_returns(apt_dir):
    out = subprocess.run([sys.executable, str(SCRIPT), "bookworm-security", str(apt_dir)],
                         capture_output=True, text=True, check=True).stdout.strip()
    assert out == "http://sec.example.invalid/debian-security"
    none = subprocess.run([sys.executable, str(SCRIPT), "trixie", str(apt_dir)],
                          capture_output=True, text=True, check=True).stdout.strip()
    assert none == ""
