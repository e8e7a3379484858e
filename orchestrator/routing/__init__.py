"""Choosing replicas for a request: the scheduler interface and its policies."""
