"""analytics stage of tailwatch."""
