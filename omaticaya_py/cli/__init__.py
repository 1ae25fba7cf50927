"""The ``omaticaya`` command: ``run``, ``once``, ``show``, ``cleanup``, ``extender``,
``device-plugin``, ``record``, ``top``, ``stop-daemonset``.

Flags override the environment (``OMATICAYA_*``, ``NODE_NAME``) and ``.env``; every setting of
the agent and of the extender has a flag, generated from its settings class. Bad input ends
with exit status 2 and one line per problem, never a traceback; an API failure in ``once`` or
``cleanup`` ends with status 1.

Modules: ``parser`` (the argparse tree, the only one; ``hook_flags``: the flags of the
commands the chart's hooks run), ``flags`` (settings -> flags),
``dispatch`` (``main``), ``agent`` (``run``/``once``/``show``/``cleanup``/``device-plugin``:
settings, then the one-shot commands), ``daemon`` (``run`` and ``device-plugin``), ``inputs``
(the GPU reader and the Node client), ``extender``, ``tools`` (``record``, ``top``,
``stop-daemonset``), ``checks`` (``check-labels``: the chart's ``helm test``), ``errors``
(``UsageError``).
"""

from .dispatch import console_main, main

__all__ = ["console_main", "main"]
