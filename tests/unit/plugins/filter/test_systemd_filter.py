"""systemd_units_up (plugins/filter/systemd.py): which units of one `systemctl show` run and
are enabled. The sample is systemd 252's output (Debian 12 guests) for the monitoring role's
units: running and enabled, stopped, enabled but failed, and a unit systemd does not know."""
from __future__ import annotations

import pytest
from ansible.errors import AnsibleFilterError

from ansible_collections.mlinfra.kvm.plugins.filter.systemd import systemd_units_up

pytestmark = pytest.mark.unit

SHOW = """Id=prometheus-node-exporter.service
ActiveState=active
UnitFileState=enabled

Id=prometheus.service
UnitFileState=enabled
ActiveState=active

Id=prometheus-alertmanager.service
ActiveState=inactive
UnitFileState=disabled

Id=prometheus-blackbox-exporter.service
ActiveState=failed
UnitFileState=enabled

Id=mlinfra-alert-receiver.service
ActiveState=inactive
UnitFileState=
"""


def test_only_units_running_and_enabled_count():
    # Property order is systemd's, not the order asked for: the filter reads keys, not positions.
    assert systemd_units_up(SHOW) == ["prometheus-node-exporter.service", "prometheus.service"]


def test_running_but_disabled_is_not_up():
    assert systemd_units_up("Id=a.service\nActiveState=active\nUnitFileState=disabled\n") == []


def test_no_output_means_no_unit_up():
    # The read is skipped on hosts without systemd: the role passes an empty string.
    assert systemd_units_up("") == [] and systemd_units_up("\n\n") == []


@pytest.mark.parametrize("text, needle", [
    ("Id=a.service\nActiveState=active\n", "lacks Id, ActiveState or UnitFileState"),
    ("Failed to connect to bus: No such file or directory\n", "is not a KEY=VALUE line"),
])
def test_output_that_is_not_systemctl_show_is_refused(text, needle):
    with pytest.raises(AnsibleFilterError, match=needle):
        systemd_units_up(text)
