"""Framework adapters: the fault-tolerance systems under test."""
