"""The command line, the docs' code, the notebooks and the import graph, end to end."""
