"""Savepoints, end to end: the ``_metadata`` model (format), where files go and the one writer
of them (layout), the Arrow shape of state tables (tables), what a savepoint holds per
operator (contents), taking one (create, native), opening and reading one (store), and
relabel and dispose."""
