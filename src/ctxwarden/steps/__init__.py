"""The steps of the build, one module each, applied in cascade order (cheapest first)."""
