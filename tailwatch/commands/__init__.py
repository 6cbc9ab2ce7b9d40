"""One module per command group; :mod:`tailwatch.cli` registers them."""
