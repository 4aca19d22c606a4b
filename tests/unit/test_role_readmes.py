"""Each role's README lists the variables of its meta/argument_specs.yml (scripts/role_readme.py).

Galaxy shows a role's README, not its argument spec. The generator writes the README's variable
tables from the spec; these tests fail when a spec changed without its README (run
`make role-readmes`), and check on a copy of a role that the check itself catches such a change.
"""
from __future__ import annotations

import importlib.util
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from conftest import ROOT

pytestmark = pytest.mark.unit

SCRIPT = ROOT / "scripts" / "role_readme.py"
ROLES = sorted(path.parent.parent.name for path in (ROOT / "roles").glob("*/meta/argument_specs.yml"))


def role_readme():
    """The generator as a module, for the tests of its pieces."""
    spec = importlib.util.spec_from_file_location("role_readme", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def run(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(SCRIPT), *args], capture_output=True, text=True, cwd=str(ROOT),
                          timeout=120, check=False)


def generated_block(readme: str) -> str:
    """The README's text between the generator's markers."""
    module = role_readme()
    assert readme.count(module.BEGIN) == 1 and readme.count(module.END) == 1, "markers missing or repeated"
    return readme.split(module.BEGIN, 1)[1].split(module.END, 1)[0]


def option_names(options: dict, prefix: str = "") -> list[str]:
    """Every option of a spec, suboptions as parent.child."""
    names = []
    for name, spec in (options or {}).items():
        names.append(prefix + name)
        names += option_names((spec or {}).get("options") or {}, prefix + name + ".")
    return names


def copy_role(role: str, roles_dir: Path) -> Path:
    """A role's README, meta/ and defaults/ (what the generator reads) under roles_dir."""
    source, target = ROOT / "roles" / role, roles_dir / role
    target.mkdir(parents=True)
    shutil.copy2(source / "README.md", target / "README.md")
    shutil.copytree(source / "meta", target / "meta")
    if (source / "defaults").is_dir():
        shutil.copytree(source / "defaults", target / "defaults")
    return target


def test_role_readmes_match_their_argument_specs():
    proc = run("--check")
    assert proc.returncode == 0, "%s%s\nrun `make role-readmes` and commit the READMEs" % (proc.stdout, proc.stderr)


@pytest.mark.parametrize("role", ROLES)
def test_every_option_of_every_entry_point_is_in_the_readme(role):
    specs = yaml.safe_load((ROOT / "roles" / role / "meta" / "argument_specs.yml").read_text())["argument_specs"]
    block = generated_block((ROOT / "roles" / role / "README.md").read_text())
    missing = sorted({name for entry in specs.values() for name in option_names((entry or {}).get("options"))
                      if "`%s`" % name not in block})
    assert not missing, "%s: README.md does not name %s" % (role, missing)
    if list(specs) != ["main"]:
        for entry_point in specs:
            assert "### Entry point `%s`" % entry_point in block


def test_check_names_the_role_whose_spec_gained_an_option(tmp_path):
    roles_dir = tmp_path / "roles"
    guest, cuda = copy_role("guest", roles_dir), copy_role("cuda", roles_dir)
    assert run("--check", "--roles-dir", str(roles_dir)).returncode == 0
    spec_file = guest / "meta" / "argument_specs.yml"
    spec = yaml.safe_load(spec_file.read_text())
    spec["argument_specs"]["main"]["options"]["guest_new_option"] = {
        "type": "str", "default": "a|b", "description": "A new option | with a pipe.\nAnd a second line."}
    spec_file.write_text(yaml.safe_dump(spec, sort_keys=False))
    readme_before = (guest / "README.md").read_text()

    proc = run("--check", "--roles-dir", str(roles_dir))
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert "guest" in proc.stderr and "cuda" not in proc.stderr
    assert (guest / "README.md").read_text() == readme_before, "--check wrote the README"

    proc = run("--roles-dir", str(roles_dir))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    readme = (guest / "README.md").read_text()
    row = next(line for line in readme.splitlines() if line.startswith("| `guest_new_option` |"))
    assert row == "| `guest_new_option` | str | `a\\|b` | no | A new option \\| with a pipe. And a second line. |"
    module = role_readme()
    assert readme.split(module.BEGIN)[0] == readme_before.split(module.BEGIN)[0], "hand-written text changed"
    assert readme.split(module.END)[1] == readme_before.split(module.END)[1], "hand-written text changed"
    assert (cuda / "README.md").read_text() == (ROOT / "roles" / "cuda" / "README.md").read_text()
    assert run("--check", "--roles-dir", str(roles_dir)).returncode == 0


def test_readme_without_markers_gets_a_variables_section(tmp_path):
    roles_dir = tmp_path / "roles"
    role = copy_role("cuda", roles_dir)
    (role / "README.md").write_text("# mlinfra.kvm.cuda\n\nHand-written.\n")
    assert run("--check", "--roles-dir", str(roles_dir)).returncode == 1
    assert run("--roles-dir", str(roles_dir)).returncode == 0
    readme = (role / "README.md").read_text()
    module = role_readme()
    assert readme.startswith("# mlinfra.kvm.cuda\n\nHand-written.\n\n## Variables\n\n%s\n" % module.BEGIN)
    assert readme.endswith(module.END + "\n")
    assert "| `cuda_source` | str | `distro` | no |" in readme


def test_cells_escape_markdown_and_defaults_are_shortened():
    module = role_readme()
    assert module.cell("a|b\nc") == "a\\|b<br>c"
    assert module.markup("C(x|y) for mlinfra_<role> *.list") == "`x|y` for mlinfra\\_\\<role\\> \\*.list"
    text, note = module.shortened(list(range(100)))
    assert text.endswith(", …]") and len(text) <= module.MAX_DEFAULT and note == " (100 items)"
    assert module.summary("First sentence, e.g. this. " + "Second sentence. " * 20) == "First sentence, e.g. this."
    assert module.default_cell({"required": True}, {"x": ""}, "x") == ""
    assert module.default_cell({}, {"x": "{{ y }}"}, "x") == "`'{{ y }}'`"
