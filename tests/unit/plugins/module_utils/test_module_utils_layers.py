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


# -- the module files: docs and a main() --------------------------------------------------------
# A module file is its documentation, its imports and a main() that builds the AnsibleModule and
# hands it to a runner in module_utils (plugins/modules/network.py). The most main() needs today is
# 13 code lines (domain: a connection and a runner); 20 leaves room without letting logic back in.
MODULES = Path(ROOT) / "plugins" / "modules"
DOC_STRINGS = {"DOCUMENTATION", "EXAMPLES", "RETURN"}
MOST_CODE_LINES = 20


def code_lines(tree: ast.Module, source: str) -> int:
    """Non-blank, non-comment lines of ``source`` outside its docs strings and its docstring."""
    lines = source.splitlines()
    counted = set()
    for node in tree.body:
        if isinstance(node, ast.Assign) and {getattr(t, "id", "") for t in node.targets} & DOC_STRINGS:
            continue
        if isinstance(node, ast.Expr) and isinstance(node.value, ast.Constant):
            continue
        counted.update(n for n in range(node.lineno, node.end_lineno + 1)
                       if lines[n - 1].strip() and not lines[n - 1].strip().startswith("#"))
    return len(counted)


@pytest.mark.parametrize("path", sorted(MODULES.glob("*.py")), ids=lambda p: p.stem)
def test_a_module_file_is_docs_and_a_main(path):
    source = path.read_text()
    tree = ast.parse(source, str(path))
    defined = [node.name for node in tree.body if isinstance(node, (ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef))]
    assert defined == ["main"], "%s defines %s: a module file holds one main(); put runners, services and " \
        "helpers in their layer under plugins/module_utils/" % (path.name, defined)
    assert code_lines(tree, source) <= MOST_CODE_LINES, "%s has %d code lines outside its docs; main() needs at " \
        "most %d: move the rest (argument spec, logic) beside its runner" % (path.name, code_lines(tree, source), MOST_CODE_LINES)
    assert "noqa: E402" not in source, "%s: imports go after the docs strings, not below code" % path.name


def test_the_code_line_count_sees_logic(tmp_path):
    """The rule above can fail: a file with a helper function and a class is caught."""
    source = "DOCUMENTATION = ''\nclass Runner:\n    pass\n\n\ndef helper():\n    return 1\n\n\ndef main():\n    helper()\n"
    tree = ast.parse(source)
    assert code_lines(tree, source) == 6
    assert [n.name for n in tree.body if isinstance(n, (ast.ClassDef, ast.FunctionDef))] == ["Runner", "helper", "main"]


# -- libvirt is called by services only ---------------------------------------------------------
# docs/architecture.md: the *Service class beside each runner is the only code that calls libvirt,
# through _connection.call() (and lookup()), which turns a libvirtError into a LibvirtCallError.
# Runners, readers, guards and the resource lists' gather_* functions ask a service's named method.
LIBVIRT_LAYER = MODULE_UTILS / "_libvirt"
LIBVIRT_WRAPPERS = ("call", "lookup")


def libvirt_calls_outside_services(source: str):
    """(line, wrapper, where) for every call()/lookup() in ``source`` that is not inside a class whose
    name ends in "Service"; ``where`` is the enclosing class and function names."""
    found = []

    def visit(node, in_service, where):
        for child in ast.iter_child_nodes(node):
            if isinstance(child, (ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
                inside = in_service or (isinstance(child, ast.ClassDef) and child.name.endswith("Service"))
                visit(child, inside, "%s.%s" % (where, child.name) if where else child.name)
                continue
            if isinstance(child, ast.Call) and isinstance(child.func, ast.Name) and child.func.id in LIBVIRT_WRAPPERS \
                    and not in_service:
                found.append((child.lineno, child.func.id, where or "module level"))
            visit(child, in_service, where)

    visit(ast.parse(source), False, "")
    return found


def test_only_services_call_libvirt():
    wrong = ["%s:%d %s() in %s" % (path.relative_to(ROOT), line, wrapper, where)
             for path in sorted(LIBVIRT_LAYER.glob("*.py"))
             for line, wrapper, where in libvirt_calls_outside_services(path.read_text())]
    assert not wrong, "only a *Service class calls libvirt (docs/architecture.md); make each of these a named " \
        "method of the service of its kind and call that: %s" % wrong


def test_the_libvirt_call_scan_finds_an_offender():
    """The rule above can fail: a call() in a function nested in a module function and a lookup() in a
    class that is no service are caught; the service's own call() is not."""
    source = "\n".join([
        "class PoolService:",
        "    def list_all(self):",
        "        return call('listing pools', self.conn.listAllStoragePools, 0)",
        "",
        "def gather(conn):",
        "    def read(pool):",
        "        return call('reading pool XML', pool.XMLDesc, 0)",
        "    return [read(p) for p in PoolService(conn).list_all()]",
        "",
        "class Reader:",
        "    def run(self):",
        "        return lookup('looking up pool x', self.conn.storagePoolLookupByName, 'x', ())",
    ])
    assert libvirt_calls_outside_services(source) == [(7, "call", "gather.read"), (12, "lookup", "Reader.run")]
