"""Running the Spark jobs: the ``JobRunner`` port and the online-reset state machine."""
