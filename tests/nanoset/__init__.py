"""Tests of nanoset."""
