"""Test support: builders of events and logs (pure), real servers and clusters (I/O).

Import the submodule you need; this package imports nothing on its own.
"""
