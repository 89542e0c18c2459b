"""Capturing a container's state besides its memory, and putting it back: the network namespace
(netns), bind-mounted volumes and /dev/shm (volumes), the read-write layer (rootfs), the
freezer (freezer), the process tree (processes) and the per-container records torpor-hook keeps
(records). records and archive-free parts are stdlib only: torpor-hook imports them on every start."""
