"""Tests of the HTTP member API: wire format, tokens, OpenAPI, the app on the real runtime."""
