"""Test doubles for the harness's own logic (never used by real suites)."""
