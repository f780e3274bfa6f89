"""Harnesses: spec, tool-call protocols, control loops and session rules."""
