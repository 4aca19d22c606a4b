"""plugins/module_utils/_libvirt/_network: the network's field table (the options each field is made
from, and whether an active network takes a change live or waits for a restart) held against the
module's argument spec, its documentation and the runner's live/restart split."""
from __future__ import annotations

import pytest
import yaml

from ansible_collections.mlinfra.kvm.plugins.module_utils._libvirt import _network as N
from ansible_collections.mlinfra.kvm.plugins.module_utils._libvirt._fields import LIVE, RESTART
from ansible_collections.mlinfra.kvm.plugins.modules import network as network_module
from option_docs import argspec_outside_the_table, labels, undocumented

pytestmark = pytest.mark.unit

DOC = yaml.safe_load(network_module.DOCUMENTATION)
ACTIONS = {"name", "state", "autostart", "restart", "uri"}


def test_the_module_argument_spec_is_the_field_table_plus_the_actions():
    assert not argspec_outside_the_table(N.argument_spec(), N.FIELD_TABLE, DOC["options"], ACTIONS)


def test_every_declared_option_is_documented_as_declared():
    assert not undocumented(N.FIELD_TABLE, DOC["options"])


def test_every_field_is_one_the_reader_gives_back():
    spec = N.spec_from_xml(N.build_xml("n", dict(mode="nat", address="10.9.0.1", prefix=24)))
    assert set(spec) == {f.key for f in N.FIELD_TABLE}


def test_the_description_names_what_changes_live_and_what_waits_for_a_restart():
    live = next(line for line in DOC["description"] if "applied live" in line)
    assert all(label in live for label in labels(N.FIELD_TABLE, LIVE)), (live, labels(N.FIELD_TABLE, LIVE))
    rest = next(line for line in DOC["description"] if line.startswith("Any other change"))
    listed = rest[rest.index("(") + 1:rest.index(")")].replace("\n", " ")
    assert listed.split(", ") == labels(N.FIELD_TABLE, RESTART)


def test_the_live_fields_are_the_two_sections_the_runner_updates_live():
    """update_hosts_live sends DHCP hosts and DNS hosts through virNetworkUpdate, nothing else."""
    assert N.LIVE_FIELDS == ("hosts", "dns_hosts")
    assert set(N.ALL_FIELDS) == {f.key for f in N.FIELD_TABLE}
