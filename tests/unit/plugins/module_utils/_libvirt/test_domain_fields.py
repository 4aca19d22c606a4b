"""plugins/module_utils/_libvirt/_domain_spec: the domain's field table. Each field declares the
options it is made from (with their argument spec entries), its XML reader and writer, and
whether a running domain takes a change live or at its next start. Here the declaration is held
against the module's argument spec, its documentation (every option's type, default, choices
and suboptions; the sentence naming what changes live and the note naming what needs a restart)
and the runner's choice between a live change and a redefinition."""
from __future__ import annotations

import re

import pytest
import yaml

from ansible_collections.mlinfra.kvm.plugins.module_utils._libvirt import _domain
from ansible_collections.mlinfra.kvm.plugins.module_utils._libvirt import _domain_spec as S
from ansible_collections.mlinfra.kvm.plugins.modules import domain as domain_module
from option_docs import labels, spec_mismatches

pytestmark = pytest.mark.unit

DOC = yaml.safe_load(domain_module.DOCUMENTATION)
ACTIONS = {"name", "state", "autostart", "restart", "shutdown_timeout", "force", "wait_for_ip",
           "wait_for_ip_timeout", "sysfs_root", "uri", "allowed_paths"}
TABLE_OPTIONS = [(f.key, option) for f in S.FIELD_TABLE for option in f.options]


def test_the_module_argument_spec_is_the_field_table_plus_the_actions():
    spec = _domain.argument_spec()
    assert set(spec) - {option for _key, option in TABLE_OPTIONS} == ACTIONS
    for _key, option in TABLE_OPTIONS:
        assert spec[option] == S.field_option_specs()[option], option


def test_every_option_belongs_to_one_field():
    options = [option for _key, option in TABLE_OPTIONS]
    assert len(options) == len(set(options)), sorted(o for o in options if options.count(o) > 1)


@pytest.mark.parametrize("key,option", TABLE_OPTIONS, ids=[o for _k, o in TABLE_OPTIONS])
def test_every_declared_option_is_documented_as_declared(key, option):
    assert option in DOC["options"], "option %s (field %s) is not documented" % (option, key)
    assert not spec_mismatches(option, S.FIELDS[key].options[option], DOC["options"][option])


def test_every_documented_domain_option_is_declared():
    declared = {option for _key, option in TABLE_OPTIONS} | ACTIONS
    assert set(DOC["options"]) <= declared, sorted(set(DOC["options"]) - declared)


def test_the_description_names_every_field_a_running_domain_takes_live():
    live_sentence = next(line for line in DOC["description"] if "made live" in line)
    missing = [label for label in labels(S.FIELD_TABLE, S.LIVE) if label not in live_sentence]
    assert not missing, "the description's live sentence leaves out %s" % missing


def test_the_restart_note_lists_exactly_the_fields_that_need_a_restart():
    note = next(line for line in DOC["notes"] if line.startswith("Changes that need a restart"))
    listed = re.match(r"Changes that need a restart on a running domain - (.*?)(?:; and .*)?\.$", note).group(1)
    assert listed.split(", ") == labels(S.FIELD_TABLE, S.RESTART)


def test_the_runner_applies_live_only_what_the_table_declares_live():
    root = S.build_new("d", dict(virt_type="qemu", memory_kib=1048576, max_memory_kib=2097152, vcpus=1,
                                 max_vcpus=4, memballoon=True, disks=[]))
    runner = _domain.DomainRunner.__new__(_domain.DomainRunner)
    for f in S.FIELD_TABLE:
        desired = {"disks": [dict(bus="virtio", target="vdb", path="/x", format="raw", readonly=False,
                                  device="disk")]} if f.key == "disks" else {}
        live = runner.can_apply_live(f.key, [f.key], root, desired)
        assert live == (f.change == S.LIVE), (f.key, live)
