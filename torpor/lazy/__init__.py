"""Lazy restore: the workload runs while its memory arrives (docs/lazy.md).

CRIU restores everything but the anonymous memory its dump marked lazy; `criu lazy-pages`
then places those pages through userfaultfd, asking torpor for them over CRIU's own
page-server protocol (criu/page-xfer.c) on a socket pair. torpor answers from the
checkpoint's chunk index: a chunk from the packs already on this node, or by an HTTP range
request on its pack in the registry, every chunk checked against its sha256 before its bytes
are sent, while the remaining packs download into the local store behind it.

  pagemap.py  which pages of which process are lazy, and where they lie in CRIU's page files
  chunks.py   the chunks of a generation, from this node's packs or the registry, verified
  checked.py  packs the download checked whole: kept open, their raw chunks located
  server.py   the page-server protocol: requests in, pages out, stalling rather than failing
  pieces.py   an answer's pieces: bytes, or ranges of a checked pack sent by sendfile
  session.py  one lazy restore: `criu lazy-pages`, its server, its guard, its progress
"""
