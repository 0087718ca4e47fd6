"""The kvpress side of tl_geometry's streaming-head decisions (its own venv: make kvpress-test)."""
