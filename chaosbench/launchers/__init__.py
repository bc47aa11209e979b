"""The helper processes chaosbench starts beside or around a rank: ``elastic`` (torchrun numbered by rendezvous
round), ``nvrx`` (ft_launcher the same way, and the rank-monitor bridge), ``command`` (a user's script under the
shim), ``ray_train`` (the Ray Train driver and its workers' loop), ``ray_node`` (a Ray node's entrypoint). Each is
run as ``python -m chaosbench.launchers.<name>`` and imports only what it needs."""
