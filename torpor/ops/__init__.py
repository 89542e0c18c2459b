"""One module per user operation (checkpoint, restore, push, pull, inspect, ls/rm, check). Each
module's docstring lists its steps in order and the code reads in that order."""
