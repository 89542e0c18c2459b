"""The node: what it is (facts), whether it can restore a checkpoint (compat), and whether it is
ready for torpor at all (check)."""
