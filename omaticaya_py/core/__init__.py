"""The shared core, pure (no I/O library), in floors that import only downwards (the layers
contract in ``pyproject.toml``, checked by ``lint-imports``): ``config`` > ``publish`` >
``allocation`` > ``rules`` > ``schema`` (the label and telemetry contract) > ``model``."""
