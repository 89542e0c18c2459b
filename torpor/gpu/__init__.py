"""GPU device state: the CUDA driver's checkpoint API (cuda.py, the only ctypes module), the
NVML inventory (inventory.py), node compatibility (compat.py) and the order of operations
around CRIU (session.py)."""
