"""The only module that calls the Kubernetes API."""
