"""The jobs of a long window are reduced in SQL (:func:`analytics.cold_path.jobs_reduction_sql`):
on any mix of job spans — retried tasks sharing a message id, failed runs, a batch split over
runs, spans exported twice, standalone cold roots, jobs never picked up — the rows equal
:func:`analytics.cold_path.jobs_from_spans`."""

from __future__ import annotations

import numpy as np
import polars as pl
import pytest
from polars.testing import assert_frame_equal

from analytics.cold_path import JOB_SPANS_SCHEMA, jobs_from_spans, jobs_reduction_sql
from storage import Store

_TABLE = "test_job_spans"


def _job_spans(seed: int, jobs: int) -> pl.DataFrame:
    rng = np.random.default_rng(seed)
    rows: list[dict[str, object]] = []
    base = 1_780_000_000 * 10**9
    for j in range(jobs):
        key = int(rng.integers(1, 2**63))
        message = int(rng.integers(1, 2**63)) if rng.random() < 0.3 else 0
        queue = ["emails", "docs", "index"][j % 3]
        enqueued = base + int(rng.integers(0, 3600 * 10**9))
        producers = [key]
        if message and rng.random() < 0.5:
            # A retried task: a second producer with the same message id, enqueued later.
            producers.append(int(rng.integers(1, 2**63)))
        for i, producer in enumerate(producers):
            start = enqueued + i * 5 * 10**9
            rows.append(dict(role=0, job_key=producer, queue=queue, start_ns=start, end_ns=start + 10**6,
                             message_key=message, failed=False, trace_key=producer ^ 1))  # fmt: skip
            runs = int(rng.integers(0, 4))  # 0: never picked up
            for r in range(runs):
                begin = start + int(rng.exponential(2e9)) + r * 10**9
                end = begin + int(rng.exponential(1e9))
                rows.append(dict(role=1, job_key=producer, queue="", start_ns=begin, end_ns=end,
                                 message_key=0, failed=bool(rng.random() < 0.3), trace_key=0))  # fmt: skip
        if rng.random() < 0.1:
            rows.append(dict(rows[-1]))  # exported twice
    for s in range(jobs // 10):
        start = base + int(rng.integers(0, 3600 * 10**9))
        root = int(rng.integers(1, 2**63))
        for _ in range(1 + (s % 2)):  # marked cold in both maps: the row twice
            rows.append(dict(role=2, job_key=root, queue="nightly", start_ns=start,
                             end_ns=start + int(rng.exponential(5e9)), message_key=0, failed=False,
                             trace_key=root ^ 7))  # fmt: skip
    return pl.DataFrame(rows, schema=JOB_SPANS_SCHEMA)


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_jobs_reduced_in_sql_equal_the_polars_reduction(store: Store, seed: int) -> None:
    spans = _job_spans(seed, 400)
    store.command(
        f"CREATE TABLE {_TABLE} (role UInt8, job_key UInt64, queue String, start_ns Int64, end_ns Int64, "
        "message_key UInt64, failed Bool, trace_key UInt64) ENGINE = MergeTree ORDER BY job_key"
    )
    store.insert_arrow(_TABLE, spans.to_arrow())
    columns = ", ".join(JOB_SPANS_SCHEMA)
    got = store.query_polars(jobs_reduction_sql(f"SELECT {columns} FROM {_TABLE}"))
    want = jobs_from_spans(spans)
    keys = ["queue", "trace_key", "enqueued_ns"]
    got = got.select(want.columns).cast(pl.Schema(want.schema)).sort(keys)
    want = want.sort(keys)
    assert want["started_ns"].null_count() > 0 and (want["runs"] > 1).any()
    assert (
        want.filter(pl.col("queue") == "nightly").height
        == spans.filter(pl.col("role") == 2)["job_key"].n_unique()
    )
    assert_frame_equal(got, want)
