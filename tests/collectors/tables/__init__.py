"""The trace tables other tools create, as SQL files, and a loader that creates one in a store.

Each ``<variant>.sql`` reproduces one upstream DDL (its first comment names the file) with the
template placeholders filled in; statements are separated by ``;`` at the end of a line.
"""

from __future__ import annotations

from pathlib import Path

from storage import Store

TABLES_DIR = Path(__file__).resolve().parent
VARIANTS = ("collector_2024", "collector_2026", "collector_json", "clickstack")


def variant_statements(name: str) -> list[str]:
    """The statements of ``<name>.sql``, comments removed, in file order."""
    if name not in VARIANTS:
        raise ValueError(f"unknown trace table variant {name!r}; one of {', '.join(VARIANTS)}")
    text = (TABLES_DIR / f"{name}.sql").read_text()
    statements = []
    for chunk in text.split(";\n"):
        lines = [line for line in chunk.splitlines() if not line.lstrip().startswith("--")]
        statement = "\n".join(lines).strip().rstrip(";")
        if statement:
            statements.append(statement)
    return statements


def create_variant(store: Store, name: str) -> None:
    """Create ``otel_traces`` (and the lookup tables upstream creates with it) as ``name`` does."""
    for statement in variant_statements(name):
        store.command(statement)
