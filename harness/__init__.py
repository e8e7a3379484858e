"""Client-side tools that talk to a running server over HTTP: the sample
request, and (later) the benchmark harness. Kept out of `orchestrator/`,
whose core does no network I/O."""
