"""Injectors: one module per kind of fault."""
