"""GPU device state: the CUDA driver's checkpoint API (cuda.py), driver calls under torpor's
own deadline (worker.py), the NVML inventory (inventory.py), the GPUs a container sees
(visibility.py), node compatibility (compat.py), the order of operations around CRIU on
checkpoint (session.py) and restore (restore.py, with criu_config.py and restore_thread.py,
which runs the driver's restore thread alone under ptrace)."""
