"""Local stand-ins for the demo, the tests and the benchmarks: the embedded broker."""
