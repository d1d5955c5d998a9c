"""An image whose ENV sets a loader variable that acts whatever its value is refused before anything starts
(blanking cannot neutralise it: tests/security/test_foreign_image_attacks.py shows the attack)."""

from __future__ import annotations

import pytest

from toolcage.engine.imageconfig import LOADER_ANY_VALUE, BadImageConfig, from_inspect


@pytest.mark.parametrize("var", sorted(LOADER_ANY_VALUE))
@pytest.mark.parametrize("value", ["1", ""])
def test_a_value_free_loader_variable_refuses_the_image(var: str, value: str) -> None:
    """LD_SHOW_AUXV and its kind, set to anything (the empty string too), refuse the image, naming the variable."""
    info = {"Id": "sha256:x", "Config": {"Env": ["PATH=/bin", f"{var}={value}"]}}
    with pytest.raises(BadImageConfig, match=var):
        from_inspect("img", info)


def test_the_blankable_loader_variables_are_blanked_not_refused() -> None:
    """LD_PRELOAD, LD_AUDIT, LD_DEBUG and the rest are inert when empty: the image runs, each blanked for the worker."""
    env = ["LD_PRELOAD=/evil.so", "LD_AUDIT=/evil.so", "LD_DEBUG=all", "LD_BIND_NOW=1", "PYTHONINSPECT=1"]
    cfg = from_inspect("img", {"Id": "sha256:x", "Config": {"Env": env}})
    blanked = cfg.blanked_env()
    assert blanked["LD_PRELOAD"] == blanked["LD_AUDIT"] == blanked["LD_DEBUG"] == blanked["PYTHONINSPECT"] == ""
