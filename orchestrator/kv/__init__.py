"""Where prompts' KV blocks live: routing hashes, KV events, the index."""
