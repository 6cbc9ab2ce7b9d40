"""Both notebooks run top to bottom against a store of their own, and are stored without outputs."""

from __future__ import annotations

from pathlib import Path

import nbformat
import pytest
from nbclient import NotebookClient

from dashboards.views._common import VIEWS
from tests.conftest import REPO_ROOT

NOTEBOOKS = REPO_ROOT / "notebooks"

pytestmark = pytest.mark.slow


@pytest.mark.parametrize("name", ["quickstart.ipynb", "regression_triage.ipynb"])
def test_notebook_is_stored_without_outputs(name: str) -> None:
    book = nbformat.read(NOTEBOOKS / name, as_version=4)
    nbformat.validate(book)
    for cell in book.cells:
        if cell.cell_type == "code":
            assert cell.outputs == [] and cell.execution_count is None, (name, cell.source[:60])


def _run(
    name: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, keep_in: Path | None = None
) -> nbformat.NotebookNode:
    # The store every command reads: a notebook writing simulated traffic and alert state must
    # never touch it; only TAILWATCH_NOTEBOOK_STORE chooses the notebook's store.
    monkeypatch.setenv("TAILWATCH_STORE", "chdb://" + str(tmp_path / "real-store"))
    if keep_in is not None:
        monkeypatch.setenv("TAILWATCH_NOTEBOOK_STORE", "chdb://" + str(keep_in))
    else:
        monkeypatch.delenv("TAILWATCH_NOTEBOOK_STORE", raising=False)
    # tempfile.mkdtemp inside the notebook lands under the test's directory.
    monkeypatch.setenv("TMPDIR", str(tmp_path))
    book = nbformat.read(NOTEBOOKS / name, as_version=4)
    # "python3" is ipykernel's kernelspec; jupyter_client starts it with this interpreter.
    client = NotebookClient(
        book,
        kernel_name="python3",
        timeout=240,
        resources={"metadata": {"path": str(tmp_path)}},
    )
    client.execute()
    assert not (tmp_path / "real-store").exists()
    return book


def _text(book: nbformat.NotebookNode) -> str:
    parts = []
    for cell in book.cells:
        for output in cell.get("outputs", []):
            parts.append(output.get("text", ""))
            parts.append(str(output.get("data", {}).get("text/plain", "")))
    return "\n".join(parts)


def test_quickstart_runs(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    book = _run("quickstart.ipynb", tmp_path, monkeypatch, keep_in=tmp_path / "kept")
    text = _text(book)
    assert f"store: chdb://{tmp_path / 'kept'}" in text and (tmp_path / "kept").is_dir()
    assert "analysis run" in text and "0 failed" in text
    written = [line for line in text.splitlines() if line.endswith(".html")]
    # Every view's page and the index.
    assert {Path(p).name for p in written} == {f"{v}.html" for v in VIEWS} | {"index.html"}
    assert all(Path(p).is_file() and Path(p).is_relative_to(tmp_path) for p in written)


def test_regression_triage_runs(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    book = _run("regression_triage.ipynb", tmp_path, monkeypatch)
    # Without TAILWATCH_NOTEBOOK_STORE: a throw-away store of its own.
    assert [p.name.startswith("tailwatch-nb-") for p in tmp_path.iterdir() if p.is_dir()].count(True) == 1
    verdict = [line for line in _text(book).splitlines() if line.startswith("alert ")]
    assert len(verdict) == 1
    line = verdict[0]
    assert "(none fired)" not in line, line  # an alert fired and was followed
    # The simulated regressions: an LLM slowdown on support-bot, a db regression on search-api.
    assert ("support-bot POST /reply: cause llm" in line and "verdict llm" in line) or (
        "search-api GET /search: cause internal" in line and "verdict internal" in line
    ), line
