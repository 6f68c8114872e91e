"""The demo's metrics, pinned: a change in behaviour shows up here.

`configs/demo.py:runlocal` (warm start, two GRPO steps under the demo's
sampler, held-out evaluation) is run with its fixed seed and every value it
writes to metrics.jsonl, timings aside, is compared with
`tests/golden/demo_runlocal_metrics.json`. Counts must match exactly, floats
to a relative 1e-4 (XLA's CPU reductions may differ in the last bits between
machines). A refactoring must leave this test passing unchanged; a change
meant to alter behaviour regenerates the file, and says so in its commit:

  JAXGRPO_UPDATE_GOLDEN=1 python -m pytest tests/test_pinned.py
"""

import json
import math
import os

from absl.testing import absltest

from jaxgrpo import train
from jaxgrpo.configs import demo
from jaxgrpo.reporting import metrics as metrics_lib

GOLDEN = os.path.join(os.path.dirname(os.path.abspath(__file__)), 'golden',
                      'demo_runlocal_metrics.json')
# Wall-clock measurements, which no two runs share.
TIMINGS = ('perf/',)


def _pinned(records: list[dict]) -> list[dict]:
  return [{k: v for k, v in r.items() if not k.startswith(TIMINGS)}
          for r in records]


class PinnedMetricsTest(absltest.TestCase):

  def test_demo_runlocal_writes_the_pinned_metrics(self):
    workdir = self.create_tempdir().full_path
    c = demo.get_config('runlocal')
    c.plots = False  # drawing does not change what is written
    c.tensorboard = False
    train.run(c, workdir, log=lambda _: None)
    got = _pinned(metrics_lib.read_metrics(workdir))
    if os.environ.get('JAXGRPO_UPDATE_GOLDEN'):
      os.makedirs(os.path.dirname(GOLDEN), exist_ok=True)
      with open(GOLDEN, 'w') as f:
        json.dump(got, f, indent=1, sort_keys=True)
        f.write('\n')
    with open(GOLDEN) as f:
      want = json.load(f)
    self.assertEqual([r['step'] for r in got], [r['step'] for r in want])
    for g, w in zip(got, want):
      step = w['step']
      self.assertEqual(sorted(g), sorted(w), f'metric names at step {step}')
      for key, value in w.items():
        if isinstance(value, float) and not float(value).is_integer():
          self.assertTrue(
              math.isclose(g[key], value, rel_tol=1e-4, abs_tol=1e-7),
              f'step {step} {key}: {g[key]!r}, pinned {value!r}')
        else:
          self.assertEqual(g[key], value, f'step {step} {key}')


if __name__ == '__main__':
  absltest.main()
