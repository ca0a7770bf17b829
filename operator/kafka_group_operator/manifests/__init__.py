"""Pure ``build_*`` functions that turn our resources into Kubernetes manifests."""
