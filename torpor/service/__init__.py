"""torpord, the node service: the CLI's imports paid once, each command run in a child of its own.

`daemon` listens on `[service] socket` and forks a child per command (`child`), after checking
the peer (`peer`); `metrics` exports what the children did. The wire is torpor.handoff's.
docs/service.md says what a crash of torpord loses: nothing, since each command is its own
process with torpor's usual journal and recover invariants.
"""
