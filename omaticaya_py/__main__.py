"""``python -m omaticaya_py`` is the ``omaticaya`` command."""

from .cli import console_main

raise SystemExit(console_main())
