"""Where readings come from: NVML on a GPU node (``nvml``), a recorded trace (``replay``, with
its file format in ``trace``), and the recorder that writes such traces from NVML (``record``).
``nvml`` and ``record`` are the only modules that import ``pynvml``. Files on the node:
``files`` (written whole), ``gpu_indices`` (each GPU's NVML index -> UUID at the kubelet
plugins' last start, and their check of it at each start)."""
