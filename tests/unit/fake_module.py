"""The stand-in for AnsibleModule that the unit tests of the runners and services hand them."""
from __future__ import annotations

from typing import Any, Dict, List, Optional


class StandInModule:
    """The parts of AnsibleModule that a runner or a service uses: params (the defaults of the
    argument spec, when one is given, under the params passed, as AnsibleModule fills them in),
    check mode, diff mode and the warnings raised."""

    def __init__(self, params: Dict[str, Any], argument_spec: Optional[Dict[str, Any]] = None,
                 check_mode: bool = False, diff: bool = False) -> None:
        self.params: Dict[str, Any] = {name: spec.get("default") for name, spec in (argument_spec or {}).items()}
        self.params.update(params)
        self.check_mode = check_mode
        self._diff = diff
        self.warnings: List[str] = []

    def warn(self, text: str) -> None:
        self.warnings.append(text)
