"""Runtimes: where the processes of a job run (local processes, containers, a cluster)."""
