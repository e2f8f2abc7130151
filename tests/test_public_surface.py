"""Every module states its public surface in ``__all__``, every name there exists, and the
package top exports exactly the list that docs/ARCHITECTURE.md documents. Read from the source
(no module is imported), so the check costs nothing."""

from __future__ import annotations

import ast
import io
import re
import tokenize
from pathlib import Path

import tutorial_utils

ROOT = Path(__file__).resolve().parent.parent
PACKAGE = ROOT / "tutorial_utils"
API_MARK = "<!-- the top-level API"

# folders whose modules gain their __all__ on other branches of this turn (issue 45's owners of
# estimate/ and lessons/): the lead empties this set when the branches meet
PENDING_ALL_IN_OTHER_BRANCHES: set[str] = set()


def _modules() -> list[Path]:
    return sorted(p for p in PACKAGE.rglob("*.py") if "__pycache__" not in p.parts)


def _pending(path: Path) -> bool:
    relative = path.relative_to(ROOT).as_posix()
    return any(relative.startswith(folder) for folder in PENDING_ALL_IN_OTHER_BRANCHES)


def _all_and_bound_names(path: Path) -> tuple[list[str] | None, set[str]]:
    """The module's ``__all__`` (None without one) and every name its top level binds."""
    tree = ast.parse(path.read_text())
    exported, bound = None, set()
    for node in tree.body:
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
            bound.add(node.name)
        elif isinstance(node, ast.Import | ast.ImportFrom):
            bound |= {(alias.asname or alias.name).split(".")[0] for alias in node.names}
        elif isinstance(node, ast.Assign | ast.AnnAssign):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            for target in targets:
                for name in ast.walk(target):
                    if isinstance(name, ast.Name):
                        bound.add(name.id)
                        if name.id == "__all__" and node.value is not None:
                            exported = _literal_names(node.value)
    return exported, bound


def _literal_names(value: ast.expr) -> list[str]:
    if isinstance(value, ast.Call):  # sorted(_PUBLIC): the package top's lazy table
        return sorted(tutorial_utils.__all__)
    return [element.value for element in getattr(value, "elts", [])]  # type: ignore[attr-defined]


def test_every_module_defines_all_and_every_name_in_it_exists():
    missing, unknown = [], []
    for path in _modules():
        exported, bound = _all_and_bound_names(path)
        if exported is None:
            if not _pending(path):
                missing.append(path.relative_to(ROOT).as_posix())
            continue
        if path != PACKAGE / "__init__.py":  # the top loads its names lazily
            unknown += [f"{path.relative_to(ROOT)}: {n}" for n in exported if n not in bound]
    assert not missing, f"modules without __all__: {missing}"
    assert not unknown, f"names in __all__ that the module does not define: {unknown}"


def test_the_top_level_api_is_the_documented_list():
    text = (ROOT / "docs" / "ARCHITECTURE.md").read_text()
    block = text[text.index(API_MARK) :].split("\n\n", 1)[0]
    documented = set(re.findall(r"`(\w+)`", block.split("-->", 1)[1]))
    exported = set(tutorial_utils.__all__)
    assert documented == exported, (
        f"exported, not documented: {sorted(exported - documented)}; "
        f"documented, not exported: {sorted(documented - exported)}"
    )


# files another helper of a turn changes; the lead empties this when merging
PENDING_MIB_IN_OTHER_BRANCHES: set[str] = set()


def _bare_mebibytes(path: Path) -> list[int]:
    """Lines of code (not comments or strings) that spell 2**20 instead of ``units.MiB``."""
    tokens = [
        token
        for token in tokenize.generate_tokens(io.StringIO(path.read_text()).readline)
        if token.type in (tokenize.NUMBER, tokenize.OP)
    ]
    return [
        first.start[0]
        for first, power, exponent in zip(tokens, tokens[1:], tokens[2:], strict=False)
        if (first.string, power.string, exponent.string) == ("2", "**", "20")
    ]


def test_code_spells_a_mebibyte_as_units_mib():
    """``tools.MiB`` stays: tools.py stands alone; everything else says ``units.MiB``."""
    alone = {PACKAGE / "units.py", PACKAGE / "tools.py"}
    found = [
        f"{path.relative_to(ROOT)}:{line}"
        for path in [*_modules(), *(ROOT / "scripts").glob("*.py")]
        if path not in alone
        and not any(
            path.relative_to(ROOT).as_posix().startswith(p) for p in PENDING_MIB_IN_OTHER_BRANCHES
        )
        for line in _bare_mebibytes(path)
    ]
    assert not found, f"2**20 instead of units.MiB at {found}"
