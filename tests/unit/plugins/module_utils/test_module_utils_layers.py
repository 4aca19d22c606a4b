"""plugins/module_utils/ is split into layers (README: "Layout"). Each file lives in a layer,
and a layer imports only the layers it is allowed to: `_core` none, `_libvirt` `_core` and
`_host` (a domain's PCI devices), `_slurm` `_core` and `_ml` (a job's
accounting on its stage's MLflow run), every other layer `_core` alone. Read from the import
statements, so a new cross-layer import fails here with the file and the line."""
from __future__ import annotations

import ast
from pathlib import Path

import pytest

from conftest import ROOT

pytestmark = pytest.mark.unit

MODULE_UTILS = Path(ROOT) / "plugins" / "module_utils"
ALLOWED = {
    "_core": set(),
    "_host": {"_core"},
    "_libvirt": {"_core", "_host"},
    "_nvidia": {"_core"},
    "_ml": {"_core"},
    "_slurm": {"_core", "_ml"},  # a job's accounting lands on its stage's MLflow run
}
ABSOLUTE = "ansible_collections.mlinfra.kvm.plugins.module_utils."


def layer_imports(path: Path):
    """(line, layer) for every import of another module_utils layer in ``path``."""
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if not isinstance(node, ast.ImportFrom):
            continue
        if node.level == 2 and node.module:
            yield node.lineno, node.module.split(".")[0]
        elif node.level == 0 and (node.module or "").startswith(ABSOLUTE):
            yield node.lineno, node.module[len(ABSOLUTE):].split(".")[0]


def test_every_module_utils_file_lives_in_a_known_layer():
    loose = sorted(p.name for p in MODULE_UTILS.glob("*.py"))
    layers = sorted(p.name for p in MODULE_UTILS.iterdir() if p.is_dir() and p.name != "__pycache__")
    assert not loose, "put these in a layer under plugins/module_utils/: %s" % loose
    assert layers == sorted(ALLOWED), layers


@pytest.mark.parametrize("layer", sorted(ALLOWED))
def test_a_layer_imports_only_what_it_may(layer):
    wrong = ["%s:%d imports %s" % (path.relative_to(ROOT), line, other)
             for path in sorted((MODULE_UTILS / layer).glob("*.py"))
             for line, other in layer_imports(path)
             if other != layer and other not in ALLOWED[layer]]
    assert not wrong, "layer %s may import only %s: %s" % (layer, sorted(ALLOWED[layer]) or "no other layer", wrong)
