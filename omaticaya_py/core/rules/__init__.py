"""The core's rules over a reading: GPU health from a snapshot and its Xids (``health``), who
uses each GPU (``attribution``), whether an agent is alive (``liveness``) and the Xids a new
agent seeds from its Node (``xid_seed``). Pure; above ``model`` and ``schema`` only."""
