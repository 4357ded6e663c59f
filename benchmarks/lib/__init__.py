"""Helpers of the benchmark scripts (no command lines of their own)."""
