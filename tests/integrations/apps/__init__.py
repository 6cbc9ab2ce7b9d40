"""Scenario apps, one instrumentation flavour per process (instrumentations patch libraries globally).

Run one by hand::

    .venv/bin/python -m tests.integrations.apps.openai_v2 --otlp http://127.0.0.1:4318/v1/traces \\
        --out /tmp/run

``base.py`` is the app they share (FastAPI + Celery + OpenAI/Anthropic SDKs, mock providers, the load
driver, the span dump); each flavour module names its instrumentors and its workflow span and records,
in its docstring, the spans it was observed to emit.
"""
