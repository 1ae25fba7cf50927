"""The core's ground floor: what one reading of a node's GPUs is (``snapshot``), the window over
readings (``window``), which GPUs are shared and in which memory units (``sharing``), the
Kubernetes rules for label values (``labelvalues``) and saying a fault once (``sayonce``).
Imports nothing of the core above it (``lint-imports``: the core's floors)."""
