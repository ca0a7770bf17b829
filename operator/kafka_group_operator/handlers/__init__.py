"""kopf handler registrations: thin glue between resources, manifests, kube and the runtime."""
