"""``python -m kafka_group_operator``: the ``kgo`` command line."""

import sys

from kafka_group_operator import cli

sys.exit(cli.main())
