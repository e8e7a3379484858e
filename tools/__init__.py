"""The user-facing tools behind the `orchestrator` command (tools/cli.py):
bench, profile, simulate, sim-server, the sample request, make-tiny-model.
They may use the core (orchestrator/) but never the Ray Serve shell
(deployments/); experiments that need both live in benchmarks/."""
