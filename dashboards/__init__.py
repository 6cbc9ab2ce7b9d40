"""dashboards stage of tailwatch."""
