"""Side-by-side timings of toolcage against plain `docker run` (run: python -m bench).

Every ``python -m bench...`` measures Python processes as a user's install runs them: with the bytecode
cache. An environment with ``PYTHONDONTWRITEBYTECODE`` set (this project's machines set it) makes every
process compile each module it imports from source, about 170 ms more per ``toolcage run`` in the
package's own modules alone (measured with ``bench.split_cli``), a cost no installed wheel pays (pip
compiles at install). So the variable is dropped here, for this process and every process it starts, and
the package's modules are compiled once before anything is timed.
"""

from __future__ import annotations

import os
import sys

os.environ.pop("PYTHONDONTWRITEBYTECODE", None)
sys.dont_write_bytecode = False


def _compile_package() -> None:
    import compileall
    import importlib.util

    spec = importlib.util.find_spec("toolcage")
    roots = list(spec.submodule_search_locations or []) if spec is not None else []
    for root in roots:
        compileall.compile_dir(root, quiet=2, workers=0)


_compile_package()
