"""The simulated engine and the cluster simulator: the whole system at scale
on a laptop, timed by a performance model of a given GPU and model."""
