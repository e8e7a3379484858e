"""SLO classes and tenants: what a request claims, what it may have, and when it is admitted."""
