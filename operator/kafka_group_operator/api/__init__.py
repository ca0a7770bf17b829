"""The HTTP member API (aiohttp): heartbeat, offset commit and fetch, describe, OpenAPI."""
