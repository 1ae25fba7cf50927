"""The core's top floor: the settings (``settings``, ``settings_base``: environment, ``.env``,
flags) and the agent's schedule (``schedule``). It may import every floor below to check its
values; no floor below imports it."""
