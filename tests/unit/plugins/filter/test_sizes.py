"""plugins/filter/sizes.py: size_mib and size_bytes, the filters the guest role's preflight uses
to read memory and disk sizes the way the domain and volume modules do."""
from __future__ import annotations

import pytest
from ansible.errors import AnsibleFilterError

from ansible_collections.mlinfra.kvm.plugins.filter.sizes import FilterModule, size_bytes_filter, size_mib

pytestmark = pytest.mark.unit


@pytest.mark.parametrize("value,expected", [("2G", 2048), ("512M", 512), (4096, 4096), ("4096", 4096), (" 1G ", 1024)])
def test_size_mib_reads_units_and_takes_a_bare_number_in_mib(value, expected):
    assert size_mib(value) == expected


def test_size_mib_takes_a_bare_number_in_the_unit_given():
    assert size_mib(3, bare_unit="G") == 3072


def test_size_bytes_reads_units():
    assert size_bytes_filter("1K") == 1024 and size_bytes_filter("10G") == 10 * 1024 ** 3


@pytest.mark.parametrize("bad", ["lots", "-1G", "1.5Q"])
def test_a_bad_size_is_a_filter_error_naming_the_value(bad):
    for filt in (size_mib, size_bytes_filter):
        with pytest.raises(AnsibleFilterError) as caught:
            filt(bad)
        assert repr(bad) in str(caught.value) or bad in str(caught.value), str(caught.value)


def test_the_filters_are_registered_under_their_names():
    assert set(FilterModule().filters()) == {"size_mib", "size_bytes"}
