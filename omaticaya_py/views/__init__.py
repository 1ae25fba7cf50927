"""System 4, the viewers: ``omaticaya top`` (and ``kubectl omaticaya top``), a cluster-wide
table of live GPU state read from the Nodes' labels and telemetry annotation.

``fleet`` is pure (Nodes -> rows, sort, filter, JSON); ``options`` holds what ``top`` is asked
to show and selects its rows; ``tables`` renders rows with ``rich``; ``top`` lists (and with
``--watch``, watches) the Nodes through ``kube.NodeCache`` and prints.
"""
