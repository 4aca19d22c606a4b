"""plugins/doc_fragments/host.py: the roots every host module reads (sysfs_root, proc_root,
etc_root) are documented once, in a fragment each, and declared once, in _host/_sysfs.py's
ROOTS_ARGSPEC. Here every module that extends a root's fragment declares exactly that argument
spec entry, and every host module that takes a root documents it through the fragment."""
from __future__ import annotations

import importlib
from typing import Any, Dict
from unittest import mock

import pytest
import yaml

from ansible_collections.mlinfra.kvm.plugins.doc_fragments.host import ModuleDocFragment
from ansible_collections.mlinfra.kvm.plugins.module_utils._host._sysfs import ROOTS_ARGSPEC

pytestmark = pytest.mark.unit

HOST_MODULES = ("pci_info", "vfio_pci", "kernel_cmdline", "hugepages")


class _Captured(Exception):
    pass


def argument_spec_of(name: str) -> Dict[str, Any]:
    """The argument spec a module's main() hands to AnsibleModule (which is stopped there)."""
    module = importlib.import_module("ansible_collections.mlinfra.kvm.plugins.modules." + name)

    def stop(**kwargs: Any) -> None:
        raise _Captured(kwargs["argument_spec"])

    with mock.patch.object(module, "AnsibleModule", side_effect=stop):
        with pytest.raises(_Captured) as captured:
            module.main()
    return captured.value.args[0]


def documentation_of(name: str) -> Dict[str, Any]:
    module = importlib.import_module("ansible_collections.mlinfra.kvm.plugins.modules." + name)
    return yaml.safe_load(module.DOCUMENTATION)


@pytest.mark.parametrize("root", sorted(ROOTS_ARGSPEC))
def test_each_root_fragment_documents_its_argument_spec_entry(root):
    option = yaml.safe_load(getattr(ModuleDocFragment, root.upper()))["options"][root]
    assert (option["type"], option["default"]) == (ROOTS_ARGSPEC[root]["type"], ROOTS_ARGSPEC[root]["default"])


@pytest.mark.parametrize("name", HOST_MODULES)
def test_a_host_module_documents_its_roots_through_the_fragments_and_declares_them_as_paired(name):
    spec, doc = argument_spec_of(name), documentation_of(name)
    taken = {root for root in ROOTS_ARGSPEC if root in spec}
    assert taken, "%s takes none of the roots" % name
    fragments = {f.rsplit(".", 1)[1] for f in doc.get("extends_documentation_fragment", [])
                 if f.startswith("mlinfra.kvm.host.")}
    assert fragments == taken, (name, sorted(fragments), sorted(taken))
    assert not taken & set(doc["options"]), "%s documents a root itself as well as through the fragment" % name
    for root in taken:
        assert spec[root] == ROOTS_ARGSPEC[root], (name, root)


@pytest.mark.parametrize("name", HOST_MODULES)
def test_every_note_of_a_host_module_is_a_sentence(name):
    """A note written as 'Reads below X: ...' parses as a mapping, not as text."""
    assert all(isinstance(note, str) for note in documentation_of(name)["notes"])
