"""slo_rules stage of tailwatch."""
