"""Helpers that start and drive the real components the integration tests run against."""
