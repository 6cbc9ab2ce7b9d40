from __future__ import annotations

import base64
import gzip
import json
import struct
from pathlib import Path

import pytest
from click.testing import CliRunner
from google.protobuf import json_format

from collectors.files import ingest_files
from collectors.spans import read_spans
from storage import Store, open_store
from tailwatch.cli import main
from tests.collectors.otlp_samples import EXAMPLE_TRACE_JSON, make_request


def _otlp_json(seed: int, n: int) -> tuple[str, set[str]]:
    """OTLP/JSON as an exporter writes it: hex ids (protobuf's own JSON would use base64)."""
    request, expected = make_request(n, seed=seed)
    payload = json_format.MessageToDict(request)
    for rs in payload["resourceSpans"]:
        for ss in rs["scopeSpans"]:
            for span in ss["spans"]:
                for key in ("traceId", "spanId", "parentSpanId"):
                    if key in span:
                        span[key] = base64.b64decode(span[key]).hex().upper()
    return json.dumps(payload), {e.span_id for e in expected}


def test_ingest_command_reads_every_format(tmp_path: Path, store_dsn: str) -> None:
    expected: set[str] = set()
    pb, ex = make_request(40, seed=1)
    (tmp_path / "a.pb").write_bytes(pb.SerializeToString())
    expected |= {e.span_id for e in ex}
    pb2, ex2 = make_request(25, seed=2)
    (tmp_path / "b.pb.gz").write_bytes(gzip.compress(pb2.SerializeToString()))
    expected |= {e.span_id for e in ex2}
    lines = []
    for seed in (3, 4, 5):
        text, ids = _otlp_json(seed, 10)
        lines.append(text)
        expected |= ids
    (tmp_path / "c.jsonl").write_text("\n".join(lines) + "\n")
    (tmp_path / "d.json").write_bytes(EXAMPLE_TRACE_JSON)
    expected.add("eee19b7ec3c1b174")
    framed = b"".join(
        struct.pack(">I", len(m)) + m
        for m in (make_request(5, seed=s)[0].SerializeToString() for s in (6, 7))
    )
    (tmp_path / "e.binpb.gz").write_bytes(gzip.compress(framed))
    expected |= {e.span_id for s in (6, 7) for e in make_request(5, seed=s)[1]}

    files = [str(tmp_path / n) for n in ("a.pb", "b.pb.gz", "c.jsonl", "d.json", "e.binpb.gz")]
    result = CliRunner().invoke(main, ["ingest", "--store", store_dsn, "--no-progress", *files])
    assert result.exit_code == 0, result.output
    assert f"ingested {len(expected)} spans (0 rejected) from 5 files" in result.output
    with open_store(store_dsn) as store:
        assert set(read_spans(store).column("SpanId").to_pylist()) == expected


def test_a_missing_file_is_skipped_and_the_others_imported(tmp_path: Path, store_dsn: str) -> None:
    # Regression: `tailwatch ingest ok.pb missing.pb` was a usage error and imported nothing.
    pb, ex = make_request(12, seed=9)
    (tmp_path / "ok.pb").write_bytes(pb.SerializeToString())
    files = [str(tmp_path / "ok.pb"), str(tmp_path / "missing.pb")]
    result = CliRunner().invoke(main, ["ingest", "--store", store_dsn, "--no-progress", *files])
    assert result.exit_code == 1, result.output
    assert "missing.pb" in result.output and "No such file or directory" in result.output
    assert "ingested 12 spans (0 rejected) from 2 files" in result.output
    with open_store(store_dsn) as store:
        assert set(read_spans(store).column("SpanId").to_pylist()) == {e.span_id for e in ex}


@pytest.mark.parametrize("native", [True, False])
def test_bad_files_and_invalid_spans_are_reported(store: Store, tmp_path: Path, native: bool) -> None:
    request, _ = make_request(6, seed=9)
    request.resource_spans[0].scope_spans[0].spans[0].span_id = b"\x00\x01"
    (tmp_path / "ok.pb").write_bytes(request.SerializeToString())
    (tmp_path / "junk.pb").write_bytes(b"\x0a\xff\xff\xff\x0f junk")
    (tmp_path / "cut.pb.gz").write_bytes(gzip.compress(request.SerializeToString())[:-20])
    report = ingest_files(
        store, [tmp_path / "ok.pb", tmp_path / "junk.pb", tmp_path / "cut.pb.gz"], native=native
    )
    assert (report.accepted, report.rejected) == (5, 1)
    assert len(report.errors) == 2
    assert "junk.pb" in report.errors[0] and "cut.pb.gz: cannot read" in report.errors[1]
    assert read_spans(store).num_rows == 5


def test_files_without_spans_and_rejected_spans_say_why(tmp_path: Path, store_dsn: str) -> None:
    # `{"not":"otlp"}` and an empty file once reported "0 accepted, 0 rejected" and exit 0; rejected
    # spans came with no reason.
    (tmp_path / "other.json").write_text('{"not": "otlp"}\n')
    (tmp_path / "empty.pb").write_bytes(b"")
    request, _ = make_request(4, seed=3)
    request.resource_spans[0].scope_spans[0].spans[1].span_id = b"\x00" * 8
    (tmp_path / "some-bad.pb").write_bytes(request.SerializeToString())
    files = [str(tmp_path / n) for n in ("other.json", "empty.pb", "some-bad.pb")]
    result = CliRunner().invoke(main, ["ingest", "--store", store_dsn, "--no-progress", *files])
    assert result.exit_code == 1, result.output
    assert "other.json: no spans: not an OTLP trace export" in result.output
    assert "empty.pb: empty file" in result.output
    assert "ingested 3 spans (1 rejected) from 3 files" in result.output
    rejected = [line for line in result.output.splitlines() if line.strip().startswith("rejected:")]
    assert len(rejected) == 1 and "invalid span_id" in rejected[0], result.output
