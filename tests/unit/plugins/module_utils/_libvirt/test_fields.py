"""plugins/module_utils/_libvirt/_fields: an object kind's options declared once (the pool's
first). The declaration gives the argument spec, reads and writes the XML, and says which
changes need recreate; here it is checked against the module's own documentation, and its
reader and writer against each other and against libvirt's test driver."""
from __future__ import annotations

import pytest
import yaml

from ansible_collections.mlinfra.kvm.plugins.module_utils._core import _xml as X
from ansible_collections.mlinfra.kvm.plugins.module_utils._core._errors import InvalidInputError
from ansible_collections.mlinfra.kvm.plugins.module_utils._libvirt import _pool as P
from ansible_collections.mlinfra.kvm.plugins.module_utils._libvirt._fields import RECREATE, FieldTable, XmlField
from ansible_collections.mlinfra.kvm.plugins.modules import pool as pool_module

pytestmark = pytest.mark.unit

DOC = yaml.safe_load(pool_module.DOCUMENTATION)
BASE = dict(name="p", type="dir", target=None, source_host=None, source_dir=None, source_format="auto",
            source_name=None, source_devices=[], xml=None)


@pytest.mark.parametrize("option", P.FIELDS.options)
def test_every_declared_pool_option_is_documented_as_declared(option):
    spec = P.FIELDS.option_specs()[option]
    doc = DOC["options"][option]
    for key in ("type", "elements", "default", "choices"):
        assert doc.get(key) == spec.get(key), (option, key, doc.get(key), spec.get(key))


def test_the_recreate_option_names_every_field_whose_change_needs_it():
    text = " ".join(DOC["options"]["recreate"]["description"])
    missing = [o for o in P.FIELDS.with_change(RECREATE) if "O(%s)" % o not in text]
    assert not missing, "the recreate option's description leaves out %s" % missing


def test_the_module_argument_spec_is_the_declaration_plus_the_actions():
    spec = P.argument_spec()
    for option, entry in P.FIELDS.option_specs().items():
        assert spec[option] == entry
    actions = {"name", "state", "build", "autostart", "recreate", "purge", "force", "xml", "uri"}
    assert set(spec) - set(P.FIELDS.options) == actions


@pytest.mark.parametrize("params", [
    dict(type="dir", target="/srv/a/../b/"),
    dict(type="logical", source_name="vg0", source_devices=["/dev/sdc", "/dev/sdb"]),
    dict(type="netfs", target="/mnt/n", source_host="nfs1", source_dir="/export", source_format="nfs"),
])
def test_what_the_writer_puts_in_the_reader_gives_back(params):
    spec = P.desired_spec(dict(BASE, **params))
    assert P.spec_from_xml(P.build_xml("p", spec)) == spec


def test_the_logical_constant_is_written_and_never_read_as_an_option():
    xml = P.build_xml("vg", P.desired_spec(dict(BASE, type="logical", source_devices=["/dev/b", "/dev/a"])))
    root = X.parse(xml)
    assert [el.tag for el in root.find("source")] == ["device", "device", "name", "format"]
    assert root.find("source/format").get("type") == "lvm2"
    assert "source_format" not in P.spec_from_xml(xml)


def test_fields_of_another_pool_type_are_neither_read_nor_written():
    xml = ("<pool type='dir'><name>a</name><source><host name='h'/></source>"
           "<target><path>/a</path></target></pool>")
    assert P.spec_from_xml(xml) == {"type": "dir", "target": "/a"}
    root = X.element("pool")
    P.FIELDS.write(root, {"type": "dir", "target": "/a", "source_host": "h"})
    assert root.find("source") is None


def test_free_text_fields_are_checked_item_by_item():
    with pytest.raises(InvalidInputError) as err:
        P.validate_input(dict(BASE, type="logical", source_devices=["/dev/a", "/dev/b\n"]))
    assert err.value.msg.startswith("option source_devices[1]: "), err.value.msg


def test_a_table_refuses_an_unknown_change_policy():
    with pytest.raises(ValueError):
        FieldTable("type", [XmlField("x", "x", change="live-maybe")])


def test_the_declared_xml_is_what_libvirt_keeps():
    """libvirt's test driver defines the written pool and gives back XML that reads the same."""
    libvirt = pytest.importorskip("libvirt", reason="libvirt-python is installed by make setup")
    conn = libvirt.open("test:///default")
    try:
        spec = P.desired_spec(dict(BASE, name="fieldcheck", type="dir", target="/var/tmp/fieldcheck/"))
        pool = conn.storagePoolDefineXML(P.build_xml("fieldcheck", spec), 0)
        try:
            assert P.spec_from_xml(pool.XMLDesc(0)) == spec  # the test driver takes no INACTIVE flag
        finally:
            pool.undefine()
    finally:
        conn.close()
