"""Rigs the suites and the WAL plugins' tests share: :mod:`.child` (one test server in a child
process), :mod:`.serve` (``walstream serve`` as such a child), :mod:`.crash` (one crash writer, its report lines and the checker) and :mod:`.power`
(a power-loss simulation for file WALs)."""
