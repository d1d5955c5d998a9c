"""The README says the Docker suites fail, never skip, but for two files that need more than Docker (gVisor's
runsc, a Podman service), which skip naming what is missing unless CI requires them. This holds the code to it."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
# the file -> the variable that turns its skip into a failure (set by .ci/run)
MAY_SKIP = {
    "tests/integration/test_gvisor.py": "TOOLCAGE_REQUIRE_GVISOR",
    "tests/integration/test_podman.py": "TOOLCAGE_REQUIRE_PODMAN",
}
SKIPS = re.compile(r"pytest\.skip\(|pytest\.mark\.skip(if)?\b|pytest\.importorskip\(|unittest\.skip")


def test_only_the_named_files_skip_and_ci_requires_them() -> None:
    found = {}
    for path in sorted([*(ROOT / "tests" / "integration").rglob("*.py"), *(ROOT / "tests" / "security").rglob("*.py")]):
        rel = path.relative_to(ROOT).as_posix()
        if SKIPS.search(path.read_text()):
            found[rel] = path.read_text()
    assert set(found) == set(MAY_SKIP), sorted(found)
    ci = (ROOT / ".ci" / "run").read_text()
    readme = (ROOT / "README.md").read_text()
    for rel, var in MAY_SKIP.items():
        assert f'os.environ.get("{var}") == "1"' in found[rel] and "pytest.fail(" in found[rel], rel
        assert f"export {var}=1" in ci and var in readme and Path(rel).name in readme
