"""The demo's metrics, pinned: a change in behaviour shows up here.

`configs/demo.py:runlocal` (warm start, then eight GRPO steps under the
demo's sampler, held-out evaluation every two) is run with its fixed seed,
and every value it writes to metrics.jsonl, timings aside, is compared with
`tests/golden/demo_runlocal_metrics.json`:

- on a machine like the one that wrote the file (same CPU model, as many
  usable cores, same jax and jaxlib), every value must be equal, bit for
  bit, at every step: a refactoring leaves the run exactly as it was, and
  even a change of float rounding (another fusion of the optimizer, say)
  shows up, since the loop amplifies it into different samples within a
  few steps;
- elsewhere, XLA's CPU reductions may differ in the last bits, so the steps
  up to 2 are compared (counts exactly, floats to a relative 1e-4) and the
  exact comparison is skipped, saying why.

A change meant to alter behaviour regenerates the file, and says so in its
commit:

  JAXGRPO_UPDATE_GOLDEN=1 python -m pytest tests/test_pinned.py
"""

import json
import math
import os
import tempfile

from absl.testing import absltest
import jax
import jaxlib

from jaxgrpo import train
from jaxgrpo.configs import demo
from jaxgrpo.reporting import environment
from jaxgrpo.reporting import metrics as metrics_lib

GOLDEN = os.path.join(os.path.dirname(os.path.abspath(__file__)), 'golden',
                      'demo_runlocal_metrics.json')
STEPS = 8
# Compared to a tolerance on any machine: before the loop amplifies the last
# bits into different samples.
EARLY_STEPS = 2
# Wall-clock measurements, which no two runs share.
TIMINGS = ('perf/',)


def _pinned(records: list[dict]) -> list[dict]:
  return [{k: v for k, v in r.items() if not k.startswith(TIMINGS)}
          for r in records]


def machine() -> dict[str, object]:
  """What decides XLA's CPU float results, besides the program."""
  return {'cpu': environment.cpu()[0], 'cores': environment.usable_cores(),
          'jax': jax.__version__, 'jaxlib': jaxlib.__version__}


class PinnedMetricsTest(absltest.TestCase):

  @classmethod
  def setUpClass(cls):
    super().setUpClass()
    workdir = tempfile.mkdtemp(dir=absltest.get_default_test_tmpdir())
    c = demo.get_config('runlocal')
    c.total_steps = STEPS
    c.plots = False  # drawing does not change what is written
    c.tensorboard = False
    train.run(c, workdir, log=lambda _: None)
    cls.got = _pinned(metrics_lib.read_metrics(workdir))
    if os.environ.get('JAXGRPO_UPDATE_GOLDEN'):
      os.makedirs(os.path.dirname(GOLDEN), exist_ok=True)
      with open(GOLDEN, 'w') as f:
        json.dump({'machine': machine(), 'records': cls.got}, f, indent=1,
                  sort_keys=True)
        f.write('\n')
    with open(GOLDEN) as f:
      cls.golden = json.load(f)

  def test_steps_and_names(self):
    want = self.golden['records']
    self.assertEqual([r['step'] for r in self.got], [r['step'] for r in want])
    self.assertEqual(want[-1]['step'], STEPS)
    for g, w in zip(self.got, want):
      self.assertEqual(sorted(g), sorted(w), f'metric names at step {w["step"]}')

  def test_early_steps_within_tolerance(self):
    for g, w in zip(self.got, self.golden['records']):
      if w['step'] > EARLY_STEPS:
        break
      step = w['step']
      for key, value in w.items():
        # Every float within tolerance, whole ones too: a ratio pinned at
        # 1.0 may round to 0.9999998 elsewhere, while a count that moves by
        # one (< 10,000) is still off by more than 1e-4.
        if isinstance(value, float):
          self.assertTrue(
              math.isclose(g[key], value, rel_tol=1e-4, abs_tol=1e-7),
              f'step {step} {key}: {g[key]!r}, pinned {value!r}')
        else:
          self.assertEqual(g[key], value, f'step {step} {key}')

  def test_every_value_exact_on_the_pinning_machine(self):
    here, there = machine(), self.golden['machine']
    if here != there:
      self.skipTest(f'pinned on {there}, running on {here}: XLA may round '
                    'differently here, so only the early steps are compared')
    for g, w in zip(self.got, self.golden['records']):
      self.assertEqual(g, w, f'step {w["step"]}')


if __name__ == '__main__':
  absltest.main()
