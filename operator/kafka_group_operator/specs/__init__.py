"""Typed views of our custom resources and their validation. Pure."""
