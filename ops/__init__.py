"""ops: the numpy op library of dataflow (filled in by the ops work)."""
