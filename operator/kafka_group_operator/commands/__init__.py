"""Subcommands of ``kgo``, one module each, registered in ``cli.COMMANDS``."""
