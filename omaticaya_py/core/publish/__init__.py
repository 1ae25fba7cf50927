"""The core's publishing floor: what the agent writes and when. A reading rendered into the
Node's labels and telemetry (``render``, ``render_telemetry``), diffed into a merge patch
(``patch``), held to the write budget (``budget``); the DRA driver's devices for the
ResourceSlice (``dra``); one tick's result as the device plugin reads it (``readings``). Pure;
above ``allocation``. Rendering takes the values it needs (``render.RenderSettings``), not the
settings object."""
