"""The direct data plane between a frontend and its pool replicas: one TCP
connection per (frontend, replica), requests multiplexed on it, chunks
streamed back as length-prefixed msgpack frames. Ray Serve stays the control
plane (which replicas exist, their metadata and load, health, scaling); the
tokens do not travel through it."""
