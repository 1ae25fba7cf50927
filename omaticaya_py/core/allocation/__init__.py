"""The core's allocation floor: which devices a pod takes and what is left (``placement``),
memory handed out until a reading shows it (``shown``), slices of shared GPUs and how much each
uses (``slice_use``), and what enforces a slice: CUDA MPS (``mps``), the driver's per-container
limit (``memory_limit``), whose fault an over-use is (``slice_enforcement``). Pure; above
``rules``."""
