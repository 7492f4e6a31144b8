"""Engines move data between clients and server; they contain no algorithm rules."""
