"""plugins/module_utils/_libvirt/_snapshot: the snapshot's field table held against the module's
argument spec and documentation; the runner compares and reports exactly the declared fields."""
from __future__ import annotations

import pytest
import yaml

from ansible_collections.mlinfra.kvm.plugins.module_utils._libvirt import _snapshot as S
from ansible_collections.mlinfra.kvm.plugins.modules import snapshot as snapshot_module
from option_docs import argspec_outside_the_table, undocumented

pytestmark = pytest.mark.unit

DOC = yaml.safe_load(snapshot_module.DOCUMENTATION)
ACTIONS = {"domain", "name", "state", "after_revert", "force", "children", "uri"}


def test_the_module_argument_spec_is_the_field_table_plus_the_actions():
    assert not argspec_outside_the_table(S.argument_spec(), S.FIELD_TABLE, DOC["options"], ACTIONS)


def test_every_declared_option_is_documented_as_declared():
    assert not undocumented(S.FIELD_TABLE, DOC["options"])


def test_the_diff_shows_the_declared_fields():
    snap = {"name": "s", "description": "before upgrade", "metadata": {"commit": "abc"}, "current": True}
    assert S.SnapshotRunner.diff_view(snap) == {"state": "present", "description": "before upgrade",
                                                "metadata": {"commit": "abc"}}
    assert S.SnapshotRunner.diff_view(None) == {"state": "absent"}
