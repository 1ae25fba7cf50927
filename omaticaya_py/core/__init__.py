"""The shared core: models of a reading (``snapshot``), settings, the health rules, the label
and telemetry contract (``schema``), rendering it (``render``) and the diff into a merge patch
(``patch``). Pure: no I/O library is imported here (import-linter holds it)."""
