"""The scheduler machinery with trivial jobs: recording, failures, overlap, lease, metrics."""

from __future__ import annotations

import threading
import time
from pathlib import Path

import pytest
from prometheus_client import CollectorRegistry

from storage import Store
from tailwatch.config import Schedule, load_config
from tailwatch.service import Job, JobContext, JobRunner, SchedulerLease, recent_job_runs


def _config(tmp_path: Path, **schedule: str) -> object:
    lines = "\n".join(f'{k} = "{v}"' for k, v in schedule.items())
    path = tmp_path / "tw.toml"
    path.write_text(f"[schedule]\n{lines}\n")
    return load_config(path, env={})


def _runs(store: Store, job: str) -> list[dict[str, object]]:
    return [r for r in recent_job_runs(store, 1000) if r["job"] == job]


def _wait(predicate, timeout: float = 60.0) -> None:  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return
        time.sleep(0.05)
    raise AssertionError("condition not reached in time")


def test_runs_are_recorded_and_a_failing_job_keeps_running(store: Store, tmp_path: Path) -> None:
    calls = {"flaky": 0}

    def reads_seven(ctx: JobContext) -> object:
        # rows_read counts the rows the store returned to the job.
        assert ctx.now.tzinfo is not None
        return len(ctx.store.query_rows("SELECT number FROM numbers(7)"))

    def flaky(ctx: JobContext) -> object:
        calls["flaky"] += 1
        ctx.store.query_rows("SELECT number FROM numbers(3)")
        if calls["flaky"] % 2 == 1:
            raise RuntimeError("upstream\nexploded")
        return "fine"

    registry = CollectorRegistry()
    config = _config(tmp_path, misfire_grace="5s")
    every = Schedule("interval", seconds=0.3)
    runner = JobRunner(
        store, config, [Job("reader", every, reads_seven), Job("flaky", every, flaky)], registry=registry
    )
    runner.start()
    try:
        _wait(lambda: calls["flaky"] >= 4)
    finally:
        assert runner.stop(timeout_s=10)

    flaky_runs = _runs(store, "flaky")
    # A loaded machine may also skip a tick (recorded as skipped); the runs that ran alternate.
    statuses = [
        r["status"] for r in sorted(flaky_runs, key=lambda r: r["started_at"]) if r["status"] != "skipped"
    ]
    assert statuses[:4] == ["error", "ok", "error", "ok"]
    errors = [r for r in flaky_runs if r["status"] == "error"]
    assert errors[0]["error"] == "RuntimeError: upstream exploded"  # one line
    assert all(r["rows_read"] == 3 for r in flaky_runs if r["status"] != "skipped")
    reader = _runs(store, "reader")
    reader = [r for r in reader if r["status"] != "skipped"]
    assert reader and all(r["status"] == "ok" and r["rows_read"] == 7 for r in reader)
    assert all(r["finished_at"] >= r["started_at"] for r in reader)

    sample = registry.get_sample_value
    assert sample("tailwatch_job_runs_total", {"job": "flaky", "status": "error"}) == len(errors)
    assert sample("tailwatch_job_runs_total", {"job": "reader", "status": "ok"}) == len(reader)
    assert sample("tailwatch_job_runs_total", {"job": "flaky", "status": "ok"}) == statuses.count("ok")
    assert sample("tailwatch_job_rows_read_total", {"job": "reader"}) == 7 * len(reader)
    assert sample("tailwatch_job_duration_seconds_count", {"job": "reader"}) == len(reader)
    assert sample("tailwatch_scheduler_leader", {}) == 1


def test_a_slow_run_is_never_overlapped(store: Store, tmp_path: Path) -> None:
    active = {"now": 0, "max": 0, "done": 0}
    lock = threading.Lock()

    def slow(ctx: JobContext) -> object:
        with lock:
            active["now"] += 1
            active["max"] = max(active["max"], active["now"])
        time.sleep(1.0)
        with lock:
            active["now"] -= 1
            active["done"] += 1
        return None

    runner = JobRunner(store, _config(tmp_path), [Job("slow", Schedule("interval", seconds=0.2), slow)])
    runner.start()
    try:
        _wait(lambda: active["done"] >= 2)
    finally:
        assert runner.stop(timeout_s=10)
    assert active["max"] == 1
    runs = _runs(store, "slow")
    skipped = [r for r in runs if r["status"] == "skipped"]
    assert skipped and skipped[0]["error"] == "the previous run was still running"


def test_stop_waits_for_the_running_job_up_to_the_timeout(store: Store, tmp_path: Path) -> None:
    started = threading.Event()
    release = threading.Event()

    def blocking(ctx: JobContext) -> object:
        started.set()
        release.wait(10)
        return None

    runner = JobRunner(store, _config(tmp_path), [Job("block", Schedule("interval", seconds=0.1), blocking)])
    runner.start()
    assert started.wait(10)
    t0 = time.monotonic()
    assert runner.stop(timeout_s=0.5) is False  # still running after the timeout
    assert 0.4 < time.monotonic() - t0 < 3
    release.set()
    _wait(lambda: bool(_runs(store, "block")))
    assert runner.stop(timeout_s=5) is True
    assert _runs(store, "block")[0]["status"] == "ok"


def test_lease_keeps_a_second_scheduler_passive(store: Store, tmp_path: Path) -> None:
    # Two instances on one shared store (as on a ClickHouse server): exclusive_store=False forces
    # the real lease protocol even though the test store is embedded.
    a = SchedulerLease(store, ttl_s=30, holder="a", exclusive_store=False)
    b = SchedulerLease(store, ttl_s=30, holder="b", exclusive_store=False)
    assert a.acquire() is True
    assert b.acquire() is False and b.current_holder == "a"
    assert a.acquire() is True  # renewal
    a.release()
    assert b.acquire() is True
    assert a.acquire() is False

    ran = []
    passive = JobRunner(
        store,
        _config(tmp_path),
        [Job("tick", Schedule("interval", seconds=0.2), lambda ctx: ran.append(1))],
        lease=a,
    )
    passive.start()
    try:
        _wait(lambda: len(_runs(store, "tick")) >= 2)
    finally:
        passive.stop(timeout_s=5)
    assert ran == []
    runs = _runs(store, "tick")
    assert {r["status"] for r in runs} == {"skipped"}
    assert runs[0]["error"] == "scheduler lease held by b"


def test_expired_lease_is_taken_over(store: Store) -> None:
    a = SchedulerLease(store, ttl_s=0.2, holder="a", exclusive_store=False)
    b = SchedulerLease(store, ttl_s=0.2, holder="b", exclusive_store=False)
    assert a.acquire()
    assert not b.acquire()
    time.sleep(0.4)  # a stopped renewing (crashed)
    assert b.acquire()
    assert not a.acquire()


@pytest.mark.parametrize("schedule", [Schedule("off")])
def test_off_jobs_are_not_scheduled(store: Store, tmp_path: Path, schedule: Schedule) -> None:
    runner = JobRunner(store, _config(tmp_path), [Job("never", schedule, lambda ctx: None)])
    assert runner.jobs == {}
