from __future__ import annotations

import socket

from click.testing import CliRunner

from tailwatch.cli import main


def test_a_taken_port_is_one_error_line(store_dsn: str) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        result = CliRunner().invoke(
            main, ["collect", "--store", store_dsn, "--otlp-http", f"127.0.0.1:{port}", "--otlp-grpc", "off"]
        )
    assert result.exit_code == 2
    assert (
        f"tailwatch: error: cannot listen for OTLP/HTTP on 127.0.0.1:{port}: Address already in use"
        in result.output
    )


def test_bad_addresses_and_settings_are_rejected(store_dsn: str) -> None:
    result = CliRunner().invoke(main, ["collect", "--store", store_dsn, "--otlp-http", "localhost"])
    assert result.exit_code == 2
    # Options resolve like every other setting: the message names the key and where it came from.
    assert "receiver.otlp_http: expected HOST:PORT" in result.output
    assert "(--otlp-http)" in result.output
    result = CliRunner().invoke(
        main, ["collect", "--store", store_dsn, "--batch-rows", "500", "--max-queue-spans", "100"]
    )
    assert result.exit_code == 2
    assert "max_queue_spans (100) must be at least batch_rows (500)" in result.output
