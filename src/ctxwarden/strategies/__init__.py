"""Context strategies, one module each, applied as a cascade (cheapest first)."""
