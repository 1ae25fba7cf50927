"""Developer tools for working on Omaticaya (not shipped in the wheel: only ``omaticaya_py*`` is)."""
