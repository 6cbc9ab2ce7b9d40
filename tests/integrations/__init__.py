"""Integration tests: telemetry produced by the real instrumentation libraries, read by tailwatch.

Each flavour runs a small realistic app in a subprocess (``tests/integrations/apps``) against mock
model providers on loopback (``providers.py``); its spans go over OTLP/HTTP into tailwatch's real
receiver (``ingest.py``) and, beside that, into an in-memory exporter whose dump is the ground truth
(``truth.py``). ``contract.py`` holds the assertions every flavour's ``test_<flavour>.py`` runs.

Run: ``.venv/bin/pytest tests/integrations`` (about 70 s: each flavour's app runs once per module).
"""
