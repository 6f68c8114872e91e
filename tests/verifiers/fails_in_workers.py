"""A verify.imports module that imports in the trainer but fails in the
verifier worker processes (as one reading a file only the trainer sees)."""

import multiprocessing

if multiprocessing.parent_process() is not None:
  raise ImportError('only the trainer can import this')
