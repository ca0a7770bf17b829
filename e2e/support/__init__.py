"""What the end-to-end suite runs on: a Kubernetes control plane on loopback (``controlplane``),
a node of our own that runs pods as local processes (``node``, ``pods``, ``podnet.c``), and the
helpers the tests share."""
