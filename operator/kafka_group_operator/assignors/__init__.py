"""Partition assignors (range, roundrobin, sticky, cooperative-sticky, uniform) behind one interface.

Pure algorithms: no I/O, no third-party imports. The registry maps each assignor's name to it.
"""
