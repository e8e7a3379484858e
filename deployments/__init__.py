"""The Ray Serve shell: deployments, the request router and the application
builder. The only package that imports Ray Serve."""
