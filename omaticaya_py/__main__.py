"""``python -m omaticaya_py`` is the ``omaticaya`` command."""

from .cli import main

raise SystemExit(main())
