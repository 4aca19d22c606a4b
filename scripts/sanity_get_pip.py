"""Stand-in for get-pip.py, used by scripts/sanity.sh.

ansible-test bootstraps pip into each virtual environment it creates for the sanity tests by running
``~/.ansible/test/cache/get_pip_<version>.py`` and downloads that script from ci-files.testing.ansible.com
when it is missing. That host is out of reach here (only PyPI is), so scripts/sanity.sh copies this file
there instead, beside the matching pip wheel downloaded from PyPI. Like get-pip.py, it runs
``pip install`` from the wheel with the arguments ansible-test passes (``pip==<version>`` and pip options);
``--no-setuptools`` and ``--no-wheel`` are get-pip.py's own options and only mean "do not add them".
"""

from __future__ import annotations

import glob
import os
import re
import sys

GET_PIP_ONLY_OPTIONS = ('--no-setuptools', '--no-wheel')


def main() -> None:
    """Install pip (and whatever else is asked for) from the cached pip wheel."""
    here = os.path.dirname(os.path.abspath(__file__))
    match = re.match(r'get_pip_(\d+(?:_\d+)*)\.py$', os.path.basename(__file__))

    if not match:
        sys.exit('sanity_get_pip: run as get_pip_<version>.py, not %s' % os.path.basename(__file__))

    version = match.group(1).replace('_', '.')
    wheels = glob.glob(os.path.join(here, 'pip-%s-py3-none-any.whl' % version))

    if not wheels:
        sys.exit('sanity_get_pip: no pip %s wheel in %s (scripts/sanity.sh downloads it)' % (version, here))

    sys.path.insert(0, wheels[0])

    from pip._internal.cli.main import main as pip_main  # pylint: disable=import-outside-toplevel

    args = [arg for arg in sys.argv[1:] if arg not in GET_PIP_ONLY_OPTIONS]
    sys.exit(pip_main(['install', '--no-cache-dir'] + args))


if __name__ == '__main__':
    main()
