"""A session's own deadline and sizes as keywords (``run_s=``, ``memory=``, ``scratch=``), as the CLI's flags,
resolved once in ``RunOptions.resolve``; and a missing image's message that names what builds that tag."""

from __future__ import annotations

import pytest

from toolcage import Pool, Sandbox
from toolcage.errors import UsageError, image_missing
from toolcage.image.build import SOURCE_LABEL, check_worker_image
from toolcage.options import DEFAULT_IMAGE, RunOptions
from toolcage.policies import PolicyError


def test_run_s_memory_and_scratch_set_the_runs_policy() -> None:
    """The keywords set timeouts.run_s (longer than the policy's 60 s too), limits.memory and limits.scratch."""
    opts = RunOptions.resolve("default", tool="t", sandbox="none", run_s=600, memory="512m", scratch="64m", audit=False)
    p = opts.policy
    assert (p.timeouts.run_s, p.limits.memory, p.limits.scratch) == (600.0, 512 << 20, 64 << 20)
    assert RunOptions.resolve("default", tool="t", sandbox="none", audit=False).policy.timeouts.run_s == 60.0
    tight = RunOptions.resolve("default", tool="t", sandbox="none", audit=False, run_s=600, run_timeout=5)
    assert tight.policy.timeouts.run_s == 5.0  # run_timeout only tightens what run_s set
    sb = Sandbox(sandbox="none", audit=False, run_s=90, memory="256m")
    assert (sb.policy.timeouts.run_s, sb.policy.limits.memory) == (90.0, 256 << 20)


@pytest.mark.parametrize(
    ("keyword", "value", "named"),
    [
        ("run_s", 0, "run_s"),
        ("run_s", "long", "run_s"),
        ("memory", "lots", "limits.memory"),
        ("scratch", "1x", "scratch"),
    ],
)
def test_a_bad_value_is_a_clear_policy_error(keyword: str, value: object, named: str) -> None:
    """A bad run_s, memory or scratch is a PolicyError naming the knob, before anything starts."""
    with pytest.raises(PolicyError, match=named):
        Sandbox(sandbox="none", audit=False, **{keyword: value})  # type: ignore[arg-type]


def test_a_pooled_sandbox_takes_them_from_its_pool() -> None:
    """Sandbox(pool=..., memory=...) is refused: a slot was made for the pool's policy; Pool takes them."""
    with Pool(sandbox="none", audit=False, size=1, run_s=120, memory="256m") as pool:
        assert pool.policy.timeouts.run_s == 120.0 and pool.policy.limits.memory == 256 << 20
        with pytest.raises(UsageError, match="timeouts and limits from its pool"):
            Sandbox(pool=pool, memory="1g")


def test_a_missing_image_names_what_builds_that_tag() -> None:
    """The default worker image: `toolcage image build`; a tag of your own: the command that makes that tag."""
    assert "Build it with `toolcage image build`." in image_missing(DEFAULT_IMAGE).message
    own = image_missing("my-tools:1").message
    assert "toolcage image build --tag my-tools:1" in own and "--pip PKG --tag my-tools:1" in own
    assert "Build it with `toolcage image build`." not in own and image_missing("my-tools:1").status == "image_missing"


def test_the_one_worker_image_check() -> None:
    """check_worker_image: missing, foreign (no source label) or a worker image (one built FROM it included)."""
    assert check_worker_image(None) == "missing"
    assert check_worker_image({"Config": {"Labels": {"other": "x"}}}) == "foreign"
    assert check_worker_image({"Config": {"Labels": {SOURCE_LABEL: "abc"}}}) == "worker"
