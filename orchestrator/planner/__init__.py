"""The SLA planner: observations in, replica counts per pool out (no Ray)."""
