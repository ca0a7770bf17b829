"""Tests of the member library against a real coordinator process and the embedded broker."""
