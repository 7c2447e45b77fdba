"""The model registry (R3): windows, output limits, encodings and prices, as data."""

from ctxwarden.core.registry.catalog import ModelInfo, Price, Registry, get_model, load_registry

__all__ = ["ModelInfo", "Price", "Registry", "get_model", "load_registry"]
