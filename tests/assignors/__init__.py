"""Tests of the partition assignors."""
