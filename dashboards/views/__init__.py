"""One module per dashboard view, each a pure function from an ``analytics.Analysis`` to a figure.

``hot_path``, ``cold_path``, ``abandonment``, ``retries``, ``attribution``, ``llm``, ``boundary``,
``drift`` and ``alerts``; what they share (view names and titles, the panel limit, subplot helpers) is in
``_common``. The registry that builds them all is :func:`dashboards.figures.build_figures`.
"""
