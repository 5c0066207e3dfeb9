"""The REST API: the app and composition root (:mod:`.app`), routes, their dependencies,
request parsing, response models and the control plane's Prometheus metrics."""
