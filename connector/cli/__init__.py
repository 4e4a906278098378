"""The ``npstream`` command line, one module per command group."""
