"""Multi-process scenarios: coordinator and member processes on the embedded broker."""
