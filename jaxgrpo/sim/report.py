"""Running simulated studies and recording them: seeds, workers, JSON, PNG."""

from collections.abc import Mapping, Sequence
from concurrent import futures
import dataclasses
import json
import multiprocessing
import os
import time

import numpy as np

from jaxgrpo.sim import engine as engine_lib
from jaxgrpo.sim import plots


def run_many(specs: list[engine_lib.SimSpec],
             workers: int) -> list[list[dict]]:
  """engine.run over specs, in `workers` processes when > 1."""
  if workers <= 1 or len(specs) <= 1:
    return [engine_lib.run(s) for s in specs]
  # Spawned, not forked: the parent has JAX's runtime threads running.
  ctx = multiprocessing.get_context('spawn')
  with futures.ProcessPoolExecutor(min(workers, len(specs)),
                                   mp_context=ctx) as pool:
    return list(pool.map(engine_lib.run, specs))


def compare(spec: engine_lib.SimSpec, variants, seeds: int,
            workers: int) -> dict[str, list[list[dict]]]:
  """Runs each (label, spec overrides) variant for seeds 0..seeds-1."""
  specs = [dataclasses.replace(spec, seed=s, **kw)
           for _, kw in variants for s in range(seeds)]
  runs = run_many(specs, workers)
  return {label: runs[k * seeds:(k + 1) * seeds]
          for k, (label, _) in enumerate(variants)}


def series(runs: list[list[dict]], key: str) -> np.ndarray:
  """[seeds, steps] values of one metric (NaN where absent)."""
  return np.array([[r.get(key, np.nan) for r in run] for run in runs],
                  np.float64)


def mean(runs, key) -> np.ndarray:
  """[steps] mean over seeds of one metric, over the seeds that have it
  (a step without an update has no batch shares); NaN where none has."""
  x = series(runs, key)
  n = np.isfinite(x).sum(axis=0)
  return np.where(n > 0, np.nansum(x, axis=0) / np.maximum(n, 1), np.nan)


def final(runs, key) -> dict:
  """A metric at the last step: mean, std and per-seed values."""
  last = series(runs, key)[:, -1]
  return {'mean': float(last.mean()), 'std': float(last.std()),
          'per_seed': [float(v) for v in last]}


def part(curve: np.ndarray, which: str) -> float:
  """Mean over the first or last tenth of the steps."""
  k = max(1, len(curve) // 10)
  part = np.asarray(curve[:k] if which == 'first' else curve[-k:])
  part = part[np.isfinite(part)]
  return float(part.mean()) if part.size else float('nan')


def rounded(values: np.ndarray) -> list[float]:
  """Values as floats rounded to 4 digits (compact JSON)."""
  return [round(float(v), 4) for v in values]


def write(out_dir: str, name: str,
          spec: engine_lib.SimSpec | Mapping[str, engine_lib.SimSpec],
          seeds: int, t0: float, results: dict, curves: dict,
          panels: Sequence[plots.Panel], title: str) -> dict:
  """Writes OUT_DIR/<name>.json (spec, results, curves) and <name>.png.

  Args:
    out_dir: output directory (made if missing).
    name: the experiment's name.
    spec: the spec its runs vary (seed 0), or one per setting.
    seeds: number of seeds averaged.
    t0: `time.perf_counter()` at the start, for the wall time.
    results: the experiment's numbers.
    curves: name -> per-step curve (arrays are rounded to 4 digits).
    panels: the figure's panels.
    title: the figure's title.

  Returns:
    The JSON record.
  """
  os.makedirs(out_dir, exist_ok=True)
  specs = ({k: dataclasses.asdict(v) for k, v in spec.items()}
           if isinstance(spec, Mapping) else dataclasses.asdict(spec))
  record = {
      'experiment': name,
      'spec': specs,
      'seeds': seeds,
      'wall_s': round(time.perf_counter() - t0, 2),
      'results': results,
      'curves': {k: rounded(v) if isinstance(v, np.ndarray) else v
                 for k, v in curves.items()},
  }
  with open(os.path.join(out_dir, f'{name}.json'), 'w', encoding='utf-8') as f:
    json.dump(record, f, indent=1)
  plots.save(os.path.join(out_dir, f'{name}.png'), title, panels)
  return record
