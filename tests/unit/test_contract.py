"""The runner<->worker contract is spelled once: policies/contract.py (names, paths) and policies/codes.py
(JSON-RPC codes). An AST walk fails on a ``TOOLCAGE_*`` name, an in-sandbox path or a -32xxx code written as
a literal anywhere else in the package (tests are free to spell them: they check the wire)."""

from __future__ import annotations

import ast
import re
from pathlib import Path

from toolcage.policies import codes, contract

ROOT = Path(__file__).resolve().parents[2]
SOURCES = ("runner", "worker", "policies", "image")
HOME = {"policies/contract.py", "policies/codes.py"}

ENV_NAME = re.compile(r"TOOLCAGE_[A-Z0-9_]+(=.*)?", re.S)  # a name, or NAME=value as an engine's Env entry
PATHS = {contract.WORKSPACE, contract.SCRATCH, contract.PROXY_DIR, contract.PROXY_SOCKET, contract.DEPS_DIR,
         contract.CONNECTORS_DIR}  # fmt: skip
PATH_PREFIXES = ("/opt/toolcage/deps", "/opt/toolcage/connectors", "/run/toolcage")


def literals(tree: ast.AST) -> list[tuple[int, str]]:
    """(line, what) for every contract value spelled as a literal in ``tree``."""
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Constant) and isinstance(node.value, str):
            s = node.value
            if ENV_NAME.fullmatch(s):
                found.append((node.lineno, f"environment name {s.split('=')[0]}"))
            elif s in PATHS or s.startswith(PATH_PREFIXES):
                found.append((node.lineno, f"in-sandbox path {s!r}"))
        elif (
            isinstance(node, ast.UnaryOp)
            and isinstance(node.op, ast.USub)
            and isinstance(node.operand, ast.Constant)
            and type(node.operand.value) is int
            and 32000 <= node.operand.value <= 32899
        ):
            found.append((node.lineno, f"JSON-RPC code -{node.operand.value}"))
    return found


def _files() -> list[tuple[str, Path]]:
    out = []
    for top in SOURCES:
        for path in sorted((ROOT / top).rglob("*.py")):
            rel = path.relative_to(ROOT).as_posix()
            if "__pycache__" not in rel and rel not in HOME:
                out.append((rel, path))
    return out


def test_the_contract_is_spelled_once() -> None:
    """No TOOLCAGE_* name, in-sandbox path or -32xxx code literal outside contract.py / codes.py."""
    bad = []
    for rel, path in _files():
        for line, what in literals(ast.parse(path.read_text(), rel)):
            bad.append(f"{rel}:{line}: {what}")
    assert not bad, "spell these through toolcage.policies.contract / codes:\n" + "\n".join(bad)


def test_the_walk_sees_each_kind_of_literal() -> None:
    """The check itself: it finds each kind of literal (so a pass above means something)."""
    sample = (
        'import os\nos.environ.get("TOOLCAGE_POLICY")\nenv = [f"TOOLCAGE_PROXY_LISTEN=unix:{x}"]\n'
        'where = "/scratch"\ndeps = "/opt/toolcage/deps/bin"\ncode = -32004\n'
        '"""A docstring may name TOOLCAGE_POLICY and /workspace."""\nok = contract.ENV_POLICY\n'
    )
    found = sorted(literals(ast.parse(sample)))
    assert [line for line, _what in found] == [2, 3, 4, 5, 6], found


def test_codes_are_unique_and_in_range() -> None:
    """Each JSON-RPC code has one name; toolcage's own are in -32000..-32099 (SANDBOX_ENDED included)."""
    table = {n: v for n, v in vars(codes).items() if n.isupper() and isinstance(v, int)}
    assert len(set(table.values())) == len(table)
    assert table["SANDBOX_ENDED"] == -32004
    standard = {"PARSE_ERROR", "INVALID_REQUEST", "METHOD_NOT_FOUND", "INVALID_PARAMS", "INTERNAL_ERROR"}
    ours = {v for n, v in table.items() if n not in standard | {"REQUEST_CANCELLED"}}  # LSP's -32800
    assert all(-32099 <= v <= -32000 for v in ours)


def test_every_environment_name_is_listed_once() -> None:
    """The contract's ENV_* values are distinct TOOLCAGE_* names, each exported."""
    env = {n: v for n, v in vars(contract).items() if n.startswith("ENV_")}
    assert all(v.startswith("TOOLCAGE_") for v in env.values()) and len(set(env.values())) == len(env)
    assert set(env) <= set(contract.__all__)


def test_contract_is_cheap_to_import() -> None:
    """The worker imports the contract before its first answer: it imports json and typing only (no pydantic,
    no YAML, nothing of either side)."""
    tree = ast.parse((ROOT / "policies" / "contract.py").read_text())
    imported = {a.name for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names}
    imported |= {n.module or "" for n in ast.walk(tree) if isinstance(n, ast.ImportFrom)}
    assert imported <= {"__future__", "json", "typing"}, imported
