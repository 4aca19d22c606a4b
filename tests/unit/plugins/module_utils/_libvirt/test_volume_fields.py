"""plugins/module_utils/_libvirt/_volume: the volume's field table held against the module's argument
spec and documentation (every option as declared; the description naming what is never changed
on an existing volume)."""
from __future__ import annotations

import pytest
import yaml

from ansible_collections.mlinfra.kvm.plugins.module_utils._core import _xml as X
from ansible_collections.mlinfra.kvm.plugins.module_utils._libvirt import _volume as V
from ansible_collections.mlinfra.kvm.plugins.module_utils._libvirt._fields import LIVE, NEVER, refuse_never_changes
from ansible_collections.mlinfra.kvm.plugins.modules import volume as volume_module
from option_docs import argspec_outside_the_table, labels, undocumented

pytestmark = pytest.mark.unit

DOC = yaml.safe_load(volume_module.DOCUMENTATION)
ACTIONS = {"name", "pool", "state", "import_from", "force", "uri", "allowed_paths"}


def test_the_module_argument_spec_is_the_field_table_plus_the_actions():
    assert not argspec_outside_the_table(V.argument_spec(), V.FIELD_TABLE, DOC["options"], ACTIONS)


def test_every_declared_option_is_documented_as_declared():
    assert not undocumented(V.FIELD_TABLE, DOC["options"])


def test_the_description_names_what_is_never_changed_in_place():
    sentence = " ".join(line for line in DOC["description"] if "never shrunk" in line)
    assert all(label in sentence for label in labels(V.FIELD_TABLE, NEVER)), labels(V.FIELD_TABLE, NEVER)
    assert labels(V.FIELD_TABLE, LIVE) == ["capacity"] and "O(capacity) in place" in sentence


def test_the_reader_gives_back_what_the_writer_put_in():
    root = X.parse(V.build_xml("o.qcow2", "qcow2", 1024, "/srv/base.qcow2", "raw"))
    assert V.read_xml(root) == {"format": "qcow2", "backing": "/srv/base.qcow2", "backing_format": "raw"}
    assert V.read_xml(X.parse(V.build_xml("e.raw", "raw", 1024, None, None))) == {
        "format": "raw", "backing": None, "backing_format": None}
    assert set(V.DIFF_FIELDS) == {"state"} | {f.key for f in V.FIELD_TABLE}


def test_every_never_field_says_why_and_the_fix():
    assert [f.key for f in V.FIELD_TABLE if f.change == NEVER and not f.never] == []


BEFORE = {"format": "qcow2", "capacity": 1 << 30, "backing": "/srv/base.qcow2", "backing_format": "qcow2"}


@pytest.mark.parametrize("option,value,fix", [
    ("format", "raw", "Delete it first (state: absent) or use another name."),
    ("backing", "/srv/other.qcow2", "Delete it first (state: absent) or use another name."),
    ("backing_format", "raw", "Set backing_format: qcow2 or leave it unset."),
])
def test_a_never_field_change_is_refused_naming_option_value_current_and_fix(option, value, fix):
    wanted = {"format": None, "backing": None, "backing_format": None, option: value}
    with pytest.raises(V.ConflictError) as caught:
        refuse_never_changes(V.FIELD_TABLE, BEFORE, wanted, "volume d.qcow2")
    assert caught.value.msg.startswith("option %s: value %r differs from volume d.qcow2, whose " % (option, value))
    assert str(BEFORE[option]) in caught.value.msg and caught.value.msg.endswith(fix)
    assert caught.value.details == {"option": option}


def test_unset_or_equal_never_fields_and_live_fields_pass():
    refuse_never_changes(V.FIELD_TABLE, BEFORE, dict(BEFORE, capacity=2 << 30), "volume d.qcow2")
    refuse_never_changes(V.FIELD_TABLE, BEFORE, {"format": None, "backing": None, "backing_format": None},
                         "volume d.qcow2")
